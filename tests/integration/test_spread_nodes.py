"""`invoke submit --nodes 2` on a real two-node Slurm (tests/slurm_nodes.py, its node image with
Debian's distcc 3.4 added): the minitorch fixture built natively on node1 with its compiles
spread to node2's distccd (started by the job through srun, stopped at the job's end), then
the same build on one node with its own cache: distccd's own log on node2 shows the fixture's
objects compiled there, and the two wheels are byte-identical."""

from __future__ import annotations

import hashlib
import io
import re
import shutil
from typing import Any

import pytest
from helpers import FIXTURES
from slurm_nodes import SlurmNodes, image

pytestmark = [pytest.mark.slurm]

DISTCC_RECIPE = """FROM {base}
USER root
RUN apt-get -o Acquire::Check-Valid-Until=false update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends distcc >/dev/null \\
 && rm -rf /var/lib/apt/lists/*
"""
# the fixture's compiled units: c10, ops, 8 kernels, the Python module
FIXTURE_UNITS = 11


def distcc_image(client: Any, base: str) -> str:
    """The two-node Slurm's image with distcc added (built if missing): its tag."""
    base_id = client.images.get(base).id
    digest = hashlib.sha256(f"{base_id}\n{DISTCC_RECIPE}".encode()).hexdigest()[:12]
    tag = f"torchbuild-test/slurm-nodes-distcc:{digest}"
    if not client.images.list(name=tag):
        recipe = io.BytesIO(DISTCC_RECIPE.format(base=base).encode())
        client.images.build(fileobj=recipe, tag=tag, rm=True, forcerm=True, timeout=1200)
    return tag


@pytest.fixture(scope="module")
def cluster(engine, torch_image, tmp_path_factory):
    spec, _ = torch_image
    tag = distcc_image(engine.client, image(engine.client, spec.image_tag))
    nodes = SlurmNodes(engine.client, tag, tmp_path_factory.mktemp("slurm-spread"))
    try:
        nodes.start()
        shutil.copytree(
            FIXTURES / "minitorch",
            nodes.shared / "minitorch",
            ignore=shutil.ignore_patterns("build", "*.so", "_version.py"),
        )
        yield nodes
    finally:
        nodes.stop()


def _submit(cluster: SlurmNodes, name: str, nodes: int) -> tuple[int, str]:
    s = cluster.shared
    tree = s / f"tree-{name}"
    shutil.copytree(s / "minitorch", tree)  # one tree each: each build its own
    return cluster.run(
        f"python3 -m invoke submit --engine native --nodes {nodes} --cpus 1 --wait --source {tree} "
        f"--out {s}/out-{name} --set cache_dir={s}/cache-{name} --set patches=none",
        timeout=540,
    )


def test_two_node_build_compiles_on_the_other_node_and_gives_the_one_node_wheel(cluster):
    code, out = _submit(cluster, "two", 2)
    assert code == 0, out[-4000:] + cluster.log_tail()
    assert "DISTCC_HOSTS=localhost/1 " in out, out[-3000:]
    s = cluster.shared
    (log,) = (s / "out-two" / "logs").glob("distcc-*-daemons.log")
    compiled = re.findall(r"COMPILE_OK.*", log.read_text())
    print(f"distccd on node2 compiled {len(compiled)} of the fixture's {FIXTURE_UNITS} units")
    assert compiled, log.read_text()[-3000:]
    assert f"torchbuild: the other nodes compiled {len(compiled)} units" in out  # the job says so itself
    code, out = _submit(cluster, "one", 1)
    assert code == 0, out[-4000:] + cluster.log_tail()
    (two,) = (s / "out-two").glob("minitorch-*.whl")
    (one,) = (s / "out-one").glob("minitorch-*.whl")
    assert two.name == one.name and two.read_bytes() == one.read_bytes()
    # the daemons ended with the job: no distccd left on either node (a defunct one aside: the
    # node container's PID 1 is slurmd, which, unlike a real node's init, reaps no orphan)
    for node in ("node1", "node2"):
        ps = cluster.containers[node].exec_run(["ps", "-C", "distccd", "-o", "pid=,stat="]).output.decode()
        alive = [line for line in ps.splitlines() if line.split() and "Z" not in line.split()[1]]
        assert not alive, f"{node}: distccd left: {alive}"
