"""A real two-node Slurm in containers for the multi-node tests: slurmctld and munged in a
controller container, slurmd and munged in two node containers, on a Docker network the
fixture creates; one munge key; one shared directory bind-mounted at the same path in all three
(slurm.conf, the install prefix and the job's run directory live there). Everything is removed
by stop(), whatever state the cluster is in.

The image adds Debian's slurmd, slurmctld, munge and python3-mpi4py (against the image's Open
MPI 5, which srun starts through Slurm's PMIx plugin: MpiDefault=pmix, as sites set it) and
torchbuild's own dependencies to an image with Debian's torch; it is built once per base image
and kept (its tag carries a hash of the base's id and of this recipe).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import secrets
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

NODES = ("node1", "node2")
CONTROLLER = "ctl"
REPO = Path(__file__).resolve().parents[1]
RECIPE = """FROM {base}
USER root
RUN apt-get -o Acquire::Check-Valid-Until=false update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
    slurmd slurmctld slurm-client munge python3-mpi4py procps >/dev/null \\
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m pip install -q "invoke>=2.2" "jsonschema>=4" "pyyaml>=6" "packaging>=23" "cattrs>=23.2" \\
    "docker>=7.0" "spython>=0.3" "rich>=13" "filelock>=3.10.6" "platformdirs>=2.5"
"""
# ReturnToService=1: a node that was DOWN only for not responding comes back when its slurmd
# registers; one set DOWN by an admin stays down. With 2, slurmctld's next ping brought node2
# back within the 15 s test_verify_nodes waits, and the job ran (the stop's CI and the act run).
CONF = """ClusterName=torchbuildnodes
SlurmctldHost={controller}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile={shared}/log/slurmctld.log
SlurmdLogFile={shared}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
PropagateResourceLimits=NONE
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=1
MinJobAge=600
KillWait=5
SlurmdTimeout=30
SchedulerType=sched/backfill
NodeName={nodes} CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
# each container: the shared munge key, munged, then its Slurm daemon in the foreground
START = """set -e
install -o munge -g munge -m 0400 {shared}/munge.key /etc/munge/munge.key
mkdir -p /run/munge /var/spool/slurmd /var/spool/slurmctld && chown munge:munge /run/munge
runuser -u munge -- /usr/sbin/munged
exec {daemon}
"""


def image(client: Any, base: str) -> str:
    """The test image on base (built if missing): its tag."""
    base_id = client.images.get(base).id
    digest = hashlib.sha256(f"{base_id}\n{RECIPE}".encode()).hexdigest()[:12]
    tag = f"torchbuild-test/slurm-nodes:{digest}"
    if not client.images.list(name=tag):
        recipe = io.BytesIO(RECIPE.format(base=base).encode())
        client.images.build(fileobj=recipe, tag=tag, rm=True, forcerm=True, timeout=1200)
    return tag


class SlurmNodes:
    """The cluster; run() executes a command in the controller container as a user would on a
    login node (the worktree at /src, read-only, with tasks.py: `python3 -m invoke ...`)."""

    def __init__(self, client: Any, tag: str, shared: Path) -> None:
        self.client, self.tag, self.shared = client, tag, shared
        self.name = f"torchbuild-slurm-{secrets.token_hex(4)}"
        self.network: Any = None
        self.containers: dict[str, Any] = {}

    def start(self, timeout: float = 120) -> None:
        (self.shared / "log").mkdir(parents=True, exist_ok=True)
        key = self.shared / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o644)  # copied into each container's /etc/munge as munge's, mode 0400
        conf = CONF.format(controller=CONTROLLER, shared=self.shared, nodes=",".join(NODES))
        (self.shared / "slurm.conf").write_text(conf)
        self.network = self.client.networks.create(self.name, driver="bridge")
        self._run(CONTROLLER, "slurmctld -D -f $SLURM_CONF")
        for node in NODES:
            self._run(node, f"slurmd -D -f $SLURM_CONF -N {node}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, out = self.run("sinfo -h -N -o '%N %T'")
            states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
            if code == 0 and all(states.get(n) == "idle" for n in NODES):
                return
            time.sleep(1)
        raise RuntimeError(f"the Slurm nodes did not become idle: {out}\n{self.log_tail()}")

    def _run(self, host: str, daemon: str) -> None:
        script = START.format(shared=self.shared, daemon=daemon)
        self.containers[host] = self.client.containers.run(
            self.tag,
            ["bash", "-c", script],
            name=f"{self.name}-{host}",
            hostname=host,
            network=self.name,
            volumes={
                str(self.shared): {"bind": str(self.shared), "mode": "rw"},
                str(REPO): {"bind": "/src", "mode": "ro"},
            },
            environment={"SLURM_CONF": str(self.shared / "slurm.conf"), "HOME": "/tmp", "PYTHONPATH": "/src/src"},
            shm_size="256m",
            init=True,  # docker-init as PID 1 reaps the daemons' exited children (distccd forks per job)
            detach=True,
        )

    def run(self, command: str, timeout: int = 600) -> tuple[int, str]:
        """bash -c command in the controller, from /src: (exit code, stdout and stderr)."""
        wrapped = f"timeout {timeout} bash -c {shlex.quote(command)}"
        result = self.containers[CONTROLLER].exec_run(["bash", "-c", wrapped], workdir="/src", demux=False)
        return result.exit_code, result.output.decode("utf-8", "replace")

    def log_tail(self) -> str:
        logs = sorted((self.shared / "log").glob("*.log"))
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs)

    def stop(self) -> None:
        for container in self.containers.values():
            with contextlib.suppress(Exception):
                container.remove(force=True)
        if self.network is not None:
            with contextlib.suppress(Exception):
                self.network.remove()
        shutil.rmtree(self.shared, ignore_errors=True)
