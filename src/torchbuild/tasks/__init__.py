"""The invoke Collection; tasks.py at the repository root only imports `ns` from here."""

from __future__ import annotations

from invoke.collection import Collection

from .bench import bench
from .build import build, companions_, patches, source
from .comms import comms
from .config import config
from .develop import develop
from .doctor import doctor
from .hostcheck import host_check
from .image import base_image, image
from .inside import inside
from .install import install, mpi_check, wheelhouse
from .manifest import manifest
from .sif import sif
from .submit import submit
from .verify import verify

ns = Collection(
    config,
    image,
    base_image,
    sif,
    build,
    companions_,
    comms,
    submit,
    verify,
    install,
    wheelhouse,
    bench,
    host_check,
    mpi_check,
    source,
    develop,
    patches,
    doctor,
    manifest,
    inside,
)
