"""Preflight of real PyTorch 2.6 (Debian's de-vendored source) twice: cold, then after
cleaning the build tree with the ccache warm. Prints the second/first wall-time ratio and
the ccache hit rate (goals: ratio <= 0.5, hits >= 90 %).

Usage: python benchmarks/preflight_ccache.py [--base torchbuild/base:trixie-x86_64] [--set k=v ...]
Needs a Docker engine and the local base image (`invoke base-image --suite trixie`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from debian_source import fetch_debian_pytorch  # noqa: E402

from torchbuild.runtime.engine import Engine  # noqa: E402

PROFILE = str(ROOT / "tests" / "fixtures" / "profiles" / "debian-pytorch-2.6.yaml")


def invoke(*args: str) -> tuple[float, str]:
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"invoke {args[0]} failed ({res.returncode}):\n{res.stdout[-3000:]}{res.stderr}")
    return time.monotonic() - start, res.stdout


def manifest(stdout: str) -> dict:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("manifest: "))
    return json.loads(Path(line.split(": ", 1)[1]).read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base", default="torchbuild/base:trixie-x86_64")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tb-bench-") as tmp:
        work = Path(tmp)
        dsc = fetch_debian_pytorch(Engine.connect(), args.base, work / "debian-src")
        sets = [a for s in [f"base_image={args.base}", f"cache_dir={work / 'cache'}", *args.sets] for a in ("--set", s)]
        invoke("image", "--profile", PROFILE, *sets)
        common = [
            "build",
            "--in-container",
            "--preflight",
            "--profile",
            PROFILE,
            "--source",
            str(dsc),
            "--out",
            str(work / "out"),
        ]
        cold, out1 = invoke(*common, *sets)
        warm, out2 = invoke(*common, "--clean", *sets)
        m1, m2 = manifest(out1), manifest(out2)
    p1, p2 = m1["preflight"], m2["preflight"]
    print(
        f"first preflight (cold ccache):          {cold:6.1f} s  (configure {p1['configure_s']} s, c10 {p1['targets_s']} s)"
    )
    print(
        f"second preflight (--clean, warm ccache): {warm:6.1f} s  (configure {p2['configure_s']} s, c10 {p2['targets_s']} s)"
    )
    print(f"ratio second/first (whole preflight):    {warm / cold:.2f}  (goal <= 0.50)")
    print(f"ratio second/first (target compile):     {p2['targets_s'] / p1['targets_s']:.2f}")
    print(f"ccache hit rate of the second run:       {m2['ccache']['hit_rate']:.1%}  (goal >= 90 %)")


if __name__ == "__main__":
    main()
