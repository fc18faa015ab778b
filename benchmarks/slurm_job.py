"""The fixture build as a Slurm batch job on a real one-node Slurm: submit-to-running latency,
the job's wall time, the same build run directly (`invoke build`), and a resubmission that
resumes (everything skipped). Prints job / direct and resubmission / first job.

Usage: python benchmarks/slurm_job.py [--set key=value ...]
Needs slurm-wlm and munge (.ci/run installs them); starts its own slurmctld, slurmd and
munged in a temporary directory (tests/slurm_cluster.py) and stops them at the end. Builds
natively (--engine native), with ccache disabled so both builds compile everything.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from slurm_cluster import SlurmCluster, missing_tools  # noqa: E402


def invoke(args: list[str], env: dict[str, str] | None = None) -> tuple[str, float]:
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    if res.returncode != 0:
        sys.exit(f"invoke {args[0]} failed (exit {res.returncode}):\n{res.stdout[-3000:]}{res.stderr}")
    return res.stdout, time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    if missing_tools():
        sys.exit(f"needs slurm-wlm and munge: {', '.join(missing_tools())} missing")
    with tempfile.TemporaryDirectory(prefix="tb-slurm-bench-") as tmp:
        work = Path(tmp)
        sets = [*args.sets, "patches=none", "env.CCACHE_DISABLE=1", f"cache_dir={work / 'cache'}"]
        set_args = [a for s in sets for a in ("--set", s)]
        trees = {}
        for name in ("direct", "job"):
            trees[name] = work / name
            shutil.copytree(ROOT / "tests" / "fixtures" / "minitorch", trees[name])
        _, direct = invoke(["build", "--source", str(trees["direct"]), "--out", str(work / "out-direct"), *set_args])
        print(f"invoke build (direct):           {direct:6.1f} s", flush=True)

        cluster = SlurmCluster(work / "slurm")
        (work / "slurm").mkdir()
        cluster.start()
        try:
            job = ["submit", "--engine", "native", "--wait", "--cpus", "2", "--source", str(trees["job"])]
            job += ["--out", str(work / "out-job"), *set_args]
            first, first_s = invoke(job, cluster.env)
            again, again_s = invoke(job, cluster.env)
        finally:
            cluster.stop()
    latency = re.search(r"started on \S+, (\d+) s after submission", first)
    ran = re.search(r"COMPLETED \(exit code 0\) after (\d+) s", first)
    if not latency or not ran or "resume: skipping the build" not in again:
        sys.exit(f"unexpected output:\n{first[-2000:]}\n{again[-2000:]}")
    print(f"submit-to-running latency:        {int(latency.group(1)):6d} s (Slurm's SubmitTime -> StartTime)")
    print(f"job wall time (Slurm's RunTime):  {int(ran.group(1)):6d} s")
    print(f"invoke submit --wait, end to end: {first_s:6.1f} s")
    print(f"resubmission (all steps skipped): {again_s:6.1f} s")
    print(f"ratio job / direct:               {first_s / direct:6.2f}")
    print(f"ratio resubmission / first job:   {again_s / first_s:6.2f}")


if __name__ == "__main__":
    main()
