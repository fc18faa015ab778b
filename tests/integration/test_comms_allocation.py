"""`torchbuild comms` where an allocation's limits are a real cgroup's: the cuda-offline image run
by the test with a CPU quota (docker --cpus) and a memory limit, as a Slurm job's cgroup would
confine it, and torchbuild's own CLI run in it (natively: the step plans where it runs).

1. The plugin's make is planned from the cgroup CPU quota, not from the host's cores.
2. A plugin compile the kernel's OOM killer really kills (tests/fixtures/greedy_cc1.py, a gcc
   -wrapper that allocates past the limit when two units compile at once) is resumed with fewer
   jobs and the plugin is finished, with its ncclNetPlugin symbols.

The docker backend (`invoke comms --in-container`) takes --memory but has no CPU quota option,
so the test starts the container itself; tests/integration/test_comms.py has the backend path."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from helpers import CALLER, FIXTURES, OFI_PLUGIN, TEST_TORCH

from torchbuild.runtime.environment import build_env

pytestmark = pytest.mark.docker

PLAN = "comms: building aws-ofi-nccl with"


def _comms_in_allocation(engine, cuda_image, ofi_sources, tmp_path: Path, *, cpus: int, memory: str, sets, stop=""):
    """`torchbuild comms` for the plugin in a container of the cuda-offline image with a CPU
    quota of cpus and memory (swap included) as its cgroup's limits; stopped once its output
    has stop. (exit code, output, the container's State)."""
    spec, _ = cuda_image
    tarball, sha = ofi_sources[OFI_PLUGIN]
    cache = tmp_path / "cache"
    cache.mkdir()
    argv = ["torchbuild", "comms", "--profile", "cuda-offline", "--out", "/cache/out"]
    for item in (
        f"aws_ofi_nccl_version={OFI_PLUGIN}", f"aws_ofi_nccl_source=/s/{tarball.name}", f"aws_ofi_nccl_sha256={sha}",
        "cache_dir=/cache", *sets,
    ):  # fmt: skip
        argv += ["--set", item]
    container = engine.client.containers.run(
        spec.image_tag, argv, detach=True, user=CALLER, environment={"HOME": "/cache/home"},
        nano_cpus=cpus * 10**9, mem_limit=memory, memswap_limit=memory,
        volumes={
            str(tarball.parent): {"bind": "/s", "mode": "ro"},
            str(cache): {"bind": "/cache", "mode": "rw"},
            str(tmp_path / "tools"): {"bind": "/t", "mode": "ro"},
        },
    )  # fmt: skip
    try:
        text = ""
        for chunk in container.logs(stream=True, follow=True):
            text += chunk.decode(errors="replace")
            if stop and stop in text:
                container.kill()
                break
        rc = int(container.wait()["StatusCode"])
        container.reload()
        return rc, text, container.attrs["State"]
    finally:
        container.remove(force=True)


def _tools(tmp_path: Path, cc: str, cxx: str) -> None:
    """tmp_path/tools, the container's /t: the greedy gcc -wrapper and CC and CXX that use it."""
    tools = tmp_path / "tools"
    tools.mkdir()
    shutil.copy(FIXTURES / "greedy_cc1.py", tools)
    for name, real in (("cc", cc), ("c++", cxx)):
        (tools / name).write_text(f'#!/bin/sh\nexec {real} -wrapper /t/greedy_cc1.py "$@"\n')
    for f in tools.iterdir():
        f.chmod(0o755)


def test_the_plugins_make_is_planned_from_the_cgroup_cpu_quota(engine, cuda_image, ofi_sources, tmp_path):
    host_cores = len(os.sched_getaffinity(0))
    if host_cores < 2:
        pytest.skip("a CPU quota of one core is this host's own core count: nothing to tell apart")
    (tmp_path / "tools").mkdir()
    # memory for 8 jobs of 0.25 GiB: the quota is what limits the plan
    _, out, _ = _comms_in_allocation(
        engine, cuda_image, ofi_sources, tmp_path, cpus=1, memory="2g", sets=["mem_per_job_gb=0.25"], stop="$ make -j"
    )
    plan = next((ln for ln in out.splitlines() if ln.startswith(PLAN)), None)
    assert plan is not None, out[-4000:]
    assert plan.startswith(f"{PLAN} 1 jobs (auto: 1 cores (cgroup CPU quota), 2.0 GiB (cgroup memory limit)"), plan
    assert plan.endswith("-> 1 jobs, limited by cores)"), plan
    assert "\n$ make -j1" in out, out[-2000:]  # the make it runs is the one planned
    print(f"host: {host_cores} cores; in the container: {plan}")


def test_an_oom_killed_plugin_compile_resumes_with_fewer_jobs_and_finishes(engine, cuda_image, ofi_sources, tmp_path):
    spec, _ = cuda_image
    env = build_env(spec, cache_root="/cache", jobs=1)
    _tools(tmp_path, env["CC"], env["CXX"])
    # 1 GiB / 0.5 GiB per job: two jobs, each fitting alone; a second one that grows kills itself
    sets = [TEST_TORCH, "mem_per_job_gb=0.5", "env.CC=/t/cc", "env.CXX=/t/c++"]
    t0 = time.monotonic()
    rc, out, state = _comms_in_allocation(engine, cuda_image, ofi_sources, tmp_path, cpus=2, memory="1g", sets=sets)
    seconds = time.monotonic() - t0
    assert rc == 0, out[-5000:]
    assert state["OOMKilled"], state  # the kernel's OOM killer ran in the container's cgroup
    assert "greedy_cc1: another compile is running" in out and "Killed signal terminated program" in out
    assert "torchbuild: out of memory in building aws-ofi-nccl with 2 jobs" in out, out[-5000:]
    assert "resuming the same build tree with 1 jobs (retry 1)" in out
    assert "\n$ make -j2" in out and "\n$ make -j1" in out
    (prefix,) = (tmp_path / "cache" / "comms").glob(f"ofi-{OFI_PLUGIN}-*")
    plugin = json.loads((prefix / "torchbuild-comms.json").read_text())["plugin"]
    jobs = plugin["jobs"]
    assert jobs["max_jobs"] == 2 and jobs["final_jobs"] == 1, jobs
    assert "1.0 GiB (cgroup memory limit) / 0.50 GiB per job" in jobs["reason"], jobs
    (retry,) = jobs["retries"]
    assert retry["jobs"] == 2 and retry["next_jobs"] == 1, retry
    assert "Killed signal terminated program" in retry["evidence"], retry
    # finished: the library is there, with the symbols NCCL looks for
    assert (prefix / plugin["library"]).is_file() and plugin["library"] == "lib/libnccl-net-ofi.so"
    assert {"ncclNetPlugin_v6", "ncclNetPlugin_v9", "ncclNetPlugin_v10"} <= set(plugin["symbols"]), plugin
    assert not list((tmp_path / "cache" / "comms").glob("*.partial-*"))
    print(f"OOM kill and resume: {seconds:.0f} s; {retry['evidence']}")
