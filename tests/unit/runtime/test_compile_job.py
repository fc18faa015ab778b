"""One compile job for torch, the companions, editable trees and NCCL (runtime/compile_job.py):
every step plans from the allocation it runs in, and says the planned jobs the same way
(MAX_JOBS and CMAKE_BUILD_PARALLEL_LEVEL, from inputs/environment.compile_env), again with fewer
after an out-of-memory kill; a malformed request is a named error."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from torchbuild.builder import companions
from torchbuild.builder import step as build
from torchbuild.comms import step as comms
from torchbuild.core import records
from torchbuild.core.errors import BuildFailed, CommsFailed, TorchbuildError, UsageError
from torchbuild.devloop import step as develop
from torchbuild.profile.config import BuildSpec, resolve
from torchbuild.runtime import compile_job
from torchbuild.runtime.environment import build_env, compile_env, jobs_env
from torchbuild.runtime.jobs import GiB, HostResources, JobPlan
from torchbuild.runtime.steps import run_step

ALLOCATION_CORES = 4  # a batch allocation's share of a 64-core node


@pytest.fixture
def allocation(monkeypatch: pytest.MonkeyPatch) -> HostResources:
    """The step runs in an allocation of 4 cores (and ample memory) on a 64-core node."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    host = HostResources(cores=ALLOCATION_CORES, memory_bytes=256 * GiB, memory_source="test allocation")
    monkeypatch.setattr(HostResources, "detect", lambda *a, **k: host)
    return host


