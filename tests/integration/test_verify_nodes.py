"""`invoke verify --nodes 2` on a real two-node Slurm (tests/slurm_nodes.py: slurmctld and two
slurmd in containers on a network the fixture makes, one munge key, a shared directory): the
job's ranks run gloo, torch's MPI backend and mpi4py all_reduce across both nodes in the install
prefix's runtime env; NCCL is skipped (no GPU). A node that is down: the bounded wait cancels
the job and names why."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from helpers import TORCH_PROFILE
from slurm_nodes import NODES, SlurmNodes, image

PROFILE = str(Path(TORCH_PROFILE).relative_to(Path(__file__).resolve().parents[2]))  # as /src sees it
MARK = "two-nodes"


@pytest.fixture(scope="module")
def cluster(engine, torch_image, tmp_path_factory):
    """The cluster, and an install prefix on its shared directory made as `invoke install` makes
    one (a venv of the image's Python, which has Debian's torch and mpi4py, with the profile's
    runtime_env in bin/activate)."""
    spec, _ = torch_image
    tag = image(engine.client, spec.image_tag)
    nodes = SlurmNodes(engine.client, tag, tmp_path_factory.mktemp("slurm-nodes"))
    try:
        nodes.start()
        prefix = nodes.shared / "env"
        hook = (
            "from pathlib import Path; from torchbuild.install.modulefiles import add_activate_hook as h; "
            f"p = Path('{prefix}/bin/activate'); p.write_text(h(p.read_text(), {{'TORCHBUILD_NODES_TEST': '{MARK}'}}))"
        )
        code, out = nodes.run(
            f"/usr/bin/python3 -m venv --system-site-packages --without-pip {prefix} && python3 -c {shlex.quote(hook)}"
        )
        assert code == 0, out
        yield nodes
    finally:
        nodes.stop()


def verify(cluster: SlurmNodes, *extra: str, timeout: int = 300) -> tuple[int, str]:
    s = cluster.shared
    return cluster.run(
        f"python3 -m invoke verify --profile {PROFILE} --nodes 2 --prefix {s}/env --out {s}/out "
        f"--cpus 1 --timeout {timeout} " + " ".join(extra),
        timeout=timeout + 120,
    )


def test_two_nodes_all_reduce_over_gloo_and_mpi(cluster):
    code, out = verify(cluster)
    print(out)  # the two-node all_reduce result, for the note
    assert code == 0, out[-4000:] + cluster.log_tail()
    report_path = Path(re.search(r"^report: (\S+)$", out, re.M)[1])
    report = json.loads(report_path.read_text())
    assert report["ok"] and report["world_size"] == 2 and report["nodes"] == 2
    assert report["hosts"] == list(NODES) and report["launcher"] == "srun"
    assert report["all_reduce_sum"] == 3 and report["all_reduce_correct"]
    ranks = report["ranks"]
    assert sorted(r["hostname"] for r in ranks) == list(NODES) and [r["rank"] for r in ranks] == [0, 1]
    assert {r["venv"] for r in ranks} == {str(cluster.shared / "env")}  # the install's runtime env
    status = {c["name"]: c for c in report["checks"]}
    assert status["gloo all_reduce"]["status"] == "pass"
    assert status["mpi all_reduce"]["status"] == "pass", status["mpi all_reduce"]
    assert status["mpi4py allreduce"]["status"] == "pass", status["mpi4py allreduce"]
    assert "Open MPI" in status["mpi4py allreduce"]["detail"]
    assert status["nccl all_reduce"]["status"] == "skip" and "no GPU" in status["nccl all_reduce"]["detail"]
    assert re.search(
        r"world size 2 on 2 of 2 nodes \(node1, node2\); gloo all_reduce sum 3 \(expected 3\): correct", out
    )
    assert re.search(r"^\s*0\s+node1\s", out, re.M) and re.search(r"^\s*1\s+node2\s", out, re.M), out


def test_a_node_down_is_named_and_the_job_cancelled(cluster):
    code, out = cluster.run(f"scontrol update nodename={NODES[1]} state=down reason=torchbuild-test")
    assert code == 0, out
    try:
        code, out = verify(cluster, timeout=15)
        assert code == 21, out  # JobFailed
        assert re.search(
            r"JobFailed: slurm job \d+ was still waiting for its nodes \(PENDING\) after 15 s: cancelled", out
        ), out
        assert "Traceback" not in out
        job = re.search(r"slurm job (\d+) was", out)[1]
        _, state = cluster.run(f"scontrol show job -o {job}")
        assert "JobState=CANCELLED" in state, state
    finally:
        cluster.run(f"scontrol update nodename={NODES[1]} state=resume")


def test_a_rank_that_fails_a_check_fails_the_verify(cluster):
    """A prefix whose Python has no torch (a venv without the system's packages): each rank
    reports `import torch` failed, and verify exits with VerifyFailed naming it."""
    bare = cluster.shared / "bare"
    code, out = cluster.run(f"/usr/bin/python3 -m venv --without-pip {bare}")
    assert code == 0, out
    s = cluster.shared
    code, out = cluster.run(
        f"python3 -m invoke verify --profile {PROFILE} --nodes 2 --prefix {bare} --out {s}/out --cpus 1 --timeout 120"
    )
    assert code == 14, out  # VerifyFailed
    assert re.search(r"^error: VerifyFailed: 2-node check: import torch$", out, re.M), out
    report = json.loads(Path(re.search(r"^report: (\S+)$", out, re.M)[1]).read_text())
    status = {c["name"]: c for c in report["checks"]}
    assert not report["ok"] and status["import torch"]["status"] == "fail"
    assert "ModuleNotFoundError" in status["import torch"]["detail"], status
    # what could not run is skipped with why, not passed
    assert status["gloo all_reduce"] == {
        "name": "gloo all_reduce",
        "status": "skip",
        "detail": "not run: import torch failed",
    }
    assert "Traceback" not in out
