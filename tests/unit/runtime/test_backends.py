"""The Backend interface's logic without an engine: how a step's exit becomes the host's named
error, which options each backend refuses, and the paths a containerised step sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchbuild.core.errors import BuildFailed, OutOfMemory, PathError, TorchbuildError, UsageError, VerifyFailed
from torchbuild.profile.config import resolve
from torchbuild.runtime.backends import Binds, Options, choose, container_view, failure


@pytest.mark.parametrize(
    ("rc", "step", "expected"),
    [
        (13, "build", OutOfMemory),  # OutOfMemory raised inside at its last retry
        (137, "build", OutOfMemory),  # the container's memory cap: SIGKILL
        (-9, "verify", OutOfMemory),
        (15, "build", PathError),  # a named error inside stays that error on the host
        (14, "verify", VerifyFailed),
        (1, "build", BuildFailed),  # a crash of the build: BuildFailed with the logs' place
        (1, "verify", TorchbuildError),
    ],
)
def test_a_steps_exit_becomes_the_hosts_named_error(rc, step, expected, tmp_path):
    err = failure(rc, step, "torchbuild/toolchain:cpu", tmp_path / "logs")
    assert type(err) is expected
    assert "torchbuild/toolchain:cpu" in err.message


@pytest.mark.parametrize(
    ("engine", "options", "named"),
    [
        ("native", Options(memory="8g"), "--memory"),
        ("native", Options(user="1:1"), "--user"),
        ("native", Options(rebuild_image=True), "--rebuild-image"),
        ("docker", Options(nv=True), "--nv"),
        ("docker", Options(sif=Path("x.sif")), "--sif"),
        ("apptainer", Options(user="1:1"), "--user"),
        ("podman", Options(), "podman"),
    ],
)
def test_a_backend_refuses_what_it_cannot_honour(engine, options, named):
    with pytest.raises(UsageError, match=named):
        choose(resolve("cpu"), engine, options)


def test_a_containerised_step_sees_its_binds_at_fixed_paths():
    binds = Binds(cache=Path("/h/cache"), out=Path("/h/out"), src=Path("/h/tree"))
    view = container_view(binds)
    assert binds.mounts(view) == {Path("/h/cache"): "/cache", Path("/h/out"): "/out", Path("/h/tree"): "/src"}
    no_tree = Binds(cache=Path("/h/cache"), out=Path("/h/w"))
    assert no_tree.mounts(container_view(no_tree)) == {Path("/h/cache"): "/cache", Path("/h/w"): "/out"}
