"""The invoke Collection; tasks.py at the repository root only imports `ns` from here.

Importing it also hands the runtime and the profile what they need from the features
(core/handover.py): the steps table, the toolchain image's check, the apptainer-builder image,
and the comms and companion keys' checks. Every entry point
imports this package before a task runs: invoke's tasks.py, the torchbuild console script and
`python -m torchbuild` (cli.program), so also `torchbuild inside.step` in the image and the SIF
(the docker and apptainer backends' command) and the native backend's in-process run_step."""

from __future__ import annotations

from invoke.collection import Collection

from torchbuild.batch.task import submit
from torchbuild.bench.task import bench
from torchbuild.builder import companions as builder_companions
from torchbuild.builder.manifest_task import manifest
from torchbuild.builder.task import build, companions_, patches, source
from torchbuild.comms import checks as comms_checks
from torchbuild.comms.task import comms
from torchbuild.configview.task import config
from torchbuild.devloop.task import develop
from torchbuild.doctor.task import doctor
from torchbuild.hostcheck.task import host_check
from torchbuild.image.host import require_image
from torchbuild.image.task import base_image, image
from torchbuild.install.task import install, mpi_check
from torchbuild.install.wheelhouse_task import wheelhouse
from torchbuild.profile import config as config_model
from torchbuild.runtime import apptainer, engine
from torchbuild.runtime import steps as runtime_steps  # (tasks.steps, once imported, is `steps` here)
from torchbuild.runtime.tasks import COLLECTION
from torchbuild.sif.host import ensure_builder
from torchbuild.sif.task import sif
from torchbuild.tasks.inside import inside
from torchbuild.tasks.steps import STEPS, TASKS
from torchbuild.verify.task import verify

runtime_steps.register(STEPS, TASKS)
engine.IMAGE_CHECK.fill(require_image)
apptainer.BUILDER_IMAGE.fill(ensure_builder)
config_model.COMMS_CHECK.fill(comms_checks.check)
config_model.COMPANIONS_CHECK.fill(builder_companions.check)

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
