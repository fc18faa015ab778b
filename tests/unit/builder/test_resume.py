"""Resuming a request (resume.py): the request key, the record of finished steps, and what a
batch job's allocation grants the planner (jobs.py: PBS and Torque cores, the process's own
memory cgroup under a Slurm or PBS job)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torchbuild.builder.resume import STEPS, Record, record_path, request_key
from torchbuild.profile.config import resolve
from torchbuild.runtime.jobs import GiB, HostResources, cgroup_limit, own_cgroups

BASE = {
    "spec_hash": "a" * 64,
    "source": "/src/pytorch",
    "ref": "v2.6.0",
    "preflight": False,
    "targets": (),
    "canaries": (),
    "backend": "docker",
}
CHANGED = [
    ("spec_hash", "b" * 64),
    ("source", "/src/pytorch-other"),
    ("source", "https://github.com/pytorch/pytorch"),
    ("ref", "v2.6.1"),
    ("ref", ""),
    ("preflight", True),
    ("targets", ("c10",)),
    ("canaries", ("aten/src/ATen/native/Foo.cpp",)),
    ("backend", "apptainer"),
    ("backend", "native"),
]


def _key(**changes) -> str:
    args = {**BASE, **changes}
    return request_key(args.pop("spec_hash"), args.pop("source"), args.pop("ref"), **args)


def test_request_key_is_stable_and_24_hex_digits():
    assert _key() == _key()
    assert _key(targets=["x"], canaries=["y"]) == _key(targets=("x",), canaries=("y",))  # a list is a tuple
    assert len(_key()) == 24 and int(_key(), 16) >= 0


@pytest.mark.parametrize(("field", "value"), CHANGED, ids=[f"{f}={v}" for f, v in CHANGED])
def test_request_key_changes_with_each_input(field, value):
    assert _key(**{field: value}) != _key()


def test_request_key_keeps_the_order_of_targets():
    assert _key(targets=("a", "b")) != _key(targets=("b", "a"))
    assert _key(targets=("a",), canaries=()) != _key(targets=(), canaries=("a",))


@pytest.mark.parametrize(
    "job_key",
    ["account=x", "partition=gpu", "walltime=12:00:00", "cpus=64", "mem=64G", "gpus=1", 'modules=["cuda/12.4"]'],
)
def test_a_spec_differing_only_in_a_job_key_is_the_same_request(job_key):
    plain = resolve("cpu", [], arch="x86_64")
    other = resolve("cpu", [job_key], arch="x86_64")
    assert other.to_dict() != plain.to_dict()
    assert other.hash == plain.hash


def test_a_spec_differing_in_a_build_key_is_another_request():
    assert resolve("cpu", ["max_jobs=3"], arch="x86_64").hash != resolve("cpu", [], arch="x86_64").hash


# -------------------------------------------------------------------- Record

KEY = "0123456789abcdef01234567"


def test_done_writes_the_record_at_once_and_load_reads_it_back(tmp_path):
    record = Record.load(tmp_path, KEY)
    assert record.steps == {} and record.get("source") is None
    record.done("source", series="abc", info={"path": "/t"})
    path = record_path(tmp_path, KEY)
    assert path == tmp_path / ".torchbuild" / "done" / f"{KEY}.json"
    on_disk = json.loads(path.read_text())
    assert on_disk["key"] == KEY and on_disk["steps"]["source"]["series"] == "abc"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left beside it
    record.done("wheel", sha256="f" * 64)

    again = Record.load(tmp_path, KEY)
    assert again.get("source")["info"] == {"path": "/t"}
    assert again.get("wheel")["sha256"] == "f" * 64
    assert "at" in again.get("wheel")
    assert again.get("verify") is None


def test_forget_drops_steps_and_the_next_done_writes_without_them(tmp_path):
    record = Record.load(tmp_path, KEY)
    record.done("source", series="abc")
    record.done("wheel", sha256="1")
    record.forget("wheel", "verify")
    record.done("verify", ok=True)
    assert set(Record.load(tmp_path, KEY).steps) == {"source", "verify"}


UNUSABLE = [
    ("corrupt", "{not json"),
    ("empty", ""),
    ("truncated", '{"key": "' + KEY + '", "steps": {"source": {"series": "a'),
    ("another key", json.dumps({"key": "f" * 24, "steps": {"source": {"series": "a"}}})),
    ("no key", json.dumps({"steps": {"source": {"series": "a"}}})),
    ("steps a list", json.dumps({"key": KEY, "steps": [["source", {"series": "a"}]]})),
    ("steps a string", json.dumps({"key": KEY, "steps": "source"})),
    ("a list", json.dumps([KEY])),
    ("binary", b"\xff\xfe\x00garbage"),
]


@pytest.mark.parametrize(("case", "text"), UNUSABLE, ids=[c[0] for c in UNUSABLE])
def test_an_unusable_record_counts_as_nothing_done(tmp_path, case, text):
    path = record_path(tmp_path, KEY)
    path.parent.mkdir(parents=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    record = Record.load(tmp_path, KEY)
    assert record.steps == {}
    assert all(record.get(step) is None for step in STEPS)


def test_a_record_keeps_only_known_steps_with_facts(tmp_path):
    path = record_path(tmp_path, KEY)
    path.parent.mkdir(parents=True)
    steps = {"source": {"series": "a"}, "configure": {"x": 1}, "wheel": "done", "verify": {"ok": True}}
    path.write_text(json.dumps({"key": KEY, "steps": steps}))
    assert Record.load(tmp_path, KEY).steps == {"source": {"series": "a"}, "verify": {"ok": True}}


def test_a_record_in_an_unreadable_place_counts_as_nothing_done(tmp_path):
    (tmp_path / ".torchbuild").write_text("a file where the directory should be")
    assert Record.load(tmp_path, KEY).steps == {}


def test_the_record_of_a_run_that_does_not_resume_writes_nothing(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"Record.off() wrote: {args}")

    # its path is os.devnull: a write would replace /dev/null itself when run as root
    monkeypatch.setattr(Path, "write_text", refuse)
    monkeypatch.setattr(os, "replace", refuse)
    monkeypatch.chdir(tmp_path)
    record = Record.off()
    record.done("source", series="abc")
    record.done("wheel", sha256="1")
    assert list(tmp_path.iterdir()) == []
    assert record.path == Path(os.devnull)


# -------------------------------------------------------------------- what the allocation grants


def _detect(tmp_path: Path, environ: dict[str, str]) -> HostResources:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 65536000 kB\nMemAvailable: 32768000 kB\n")
    empty = tmp_path / "nocgroup"
    empty.mkdir(exist_ok=True)
    return HostResources.detect(environ, cgroup_root=empty, meminfo=meminfo, self_cgroup=empty / "none")


def _affinity() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@pytest.mark.parametrize("variable", ["SLURM_CPUS_ON_NODE", "NCPUS", "PBS_NUM_PPN"])
def test_the_allocations_cores_bound_the_cores(tmp_path, variable):
    if _affinity() < 2:
        pytest.skip("needs at least 2 cores to see a bound of 1")
    host = _detect(tmp_path, {variable: "1"})
    assert (host.cores, host.cores_source) == (1, variable)


@pytest.mark.parametrize("value", ["", "0", "many", "-1", "1.5", str(10_000)])
def test_an_allocation_value_that_grants_no_fewer_cores_is_ignored(tmp_path, value):
    host = _detect(tmp_path, {"NCPUS": value})
    assert (host.cores, host.cores_source) == (_affinity(), "CPU affinity")


def test_the_smallest_of_the_allocations_counts(tmp_path):
    if _affinity() < 2:
        pytest.skip("needs at least 2 cores to see a bound of 1")
    host = _detect(tmp_path, {"NCPUS": "1", "PBS_NUM_PPN": str(_affinity())})
    assert (host.cores, host.cores_source) == (1, "NCPUS")


def test_memory_without_cgroups_or_slurm_is_memavailable(tmp_path):
    host = _detect(tmp_path, {})
    assert (host.memory_bytes, host.memory_source) == (32768000 * 1024, "MemAvailable")


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _self_cgroup(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "self_cgroup"
    path.write_text(text)
    return path


def test_cgroup_v2_limit_of_the_jobs_cgroup_above_the_step(tmp_path):
    root = _tree(
        tmp_path / "cg",
        {"job_42/memory.max": "3221225472\n", "job_42/step_batch/memory.max": "max\n", "cgroup.controllers": ""},
    )
    me = _self_cgroup(tmp_path, "0::/job_42/step_batch\n")
    assert own_cgroups(root, me) == [root / "job_42" / "step_batch", root / "job_42"]
    assert cgroup_limit(root, me) == 3221225472


def test_cgroup_v2_the_smallest_limit_on_the_way_up_counts(tmp_path):
    root = _tree(
        tmp_path / "cg",
        {
            "memory.max": "max\n",
            "system.slice/slurmstepd.scope/job_42/memory.max": str(8 * GiB),
            "system.slice/slurmstepd.scope/job_42/step_batch/memory.max": str(6 * GiB),
            "system.slice/slurmstepd.scope/job_42/step_batch/user/task_0/memory.max": "max",
        },
    )
    me = _self_cgroup(tmp_path, "0::/system.slice/slurmstepd.scope/job_42/step_batch/user/task_0\n")
    assert cgroup_limit(root, me) == 6 * GiB


def test_cgroup_v1_limit_of_a_pbs_job(tmp_path):
    job = "memory/pbs_jobs.service/jobid/1234.server"
    root = _tree(tmp_path / "cg", {f"{job}/memory.limit_in_bytes": "17179869184\n", "cpuset/x": ""})
    me = _self_cgroup(
        tmp_path,
        "12:cpuset:/pbs_jobs.service/jobid/1234.server\n"
        "5:memory:/pbs_jobs.service/jobid/1234.server\n"
        "1:name=systemd:/user.slice\n",
    )
    assert own_cgroups(root, me)[0] == root / job
    assert cgroup_limit(root, me) == 16 * GiB


def test_cgroup_v1_with_merged_controllers(tmp_path):
    root = _tree(tmp_path / "cg", {"memory/slurm/uid_1000/job_42/memory.limit_in_bytes": str(2 * GiB)})
    me = _self_cgroup(tmp_path, "4:memory,hugetlb:/slurm/uid_1000/job_42\n")
    assert cgroup_limit(root, me) == 2 * GiB


def test_cgroup_v1_unlimited_is_no_limit(tmp_path):
    job = "memory/pbs_jobs.service/jobid/1234.server"
    root = _tree(
        tmp_path / "cg",
        {
            f"{job}/memory.limit_in_bytes": "9223372036854771712\n",
            "memory/memory.limit_in_bytes": "9223372036854771712",
        },
    )
    me = _self_cgroup(tmp_path, "5:memory:/pbs_jobs.service/jobid/1234.server\n")
    assert cgroup_limit(root, me) is None
    (root / job / "memory.limit_in_bytes").write_text(str(4 * GiB))
    assert cgroup_limit(root, me) == 4 * GiB


def test_a_cgroup_path_not_under_the_root_falls_back_to_the_roots_limit(tmp_path):
    # in a container (its own cgroup namespace) the host's path does not exist under the mount
    root = _tree(tmp_path / "cg", {"memory.max": str(5 * GiB)})
    me = _self_cgroup(tmp_path, "0::/job_42/step_batch\n")
    assert own_cgroups(root, me) == []
    assert cgroup_limit(root, me) == 5 * GiB


def test_an_unreadable_self_cgroup_file_is_no_limit(tmp_path):
    root = tmp_path / "cg"
    root.mkdir()
    assert cgroup_limit(root, tmp_path / "missing") is None


def test_detect_takes_the_cgroup_limit_below_memavailable(tmp_path):
    root = _tree(tmp_path / "cg", {"job_42/memory.max": str(3 * GiB)})
    me = _self_cgroup(tmp_path, "0::/job_42\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable: 32768000 kB\n")
    host = HostResources.detect({}, cgroup_root=root, meminfo=meminfo, self_cgroup=me)
    assert (host.memory_bytes, host.memory_source) == (3 * GiB, "cgroup memory limit")
    host = HostResources.detect({"SLURM_MEM_PER_NODE": "1024"}, cgroup_root=root, meminfo=meminfo, self_cgroup=me)
    assert (host.memory_bytes, host.memory_source) == (GiB, "SLURM_MEM_PER_NODE")
