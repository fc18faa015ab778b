"""The jobs planner (cores, memory from MemAvailable / cgroup / Slurm, per-kind peaks), OOM
detection, the retry loop (progress output: test_progress.py; the .ninja_log report: test_report.py)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from torchbuild.core.errors import BuildFailed, InsufficientSpace, OutOfMemory
from torchbuild.core.progress import Tee
from torchbuild.runtime import oom
from torchbuild.runtime.jobs import GiB, HostResources, Peaks, load_measured, plan_jobs, record_measured
from torchbuild.runtime.oom import JobsUsed, fewer_jobs, oom_evidence, run_compile


def host(cores: int, mem_gib: float) -> HostResources:
    return HostResources(cores=cores, memory_bytes=int(mem_gib * GiB), memory_source="test")


def test_cpu_plan_from_cores_memory_and_cxx_peak():
    plan = plan_jobs("auto", 1.5, host(64, 30))
    assert plan.jobs == 20 and "limited by memory" in plan.reason and plan.nvcc_threads == 0
    assert "64 cores" in plan.reason and "30.0 GiB (test)" in plan.reason and "1.50 GiB per job" in plan.reason
    cores_bound = plan_jobs("auto", 1.5, host(8, 500))
    assert cores_bound.jobs == 8 and "limited by cores" in cores_bound.reason
    assert plan_jobs("auto", 1.5, host(8, 0.5)).jobs == 1  # never zero
    assert plan_jobs(5, 1.5, host(8, 0.5)).jobs == 5  # a fixed max_jobs wins


def test_cuda_plan_uses_the_cuda_peak_and_gives_idle_cores_to_nvcc():
    peaks = Peaks.defaults(1.5, 5.0)
    # 40 GiB / 5 GiB per CUDA job = 8 jobs on 32 cores: 4 idle cores per job, 2 archs -> 2 threads
    plan = plan_jobs("auto", 1.5, host(32, 40), cuda=True, peaks=peaks, cuda_archs=2)
    assert (plan.jobs, plan.nvcc_threads) == (8, 2)
    assert "per CUDA job" in plan.reason and "nvcc --threads 2" in plan.reason
    # the same for 5 archs: threads capped at 4
    assert plan_jobs("auto", 1.5, host(32, 40), cuda=True, peaks=peaks, cuda_archs=5).nvcc_threads == 4
    # plenty of memory: all cores are jobs, nvcc gets one thread
    roomy = plan_jobs("auto", 1.5, host(72, 480), cuda=True, peaks=peaks, cuda_archs=1)
    assert (roomy.jobs, roomy.nvcc_threads) == (72, 1)
    # the profile's nvcc_threads wins
    assert plan_jobs("auto", 1.5, host(32, 40), cuda=True, peaks=peaks, nvcc_threads=3).nvcc_threads == 3


def test_measured_canary_peaks_replace_the_defaults(tmp_path):
    path = tmp_path / "peaks" / "abc.json"
    assert load_measured(path) == {}
    record_measured(path, [{"file": "a.cpp", "peak_rss_bytes": 2 * GiB}, {"file": "k.cu", "peak_rss_bytes": 8 * GiB}])
    record_measured(path, [{"file": "b.cpp", "peak_rss_bytes": GiB}])  # a smaller peak does not lower it
    assert load_measured(path) == {"cxx": 2 * GiB, "cuda": 8 * GiB}
    peaks = Peaks.defaults(1.5, 5.0).with_measured(load_measured(path))
    assert peaks.cxx == int(2 * GiB * 1.25) and peaks.cuda == 10 * GiB and "measured" in peaks.source
    plan = plan_jobs("auto", 1.5, host(64, 30), peaks=peaks)
    assert plan.jobs == 12 and "measured on canaries" in plan.reason  # 30 / 2.5


def test_slurm_allocation_bounds_cores_and_memory(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable:   100000000 kB\n")
    env = {"SLURM_CPUS_ON_NODE": "1", "SLURM_MEM_PER_NODE": "4096"}
    res = HostResources.detect(env, cgroup_root=tmp_path / "none", meminfo=meminfo)
    assert res.cores == 1 and res.cores_source == "SLURM_CPUS_ON_NODE"
    assert res.memory_bytes == 4 * GiB and res.memory_source == "SLURM_MEM_PER_NODE"
    per_cpu = HostResources.detect(
        {"SLURM_CPUS_ON_NODE": "1", "SLURM_MEM_PER_CPU": "2048"}, cgroup_root=tmp_path / "none", meminfo=meminfo
    )
    assert per_cpu.memory_bytes == 2 * GiB and "SLURM_MEM_PER_CPU" in per_cpu.memory_source


def test_the_smallest_memory_source_wins(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable:   8388608 kB\n")  # 8 GiB
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.max").write_text(str(3 * GiB))
    res = HostResources.detect({}, cgroup_root=cg, meminfo=meminfo)
    assert (res.memory_bytes, res.memory_source) == (3 * GiB, "cgroup memory limit")
    (cg / "memory.max").write_text("max\n")
    res = HostResources.detect({"SLURM_MEM_PER_NODE": "16384"}, cgroup_root=cg, meminfo=meminfo)
    assert (res.memory_bytes, res.memory_source) == (8 * GiB, "MemAvailable")


def test_a_cgroup_cpu_quota_caps_the_cores(tmp_path, monkeypatch):
    """`docker run --cpus 1.5` (cgroup v2 cpu.max "150000 100000") or a v1 cfs quota: the cores
    the quota allows, rounded up, not the affinity mask's (which still lists every core)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable:   8388608 kB\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    res = HostResources.detect({}, cgroup_root=v2, meminfo=meminfo, self_cgroup=tmp_path / "none")
    assert (res.cores, res.cores_source) == (2, "cgroup CPU quota")
    (v2 / "cpu.max").write_text("max 100000\n")  # no quota
    assert HostResources.detect({}, cgroup_root=v2, meminfo=meminfo, self_cgroup=tmp_path / "none").cores == 64
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    res = HostResources.detect(
        {"SLURM_CPUS_ON_NODE": "2"}, cgroup_root=v1, meminfo=meminfo, self_cgroup=tmp_path / "none"
    )
    assert (res.cores, res.cores_source) == (2, "SLURM_CPUS_ON_NODE")  # the smaller of the two
    res = HostResources.detect({}, cgroup_root=v1, meminfo=meminfo, self_cgroup=tmp_path / "none")
    assert (res.cores, res.cores_source) == (3, "cgroup CPU quota")


