"""Rerun `invoke image` with nothing changed and print its wall time against the 3 s budget.

Usage: python benchmarks/image_cache.py [--set key=value ...] [--runs N]
The first run builds (or finds) the image; the following runs must be cache hits.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

BUDGET_S = 3.0
ROOT = Path(__file__).resolve().parents[1]


def invoke_image(extra: list[str]) -> tuple[float, str]:
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "invoke", "image", *extra], cwd=ROOT, capture_output=True, text=True, check=False
    )
    took = time.monotonic() - start
    if res.returncode != 0:
        sys.exit(f"invoke image failed ({res.returncode}):\n{res.stdout[-2000:]}{res.stderr}")
    return took, res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    extra = ["--profile", args.profile, *[a for s in args.sets for a in ("--set", s)]]
    first, _ = invoke_image(extra)
    reruns = []
    for _ in range(args.runs):
        took, out = invoke_image(extra)
        if "cache hit" not in out:
            sys.exit(f"rerun was not a cache hit:\n{out[-2000:]}")
        reruns.append(took)
    worst = max(reruns)
    print(f"first run: {first:.2f} s")
    print(
        f"reruns (nothing changed): {', '.join(f'{t:.2f}' for t in reruns)} s; median {statistics.median(reruns):.2f} s"
    )
    print(
        f"worst rerun / budget {BUDGET_S:.0f} s = {worst / BUDGET_S:.2f} ({'within' if worst <= BUDGET_S else 'OVER'})"
    )
    print(f"worst rerun / first run = {worst / first:.3f}")
    sys.exit(0 if worst <= BUDGET_S else 1)


if __name__ == "__main__":
    main()
