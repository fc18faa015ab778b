"""A real one-node Slurm for the integration tests: munged, slurmctld and slurmd from Debian's
slurm-wlm, started in a private directory with a generated slurm.conf (this machine's CPUs and
RealMemory), reached by the clients through SLURM_CONF, and stopped afterwards. Like the Alliance's, each job has a
node-local $SLURM_TMPDIR (a TaskProlog makes it, the Epilog removes it: `jobtmp`)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
TOOLS = (*DAEMONS, "sbatch", "squeue", "scontrol", "scancel", "sinfo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _real_memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 - 512  # slurmd drains a node that has less than this
    raise RuntimeError("no MemTotal in /proc/meminfo")


class SlurmCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.node = socket.gethostname().split(".")[0]
        self.env = {"SLURM_CONF": str(self.conf)}

    def write_conf(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(mode=0o700, exist_ok=True)
        cpus = len(os.sched_getaffinity(0))
        # as the Alliance's prolog does: each job gets a node-local $SLURM_TMPDIR, removed after it
        (r / "jobtmp").mkdir(exist_ok=True)
        prolog, epilog = r / "taskprolog.sh", r / "epilog.sh"
        prolog.write_text(
            f'#!/bin/sh\nd={r}/jobtmp/job.$SLURM_JOB_ID\nmkdir -p "$d" && echo "export SLURM_TMPDIR=$d"\n'
        )
        epilog.write_text(f'#!/bin/sh\nrm -rf "{r}/jobtmp/job.$SLURM_JOB_ID"\n')
        for script in (prolog, epilog):
            script.chmod(0o755)
        self.conf.write_text(
            f"""ClusterName=torchbuildtest
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.sock
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=10
TaskProlog={r}/taskprolog.sh
Epilog={r}/epilog.sh
SchedulerType=sched/backfill
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_real_memory_mb()} State=UNKNOWN
PartitionName=build Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )

    def start(self) -> None:
        self.write_conf()
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        m = self.root / "munge"
        munged = ["munged", "--force", f"--key-file={key}", f"--socket={m}/munge.sock", f"--pid-file={m}/munged.pid"]
        subprocess.run([*munged, f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"], check=True)
        subprocess.run(["slurmctld", "-f", str(self.conf)], check=True)
        subprocess.run(["slurmd", "-f", str(self.conf), "-N", self.node], check=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-N", "-o", "%T").stdout.strip()
            if state == "idle":
                return
            time.sleep(1)
        raise RuntimeError(f"the Slurm node did not become idle: {self.log_tail()}")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, env={**os.environ, **self.env}, capture_output=True, text=True, check=False)

    def queue(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i %T").stdout.split("\n")[:-1]

    def state(self, job_id: str) -> str:
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "")

    def log_tail(self) -> str:
        logs = [self.root / "log" / f"{d}.log" for d in ("slurmctld", "slurmd")]
        return "\n".join(p.read_text()[-1500:] for p in logs if p.exists())

    def stop(self) -> None:
        for job in self.queue():
            self.run("scancel", job.split()[0])
        for pidfile in ("slurmd.pid", "slurmctld.pid", "munge/munged.pid"):
            path = self.root / pidfile
            try:
                pid = int(path.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError, IndexError):
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.1)


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]