@pytest.mark.parametrize(
    "line",
    [
        "c++: fatal error: Killed signal terminated program cc1plus",
        "nvcc error   : 'cicc' died due to signal 9 (Kill signal)",
        "nvcc error   : 'ptxas' died due to signal 9 (Kill signal)",
        "g++: internal compiler error: Killed (program cc1plus)",
        "collect2: fatal error: ld terminated with signal 9 [Killed]",
        "cc1plus: out of memory allocating 65536 bytes after a total of 1234 bytes",
        "virtual memory exhausted: Cannot allocate memory",
        "clang++: error: unable to execute command: Killed",
    ],
)
def test_oom_messages_are_recognised(line):
    assert oom_evidence(line)


@pytest.mark.parametrize(
    "line",
    [
        "error: 'foo' was not declared in this scope",
        "[12/345] Building CXX object killed_test.cpp.o",
        "ninja: build stopped",
    ],
)
def test_other_failures_are_not_oom(line):
    assert oom_evidence(line) is None


def _fake_compiler(tmp_path: Path) -> Path:
    """Fails like an OOM-killed g++ while MAX_JOBS > 1, succeeds with 1; logs each call."""
    script = tmp_path / "fake"
    script.write_text(
        f"""#!{sys.executable}
import os, sys
open({str(tmp_path / "calls")!r}, 'a').write(os.environ['MAX_JOBS'] + '\\n')
if int(os.environ['MAX_JOBS']) > 1:
    print('c++: fatal error: Killed signal terminated program cc1plus', flush=True)
    sys.exit(1)
print('[3/3] Linking', flush=True)
"""
    )
    script.chmod(0o755)
    return script


