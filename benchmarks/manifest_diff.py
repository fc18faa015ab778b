"""Time `invoke manifest.diff A.whl B.whl` on wheels of 40k members (issue 27 item 11).

Usage: python benchmarks/manifest_diff.py [--members N]
Writes two wheels of N members each (B: the same names in reverse order, each member's content
changed, so every member differs in content and position), times the comparison and its table
(repro.diff_wheels + repro.describe) at N/10 and at N, and prints the ratio of the two times:
about 10 when the work grows linearly with the members, about 100 when it grows quadratically.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from torchbuild.builder import repro  # noqa: E402

RATIO_BUDGET = 20.0  # linear is ~10; quadratic is ~100


def wheels(directory: Path, members: int) -> tuple[Path, Path]:
    names = [f"pkg/m{i:06d}.py" for i in range(members)] + ["pkg-1.0.dist-info/WHEEL"]
    a, b = directory / "a" / "pkg-1.0-py3-none-any.whl", directory / "b" / "pkg-1.0-py3-none-any.whl"
    for path, order, salt in ((a, names, "a"), (b, names[::-1], "b")):
        path.parent.mkdir(parents=True)
        with zipfile.ZipFile(path, "w") as z:
            for name in order:
                z.writestr(name, f"{salt}\n")
    return a, b


def timed(directory: Path, members: int) -> float:
    a, b = wheels(directory, members)
    start = time.perf_counter()
    text = repro.describe(repro.diff_wheels(a, b), a, b)
    took = time.perf_counter() - start
    assert f"{members + 1} members differ" in text, text[-200:]
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--members", type=int, default=40_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small = timed(Path(tmp) / "small", args.members // 10)
        large = timed(Path(tmp) / "large", args.members)
    ratio = large / small
    print(f"{args.members // 10} members: {small:.2f} s")
    print(f"{args.members} members: {large:.2f} s")
    print(f"ratio {ratio:.1f} (10 is linear, 100 quadratic; budget {RATIO_BUDGET:.0f})")
    sys.exit(0 if ratio <= RATIO_BUDGET else 1)


if __name__ == "__main__":
    main()
