"""A second Python from the same tree: `invoke build --python A,B` in the toolchain image, cold
cache, then prints each wheel's build time (the build step's own duration, from its manifest),
its ccache misses, and the ratio second / first.

Usage: python benchmarks/multi_python.py [--profile tests/fixtures/profiles/sid-pythons.yaml]
           [--python 3.13,3.14] [--source TREE] [--set key=value ...] [--preflight]
The profile's image must provide both Pythons (python_version and python_versions); it is
built first if needed (`invoke image`). Default source: the minitorch fixture, whose _C
extension is its one Python-dependent translation unit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "minitorch"


def invoke(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"invoke {args[0]} failed ({res.returncode}):\n{res.stdout[-3000:]}{res.stderr}")
    return res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=str(ROOT / "tests" / "fixtures" / "profiles" / "sid-pythons.yaml"))
    ap.add_argument("--python", default="3.13,3.14")
    ap.add_argument("--source", default="")
    ap.add_argument("--preflight", action="store_true", help="configure and the preflight targets, no wheel")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    pythons = args.python.split(",")
    with tempfile.TemporaryDirectory(prefix="tb-pythons-") as tmp:
        work = Path(tmp)
        source = args.source
        if not source:
            source = str(work / "minitorch")
            shutil.copytree(FIXTURE, source, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
        sets = [a for s in [f"cache_dir={work / 'cache'}", "patches=none", *args.sets] for a in ("--set", s)]
        invoke("image", "--profile", args.profile, "--arch", "x86_64", *sets)
        out = work / "out"
        rows = []
        for python in pythons:  # one invocation each, so each is timed alone; the same as --python A,B
            start = time.monotonic()
            extra = ["--preflight"] if args.preflight else ["--no-verify"]
            invoke(
                "build", "--in-container", "--profile", args.profile, "--arch", "x86_64", "--python", python,
                "--source", source, "--out", str(out), *extra, *sets,
            )  # fmt: skip
            wall = time.monotonic() - start
            newest = max(out.glob("*.manifest.json"), key=lambda p: p.stat().st_mtime)
            m = json.loads(newest.read_text())
            rows.append((python, m["duration_s"], wall, m["ccache"]["misses"], m["ccache"]["hits"]))
    for python, step, wall, misses, hits in rows:
        print(f"Python {python}: build step {step:.1f} s (invoke {wall:.1f} s), ccache {misses} misses, {hits} hits")
    (p1, s1, w1, *_), (p2, s2, w2, *_) = rows[0], rows[1]
    print(f"second Python ({p2}) / first ({p1}): {s2 / s1:.2f} (build step), {w2 / w1:.2f} (invoke)")


if __name__ == "__main__":
    main()