def test_oom_retries_halve_the_jobs_down_to_one(tmp_path):
    fake = _fake_compiler(tmp_path)
    tee = Tee(tmp_path / "log", io.StringIO(), "raw")
    jobs = JobsUsed(8, 8)
    run_compile(
        lambda n: [str(fake)], cwd=str(tmp_path), env_for=lambda n: {"MAX_JOBS": str(n)}, sink=tee, what="x", jobs=jobs
    )
    tee.close()
    assert (tmp_path / "calls").read_text().split() == ["8", "4", "2", "1"]
    assert jobs.current == 1 and [r["jobs"] for r in jobs.retries] == [8, 4, 2]
    assert all("Killed signal terminated program cc1plus" in r["evidence"] for r in jobs.retries)
    assert (tmp_path / "log").read_text().count("torchbuild: out of memory in x") == 3


def test_oom_with_one_job_is_named_and_other_failures_are_not_retried(tmp_path):
    script = tmp_path / "always"
    script.write_text(f"#!{sys.executable}\nprint('cc1plus: out of memory allocating 8 bytes'); raise SystemExit(1)\n")
    script.chmod(0o755)
    tee = Tee(tmp_path / "log", io.StringIO(), "raw")
    with pytest.raises(OutOfMemory, match="out of memory with 1 jobs"):
        run_compile(
            lambda n: [str(script)], cwd=str(tmp_path), env_for=lambda n: {}, sink=tee, what="x", jobs=JobsUsed(2, 2)
        )
    broken = tmp_path / "broken"
    broken.write_text(f"#!{sys.executable}\nprint('error: expected ;'); raise SystemExit(1)\n")
    broken.chmod(0o755)
    jobs = JobsUsed(4, 4)
    with pytest.raises(BuildFailed):
        run_compile(lambda n: [str(broken)], cwd=str(tmp_path), env_for=lambda n: {}, sink=tee, what="x", jobs=jobs)
    assert jobs.retries == [] and jobs.current == 4
    tee.close()
    assert fewer_jobs(3) == 1 and fewer_jobs(1) == 1


def _fills_the_disk(tmp_path: Path, message: str) -> Path:
    script = tmp_path / "fills"
    script.write_text(f"#!{sys.executable}\nprint({message!r}); raise SystemExit(1)\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize(
    ("message", "full"),
    [
        ("OSError: [Errno 28] No space left on device: '{out}/.partial-1a2b/torch-2.6.0-cp313.whl'", "out"),
        ("cc1plus: fatal error: error writing to {tmp}/ccXyZ.s: No space left on device", "tmp"),
        ("/usr/bin/ld: final link failed: No space left on device", "tmp"),  # no path but the linker's
        ("ccache: error: Failed to write: Disk quota exceeded", "tmp"),
    ],
)
def test_a_full_disk_in_a_compile_step_is_insufficient_space_naming_that_file_system(
    tmp_path, monkeypatch, message, full
):
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    script = _fills_the_disk(tmp_path, message.format(out=out, tmp=tmp))
    tee = Tee(tmp_path / "log", io.StringIO(), "raw")
    jobs = JobsUsed(4, 4)
    full_dir = {"out": out, "tmp": tmp}[full]
    # the build tree is cwd; with no path in the message, the fullest candidate is named
    monkey_free = {str(tmp_path): 10 * 2**30, str(tmp): 0, str(out): 5 * 2**30}
    original = oom._free
    monkeypatch.setattr(oom, "_free", lambda d: monkey_free.get(str(d), original(d)))
    with pytest.raises(InsufficientSpace) as info:
        run_compile(
            lambda n: [str(script)],
            cwd=str(tmp_path),
            env_for=lambda n: {"TMPDIR": str(tmp)},
            sink=tee,
            what="pip wheel",
            jobs=jobs,
        )
    tee.close()
    assert info.value.status == 12
    assert f"pip wheel ran out of disk space on the file system of {full_dir} " in info.value.message
    assert "preflight" not in info.value.hint and str(full_dir) in info.value.hint
    assert jobs.retries == [] and jobs.current == 4  # fewer jobs need the same space: no retry
