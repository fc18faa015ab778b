"""The typed requests of the verify, install, mpi and bench steps: what the launching side
writes comes back equal from the file the step reads, and a request file with a key missing,
a key it should not have or a value of the wrong type is one UsageError naming the file and
the key, before the step does anything."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from helpers import TORCH_TAG, make_wheel

from torchbuild.bench.step import Request as BenchRequest
from torchbuild.core import records
from torchbuild.core.errors import UsageError
from torchbuild.install.host import install, mpi_check
from torchbuild.install.step import InstallRequest, ModuleName, MpiRequest, WheelPin
from torchbuild.profile.config import resolve
from torchbuild.runtime.backends import Binds, Options
from torchbuild.runtime.backends.base import Backend
from torchbuild.runtime.steps import parse_request, run_step_file
from torchbuild.tasks.steps import STEPS
from torchbuild.verify.host import verify_with
from torchbuild.verify.step import Request as VerifyRequest
from torchbuild.verify.step import request as verify_request

SPEC = resolve("cpu")


class Stop(Exception):
    """Raised by the recording backend instead of running the step."""


class Recording(Backend):
    """A backend that records the request the launching side hands it, and runs nothing."""

    name: ClassVar[str] = "recording"

    def check(self) -> None:
        return None

    def view(self, binds: Binds) -> Binds:
        return binds

    @property
    def where(self) -> str:
        return "nowhere"

    def launch(self, step: str, request: Any, binds: Binds, request_file: str) -> int:
        raise AssertionError("not launched")

    def run(self, step: str, request: Any, binds: Binds) -> None:
        self.step, self.request = step, json.loads(json.dumps(request))  # as a request file holds it
        raise Stop


def recorded(launch: Any) -> tuple[str, dict[str, Any]]:
    backend = Recording(SPEC, Options())
    with pytest.raises(Stop):
        launch(backend)
    return backend.step, backend.request


def launched_verify(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    wheel = make_wheel(tmp_path / "out", "torch", "2.6.0+cpu", TORCH_TAG)
    return recorded(lambda b: verify_with(SPEC, b, wheel=wheel, cache=tmp_path / "cache", python="python3"))


def launched_install(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    wheel = make_wheel(tmp_path / "out", "torch", "2.6.0+cpu", TORCH_TAG)
    spec = resolve("cpu", [f"cache_dir={tmp_path / 'cache'}"])
    return recorded(lambda b: install(spec, b, prefix=tmp_path / "env", wheels=[wheel], out_dir=tmp_path / "out"))


def launched_mpi(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    spec = resolve("cpu", [f"cache_dir={tmp_path / 'cache'}"])
    return recorded(lambda b: mpi_check(spec, b, out_dir=tmp_path / "out"))


def launched_bench(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    # what bench/task.py hands the backend
    req = BenchRequest(venv=str(tmp_path / "env"), benchmark=str(tmp_path / "tb"), install_args=("resnet50",))
    return "bench", json.loads(json.dumps(records.to_dict(req)))


LAUNCHED = {"verify": launched_verify, "install": launched_install, "mpi": launched_mpi, "bench": launched_bench}
TYPES = {"verify": VerifyRequest, "install": InstallRequest, "mpi": MpiRequest, "bench": BenchRequest}


def test_every_step_of_the_registry_parses_into_its_own_typed_request():
    from torchbuild.builder import companions
    from torchbuild.builder import step as build
    from torchbuild.comms import step as comms
    from torchbuild.devloop import step as develop

    compile_steps = {"build": build.BuildRequest, "comms": comms.Request, "companions": companions.Request}
    every = {**TYPES, **compile_steps, "develop": develop.Request}
    assert set(STEPS) == set(every)
    assert {name: STEPS[name]().request for name in STEPS} == every


@pytest.mark.parametrize("step", sorted(LAUNCHED))
def test_the_launching_sides_request_comes_back_equal(tmp_path, step):
    name, payload = LAUNCHED[step](tmp_path)
    assert name == step
    req = parse_request(step, payload)
    assert isinstance(req, TYPES[step])
    assert records.to_dict(req) == payload
    assert records.from_dict(TYPES[step], records.to_dict(req), "again") == req


def test_the_install_request_says_what_the_step_needs(tmp_path):
    _, payload = launched_install(tmp_path)
    req = parse_request("install", payload)
    assert req.wheels == (WheelPin(f"torch-2.6.0+cpu-{TORCH_TAG}.whl", "torch", "2.6.0+cpu"),)
    assert req.module == ModuleName("torch", "2.6.0-cpu") and req.prefix == str(tmp_path / "env")
    assert req.spec == resolve("cpu", [f"cache_dir={tmp_path / 'cache'}"])


def test_the_verify_request_of_a_wheel_names_its_report():
    req = verify_request(SPEC, wheel=Path("/out/x.whl"), installed="", expect_version="", report=None)
    assert req.report == "/out/x.whl.verify.json" and req.expect_version == SPEC.build_version


# a required key of each request, a key of the wrong type (and the wrong value), and its JSON
DEFECTS = [
    ("verify", "spec", "expect_version", 2),
    ("verify", "spec", "wheel", ["x.whl"]),
    ("install", "prefix", "no_index", "no"),
    ("install", "wheels", "wheels", "torch.whl"),
    ("install", "module", "find_links", "/links"),
    ("mpi", "spec", "host_mpi", "/opt/mpich/lib"),
    ("mpi", "spec", "python", None),
    ("bench", "venv", "install", 1),
    ("bench", "benchmark", "args", "resnet50 -d cpu"),
]


def request_file(tmp_path: Path, step: str, change: Any) -> Path:
    _, payload = LAUNCHED[step](tmp_path)
    change(payload)
    path = tmp_path / f"{step}-request.json"
    path.write_text(json.dumps(payload))
    return path


def refused(path: Path, step: str) -> str:
    with pytest.raises(UsageError) as info:
        run_step_file(step, str(path))
    message = info.value.message
    assert message.startswith(f"{path}: the {step} request") and "\n" not in message
    return message


@pytest.mark.parametrize(("step", "required", "key", "bad"), DEFECTS)
def test_a_request_without_a_key_names_the_key(tmp_path, step, required, key, bad):
    path = request_file(tmp_path, step, lambda p: p.pop(required))
    assert f"{required}: missing" in refused(path, step)


@pytest.mark.parametrize(("step", "required", "key", "bad"), DEFECTS)
def test_a_request_with_an_unknown_key_names_the_key(tmp_path, step, required, key, bad):
    path = request_file(tmp_path, step, lambda p: p.update({f"{key}_extra": 1}))
    assert f"unknown keys {key}_extra" in refused(path, step)


@pytest.mark.parametrize(("step", "required", "key", "bad"), DEFECTS)
def test_a_request_with_a_value_of_the_wrong_type_names_the_key(tmp_path, step, required, key, bad):
    path = request_file(tmp_path, step, lambda p: p.update({key: bad}))
    assert f"{key}: expected " in refused(path, step)


def test_a_request_with_a_spec_that_is_not_one_names_the_spec(tmp_path):
    path = request_file(tmp_path, "mpi", lambda p: p["spec"].pop("blas"))
    assert "spec:" in refused(path, "mpi") and "blas" in refused(path, "mpi")


def test_a_request_file_larger_than_any_request_is_refused_unread(tmp_path):
    from torchbuild.core.errors import TorchbuildError

    path = tmp_path / "big.json"
    with path.open("wb") as f:
        f.truncate(65 * 2**20)  # sparse
    with pytest.raises(TorchbuildError, match="more than the") as info:
        run_step_file("bench", str(path))
    assert str(path) in info.value.message
