"""Under a memory cap where `-j <nproc>` is killed, time the adaptive build (start at nproc,
resume with fewer jobs on each out-of-memory kill) against every fixed -j that survives the
cap without help, and print adaptive / best fixed (goal: <= 1.3).

Usage: python benchmarks/oom_adaptive.py [--set key=value ...] [--memory 1300m] [--heavy 4]
Builds tests/fixtures/minitorch with MINITORCH_HEAVY memory-heavy units (about 0.8 GB each in
gcc 14's cc1plus) in the cpu toolchain image (`invoke image` with the same --set must have run). ccache
is off, so every run compiles everything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(work: Path, sets: list[str], memory: str, jobs: int, retry: bool) -> tuple[bool, float, dict]:
    tree, out = work / f"tree-{jobs}-{retry}", work / f"out-{jobs}-{retry}"
    shutil.copytree(ROOT / "tests" / "fixtures" / "minitorch", tree)
    cmd = [
        sys.executable, "-m", "invoke", "build", "--in-container", "--profile", "cpu", "--arch", "x86_64",
        "--source", str(tree), "--out", str(out), "--memory", memory, "--jobs", str(jobs), "--progress", "lines", "--no-verify",
        *(["--no-retry"] if not retry else []),
        *[a for s in sets for a in ("--set", s)],
    ]  # fmt: skip
    start = time.monotonic()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    manifests = list(out.glob("*.manifest.json"))
    if res.returncode not in (0, 13):
        sys.exit(f"unexpected failure (exit {res.returncode}):\n{res.stdout[-3000:]}{res.stderr}")
    return res.returncode == 0, took, json.loads(manifests[0].read_text()) if manifests else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--memory", default="1300m")
    ap.add_argument("--heavy", type=int, default=4)
    args = ap.parse_args()
    nproc = max(2, os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="tb-oom-bench-") as tmp:
        work = Path(tmp)
        sets = [*args.sets, f"env.MINITORCH_HEAVY={args.heavy}", "env.CCACHE_DISABLE=1", "patches=none",
                f"cache_dir={work / 'cache'}"]  # fmt: skip
        fixed: dict[int, tuple[bool, float]] = {}
        for j in range(1, nproc + 1):
            ok, took, _ = build(work, sets, args.memory, j, retry=False)
            fixed[j] = (ok, took)
            print(f"fixed -j{j}: {'ok' if ok else 'killed (OutOfMemory)'} in {took:.1f} s", flush=True)
        ok, adaptive, manifest = build(work, sets, args.memory, nproc, retry=True)
        if not ok:
            sys.exit("the adaptive build failed")
        retries = manifest["jobs"]["retries"]
        print(
            f"adaptive from -j{nproc}: {adaptive:.1f} s, {len(retries)} retries, "
            f"ended with {manifest['jobs']['final_jobs']} jobs"
        )
    good = {j: t for j, (ok, t) in fixed.items() if ok}
    if not good:
        sys.exit("no fixed -j survived the cap; lower --heavy or raise --memory")
    if fixed[nproc][0]:
        print(f"note: -j{nproc} survived {args.memory}; the cap does not force a retry here")
    best_j = min(good, key=lambda j: good[j])
    ratio = adaptive / good[best_j]
    print(
        f"adaptive / best fixed (-j{best_j}, {good[best_j]:.1f} s) = {ratio:.2f} ({'within' if ratio <= 1.3 else 'OVER'} 1.3)"
    )
    sys.exit(0 if ratio <= 1.3 else 1)


if __name__ == "__main__":
    main()