@pytest.fixture
def compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every compile a step runs is this stand-in (the step's own command line aside): it logs
    the jobs its environment gives, is OOM-killed while MAX_JOBS > 2, then fails otherwise.
    Returns the log of its calls."""
    calls = tmp_path / "calls"
    script = tmp_path / "fake-compiler"
    script.write_text(
        f"""import os, sys
open({str(calls)!r}, 'a').write(os.environ['MAX_JOBS'] + ' ' + os.environ.get('CMAKE_BUILD_PARALLEL_LEVEL', '-') + '\\n')
if int(os.environ['MAX_JOBS']) > 2:
    print('c++: fatal error: Killed signal terminated program cc1plus', flush=True)
    sys.exit(1)
sys.exit(3)
"""
    )
    real = compile_job.run_compile

    def stand_in(cmd_for: Callable[[int], Any], **kw: Any) -> float:
        return real(lambda n: [sys.executable, str(script)], **kw)

    monkeypatch.setattr(compile_job, "run_compile", stand_in)
    return calls


def _spec(tmp_path: Path) -> BuildSpec:
    # build_venv=false: the host's tools (a build venv is pip from PyPI: tests/integration/test_build_venv.py)
    return resolve("cpu", ["max_jobs=auto", f"cache_dir={tmp_path / 'cache'}", "build_venv=false"])


def _tree(tmp_path: Path, name: str) -> Path:
    tree = tmp_path / name
    tree.mkdir()
    (tree / "setup.py").write_text("")  # a tree torchbuild builds (runtime/tree.py)
    return tree


def _build(spec: BuildSpec, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    req = build.BuildRequest(
        spec=spec, source=str(_tree(tmp_path, "pytorch")), out_dir=str(out), cache_root=str(tmp_path / "cache")
    )
    build.run_build(req, out=io.StringIO())


def _companions(spec: BuildSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(companions, "unpack_torch", lambda *a: None)  # no torch needed to reach the compile
    out = tmp_path / "out"
    out.mkdir()
    job = companions.Job(name="torchvision", tree=str(_tree(tmp_path, "vision")), origin="o", digest="d",
                         version="0.21.0", kind="dir")  # fmt: skip
    req = companions.Request(
        spec=spec,
        torch_wheel=str(out / "torch-2.6.0-cp311-cp311-linux_x86_64.whl"),
        jobs=(job,),
        out_dir=str(out),
        cache_root=str(tmp_path / "cache"),
        run_id="r1",
    )
    companions.build_all(req, out=io.StringIO())


def _develop(spec: BuildSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(develop, "make_venv", lambda venv, say: Path(sys.executable))
    req = develop.Request(
        spec=spec,
        tree=str(_tree(tmp_path, "editable")),
        venv=str(tmp_path / "venv"),
        log=str(tmp_path / "develop.log"),
        cache_root=str(tmp_path / "cache"),
    )
    develop.develop(req, out=io.StringIO())


def _comms(spec: BuildSpec, tmp_path: Path) -> None:
    tree = _tree(tmp_path, "plugin")
    prefix = tmp_path / "cache" / "comms" / "x"
    step = comms._Step(
        comms.Request(spec=spec, key="k", prefix=str(prefix), run_id="r1", plugin=comms.Part(str(tree), "o", "s"))
    )
    step._compile(lambda n: ["make", f"-j{n}"], "building aws-ofi-nccl", step.plans["plugin"], tree, step.env)


@pytest.mark.parametrize("step", ["build", "companions", "develop", "comms"])
def test_every_compile_step_plans_for_the_allocation_and_says_so_the_same_way(
    step, allocation, compiler, tmp_path, monkeypatch
):
    """In a 4-core allocation on a 64-core node, each step compiles with 4 jobs (not 64), told
    by MAX_JOBS and CMAKE_BUILD_PARALLEL_LEVEL alike; after an out-of-memory kill both say 2."""
    spec = _spec(tmp_path)
    run = {
        "build": lambda: _build(spec, tmp_path),
        "companions": lambda: _companions(spec, tmp_path, monkeypatch),
        "develop": lambda: _develop(spec, tmp_path, monkeypatch),
        "comms": lambda: _comms(spec, tmp_path),
    }[step]
    with pytest.raises((BuildFailed, CommsFailed)) as exc:
        run()
    assert "exit 3" in exc.value.message
    assert compiler.read_text().splitlines() == ["4 4", "2 2"]


def test_the_environment_of_a_plan_is_one_function_for_every_step():
    spec = resolve("cpu")
    env = compile_env(spec, JobPlan(6, "test"), "/cache", {"NCCL_ROOT": "/x"})
    assert env == {**build_env(spec, cache_root="/cache", jobs=6), **jobs_env(6), "NCCL_ROOT": "/x"}
    assert (env["MAX_JOBS"], env["CMAKE_BUILD_PARALLEL_LEVEL"]) == ("6", "6")
    # the profile's own environment (printed by `invoke config`, baked into a SIF) is untouched
    assert "CMAKE_BUILD_PARALLEL_LEVEL" not in build_env(spec, cache_root="/cache", jobs=6)


def test_a_new_parallel_level_does_not_reconfigure_torchs_tree():
    """CMAKE_BUILD_PARALLEL_LEVEL changes with the plan, like MAX_JOBS: not a configure input."""
    env = compile_env(resolve("cpu"), JobPlan(6, "test"), "/cache")
    assert build.configure_inputs(env) == build.configure_inputs({**env, **jobs_env(2)})


# --------------------------------------------------------------------------- typed requests


def _requests(tmp_path: Path) -> dict[str, Any]:
    """A request of each step, its paths under tmp_path (never written: these are refused)."""
    spec, t = resolve("cpu"), str(tmp_path)
    return {
        "build": build.BuildRequest(spec=spec, source=f"{t}/src", out_dir=f"{t}/out", cache_root=f"{t}/cache"),
        "companions": companions.Request(
            spec=spec, torch_wheel=f"{t}/out/t.whl", jobs=(), out_dir=f"{t}/out", cache_root=f"{t}/cache", run_id="r"
        ),
        "develop": develop.Request(spec=spec, tree=f"{t}/t", venv=f"{t}/v", log=f"{t}/l", cache_root=f"{t}/cache"),
        "comms": comms.Request(spec=spec, key="k", prefix=f"{t}/cache/comms/x", run_id="r"),
    }


@pytest.mark.parametrize("step", ["build", "companions", "develop", "comms"])
def test_a_request_round_trips_through_json(step, tmp_path):
    req = _requests(tmp_path)[step]
    back = records.from_dict(type(req), json.loads(json.dumps(records.to_dict(req))), "x")
    assert back == req and back.spec.hash == req.spec.hash


def _never(*a: Any, **k: Any) -> float:
    raise AssertionError("a malformed request reached the compile")


@pytest.mark.parametrize("step", ["build", "companions", "develop", "comms"])
@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda d: d.pop("spec"), "spec: missing"),
        (lambda d: d.update(surprise=1), "surprise"),
        (lambda d: d.update(spec={"profile": "cpu"}), "keys missing"),
        (lambda d: d.update({"max_jobs" if "max_jobs" in d else "jobs": "many"}), "jobs: expected an int"),
    ],
)
def test_a_malformed_request_is_a_usage_error_naming_the_request(step, spoil, says, tmp_path, monkeypatch):
    monkeypatch.setattr(compile_job, "run_compile", _never)  # a request that parsed would fail the test here
    payload = records.to_dict(_requests(tmp_path)[step])
    spoil(payload)
    with pytest.raises(UsageError) as exc:
        run_step(step, payload)
    assert exc.value.message.startswith(f"the {step} request") and says in exc.value.message
    assert "writes these requests" in (exc.value.hint or "")
    assert isinstance(exc.value, TorchbuildError)


def test_no_ccache_at_all_records_no_counters_instead_of_failing(tmp_path):
    """A site node without ccache (Derecho's, natively): `invoke comms` built NCCL and the plugin,
    then failed with "ccache does not exist" when it recorded ccache's counters."""
    from torchbuild.runtime.compile_job import ccache_stats, hit_rate

    env = {"PATH": str(tmp_path)}  # no ccache on PATH
    assert ccache_stats(env) == {}
    assert hit_rate(ccache_stats(env))[:2] == (0, 0)
