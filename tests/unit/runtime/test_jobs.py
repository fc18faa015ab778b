from __future__ import annotations

from torchbuild.runtime.jobs import GiB, HostResources, cgroup_limit, mem_available, plan_jobs


def test_memory_bounds_jobs_below_cores():
    plan = plan_jobs("auto", 1.5, HostResources(cores=64, memory_bytes=30 * GiB, memory_source="test"))
    assert plan.jobs == 20
    assert "64 cores" in plan.reason and "30.0 GiB" in plan.reason


def test_cores_bound_jobs_when_memory_is_plentiful():
    assert plan_jobs("auto", 1.5, HostResources(cores=8, memory_bytes=500 * GiB, memory_source="t")).jobs == 8


def test_at_least_one_job_and_fixed_override():
    tiny = HostResources(cores=8, memory_bytes=GiB // 2, memory_source="t")
    assert plan_jobs("auto", 1.5, tiny).jobs == 1
    assert plan_jobs(5, 1.5, tiny).jobs == 5


def test_cgroup_v2_and_v1_limits(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("4294967296\n")
    assert cgroup_limit(v2) == 4 * GiB
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_limit(v2) is None
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("2147483648\n")
    assert cgroup_limit(tmp_path / "v1") == 2 * GiB
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_limit(tmp_path / "v1") is None


def test_mem_available_reads_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       32000000 kB\nMemAvailable:   16000000 kB\n")
    assert mem_available(f) == 16000000 * 1024
