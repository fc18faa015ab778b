"""The invoke Collection; tasks.py at the repository root only imports `ns` from here."""

from __future__ import annotations

from invoke.collection import Collection

from torchbuild.tasks.bench import bench
from torchbuild.tasks.build import build, companions_, patches, source
from torchbuild.tasks.common import COLLECTION
from torchbuild.tasks.comms import comms
from torchbuild.tasks.config import config
from torchbuild.tasks.develop import develop
from torchbuild.tasks.doctor import doctor
from torchbuild.tasks.hostcheck import host_check
from torchbuild.tasks.image import base_image, image
from torchbuild.tasks.inside import inside
from torchbuild.tasks.install import install, mpi_check
from torchbuild.tasks.manifest import manifest
from torchbuild.tasks.sif import sif
from torchbuild.tasks.submit import submit
from torchbuild.tasks.verify import verify
from torchbuild.tasks.wheelhouse import wheelhouse

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
COLLECTION["ns"] = ns  # what a task's --help prints from
