"""Under a memory cap where `-j <nproc>` is killed, time the pooled build (the heavy units in a
ninja pool whose depth follows memory, the light compiles on every core), today's adaptive
one (start at nproc, resume with fewer jobs on each out-of-memory kill) and today's planned one
(every job planned at the heavy units' peak, no pool) against every fixed -j that survives the
cap without help; print pooled / best fixed (goal: <= 0.6) next to adaptive / best fixed and
planned / best fixed, from one run.

Usage: python benchmarks/heavy_pool.py [--set key=value ...] [--memory 1300m] [--heavy 4] [--light 80]
Builds tests/fixtures/minitorch with MINITORCH_HEAVY memory-heavy units (about 0.8 GB and 4.5 s
each in gcc 14's cc1plus) and MINITORCH_LIGHT light units with real work (about 0.12 GB and 1.2 s
each: PyTorch's mix, many light units and a few heavy ones; without them the fixture's light
kernels compile in a fraction of a second and no arm has anything to overlap) beside its own ones in the cpu toolchain image (`invoke
image` with the same --set must have run). ccache is off, so every run compiles everything.

What each arm is told (printed at the start): every arm gets the same profile, KNOWN (which
sources are heavy, their peak and the light units' peak). The fixed and adaptive arms run with
--jobs, so the planner uses none of it (a fixed count gets no pool); the planned arm is
today's planner given the same peaks without a pool (each job planned at the heavy peak); the
pooled arm plans from KNOWN. Figures measured before the arms were told the same must be
measured again (docs/figures.md has today's).
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
# the fixture's heavy units (about 0.8 GB in cc1plus) and its small light ones, known to every arm
KNOWN = ["heavy_units=[build/heavy/heavy_*.cpp]", "mem_per_heavy_job_gb=0.9", "mem_per_job_gb=0.15"]
# today's planner with the same knowledge and no pool: every job at the heavy peak
PLANNED = ["heavy_units=[]", "mem_per_job_gb=0.9"]
TOLD = {
    "fixed": "--jobs J --no-retry (the profile's peaks unused)",
    "adaptive": "--jobs NPROC, resumed with fewer on OOM (the profile's peaks unused)",
    "planned": "auto plan, no pool, every job at the heavy peak (mem_per_job_gb=0.9)",
    "pooled": "auto plan from KNOWN: heavy pool at 0.9 GB, light jobs at 0.15 GB",
}


def build(work: Path, name: str, sets: list[str], memory: str, jobs: int, retry: bool) -> tuple[bool, float, dict]:
    tree, out = work / f"tree-{name}", work / f"out-{name}"
    shutil.copytree(ROOT / "tests" / "fixtures" / "minitorch", tree, ignore=shutil.ignore_patterns("build"))
    cmd = [
        sys.executable, "-m", "invoke", "build", "--in-container", "--profile", "cpu", "--arch", "x86_64",
        "--source", str(tree), "--out", str(out), "--memory", memory, "--progress", "lines", "--no-verify",
        *(["--jobs", str(jobs)] if jobs else []),
        *(["--no-retry"] if not retry else []),
        *[a for s in sets for a in ("--set", s)],
    ]  # fmt: skip
    start = time.monotonic()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    manifests = list(out.glob("*.manifest.json"))
    if res.returncode not in (0, 13):
        sys.exit(f"{name}: unexpected failure (exit {res.returncode}):\n{res.stdout[-3000:]}{res.stderr}")
    if name in ("pooled", "planned"):
        said = [ln for ln in res.stdout.splitlines() if "heavy pool" in ln]
        print("\n".join(f"  {ln.strip()}" for ln in said[:3]), flush=True)
    return res.returncode == 0, took, json.loads(manifests[0].read_text()) if manifests else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--memory", default="1300m")
    ap.add_argument("--heavy", type=int, default=4)
    ap.add_argument("--light", type=int, default=80)
    args = ap.parse_args()
    nproc = max(2, os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="tb-heavy-bench-") as tmp:
        work = Path(tmp)
        sets = [*args.sets, f"env.MINITORCH_HEAVY={args.heavy}", f"env.MINITORCH_LIGHT={args.light}", *KNOWN,
                "env.CCACHE_DISABLE=1", "patches=none", f"cache_dir={work / 'cache'}"]  # fmt: skip
        print(f"every arm's profile: {' '.join(KNOWN)}", flush=True)
        print("\n".join(f"  {arm}: {told}" for arm, told in TOLD.items()), flush=True)
        fixed: dict[int, tuple[bool, float]] = {}
        for j in range(1, nproc + 1):
            ok, took, _ = build(work, f"fixed-{j}", sets, args.memory, j, retry=False)
            fixed[j] = (ok, took)
            print(f"fixed -j{j}: {'ok' if ok else 'killed (OutOfMemory)'} in {took:.1f} s", flush=True)
        ok, adaptive, manifest = build(work, "adaptive", sets, args.memory, nproc, retry=True)
        if not ok:
            sys.exit("the adaptive build failed")
        print(f"adaptive from -j{nproc}: {adaptive:.1f} s, {len(manifest['jobs']['retries'])} retries", flush=True)
        ok, planned, manifest = build(work, "planned", [*sets, *PLANNED], args.memory, 0, retry=False)
        if not ok:
            sys.exit("the planned build was killed: its plan overcommitted memory")
        print(f"planned: {planned:.1f} s ({manifest['jobs']['reason']})", flush=True)
        ok, pooled, manifest = build(work, "pooled", sets, args.memory, 0, retry=False)
        if not ok:
            sys.exit("the pooled build was killed: its plan overcommitted memory")
        print(f"pooled: {pooled:.1f} s ({manifest['jobs']['reason']})", flush=True)
    good = {j: t for j, (ok, t) in fixed.items() if ok}
    if not good:
        sys.exit("no fixed -j survived the cap; lower --heavy or raise --memory")
    if fixed[nproc][0]:
        print(f"note: -j{nproc} survived {args.memory}; the cap does not bind here")
    best_j = min(good, key=lambda j: good[j])
    best = good[best_j]
    ratio = pooled / best
    print(f"best fixed: -j{best_j}, {best:.1f} s")
    print(f"adaptive / best fixed = {adaptive / best:.2f}")
    print(f"planned / best fixed = {planned / best:.2f}")
    print(f"pooled / best fixed = {ratio:.2f} ({'within' if ratio <= 0.6 else 'OVER'} 0.6)")
    sys.exit(0 if ratio <= 0.6 else 1)


if __name__ == "__main__":
    main()
