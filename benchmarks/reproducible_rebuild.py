"""Reproducible and path-independent rebuilds of the fixture (tests/fixtures/minitorch), natively
or in the toolchain image. From one run it prints:

- byte-identical: two cold builds in fresh trees at different paths, each with its own ccache:
  the wheels' sha256 equal (goal: yes);
- misses at another path: a third checkout of the same tree at another path, with the first
  build's warm ccache: compile steps that missed ccache (goal 0), and the same with ccache's own
  defaults (a base dir that matches nothing, as when CCACHE_BASEDIR is unset) for contrast.

Usage: python benchmarks/reproducible_rebuild.py [--in-container --set base_image=... --set ...]
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


def checkout(dest: Path) -> Path:
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--in-container", action="store_true", help="build in the profile's toolchain image")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    sets = list(args.sets)
    prefix = ["--profile", args.profile, *(["--in-container"] if args.in_container else [])]
    with tempfile.TemporaryDirectory(prefix="tb-repro-") as tmp:
        work = Path(tmp)
        a = checkout(work / "a" / "minitorch")
        b = checkout(work / "b" / "some" / "deeper" / "path" / "minitorch")
        ma, ta = run_build(a, work, "a", "cache-a", prefix, sets)
        mb, tb = run_build(b, work, "b", "cache-b", prefix, sets)
        identical = ma["wheel"]["sha256"] == mb["wheel"]["sha256"]
        c = checkout(work / "c" / "elsewhere" / "minitorch")
        mc, tc = run_build(c, work, "c", "cache-a", prefix, sets)
        d = checkout(work / "d" / "minitorch")
        contrast = ['env={"CCACHE_BASEDIR": "/no-such-base-dir"}']
        md, td = run_build(d, work, "d", "cache-a", prefix, [*sets, *contrast])
    where = "in the image" if args.in_container else "natively"
    print(f"fixture builds {where}: cold {ta:.1f} s and {tb:.1f} s, warm at another path {tc:.1f} s")
    print(f"byte-identical (two cold builds at different paths): {'yes' if identical else 'NO'}")
    print(f"  sha256 {ma['wheel']['sha256']}")
    print(f"  sha256 {mb['wheel']['sha256']}")
    print(
        f"misses at another path, warm cache: {mc['ccache']['misses']} of "
        f"{mc['ccache']['misses'] + mc['ccache']['hits']} compiles (goal 0)"
    )
    print(
        f"  with ccache's defaults (no base dir): {md['ccache']['misses']} of "
        f"{md['ccache']['misses'] + md['ccache']['hits']} ({td:.1f} s)"
    )
    print(f"warm rebuild at another path / cold: {tc / ta:.2f}")


def run_build(tree: Path, work: Path, name: str, cache: str, prefix: list[str], sets: list[str]) -> tuple[dict, float]:
    sets_args = [f"cache_dir={work / cache}", "patches=none", "local_version=bench", *sets]
    out = work / f"out-{name}"
    cmd = [sys.executable, "-m", "invoke", "build", *prefix, "--no-verify", "--source", str(tree), "--out", str(out)]
    cmd += [a for s in sets_args for a in ("--set", s)]
    start = time.monotonic()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    if res.returncode != 0:
        sys.exit(f"invoke build failed ({res.returncode}):\n{res.stdout[-3000:]}{res.stderr}")
    (path,) = out.glob("*.whl.manifest.json")
    return json.loads(path.read_text()), seconds


if __name__ == "__main__":
    main()
