"""The fixture built by `invoke submit --nodes 2` (its compiles spread to the second node's
distccd) against `invoke submit --nodes 1`, on the real two-node Slurm of tests/slurm_nodes.py
with Debian's distcc added: both times from submit to the job's end, two-node / one-node, and
how many units node2's distccd compiled (its own log). Then the on-paper model: what the same
split gives a real PyTorch 2.6 build on N nodes of M cores, from measured per-unit times.

Usage: python benchmarks/spread_nodes.py [--set key=value ...] [--heavy 6] [--model-only]
Needs Docker and the debian-torch-installed toolchain image (`nox -s integration` makes it;
--image names another). Starts the three Slurm containers (controller, node1, node2) on a
network of their own and removes them, the network and the shared directory at the end, also
on Ctrl-C. Both builds are native in the node containers, each with its own empty cache.

Honest reading on this machine: the two "nodes" are containers sharing the same 2 cores, so
the two-node job (1 slot on each node) is compared with a one-node job with both cores (2
slots): the same cores and parallelism, so the ratio shows distcc's overhead (the daemon's
srun step, preprocessing kept on node1, shipping each unit), never a speed-up. The fixture gets
MINITORCH_HEAVY units (each ~4.5 s of cc1plus, as in benchmarks/heavy_pool.py) so compiles,
not the job's fixed costs, are a fair share of the time.

The model (paper_table): a lower bound with ideal scheduling, Amdahl's serial part first:
  T(N, M) = serial + max(all work / (N*M), node1's own work / M, the longest unit)
serial: CMake's configure (22 s, `setup.py build --cmake-only` here), ATen's code generation
(8.1 s, benchmarks/preflight_warm.py) and the links (not measured here: assumed 120 s, kept
local); all work: every unit's preprocessing (twice on a ccache miss: ccache's own pass, then
distcc's, which ccache's run_second_cpp makes on the original source) and compile, plus
distcc's overhead per shipped unit (measured by this script: (two-node - one-node) / units
node2 compiled, an upper bound: it holds the daemons' start too); node1's own work: both
preprocessing passes of every unit and the heavy units whole (distcc plain mode preprocesses
on the build's node; the pool keeps heavy units local). The units, counted in PyTorch 2.6.0's
source (Debian's orig tarball): 1,214 .cpp files a CPU build compiles (CUDA, HIP, MPS, Vulkan,
XPU, tests and benchmarks left out) plus ATen's 64 native/cpu kernels twice more (AVX2 and
AVX512 beside the default): 91 include no ATen or torch header and take TensorImpl.cpp's
measured times (1.1 s preprocessing, 26.4 s compile), the 1,251 others those of a unit
including ATen/ATen.h (13.5 s, 52.1 s); both measured with this machine's g++ 12 and the
preflight's flags (src/torchbuild/batch/spread.py). 20 of the latter are taken as heavy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# tests/ helpers, as benchmarks/slurm_job.py does; tests/integration for the distcc image recipe
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

IMAGE = "torchbuild/toolchain:debian-torch-installed-2.6.0-x86_64"
# distcc's overhead per shipped unit this script measured here (the docs' tables use it)
MEASURED_OVERHEAD_S = 3.58
SUBMIT_TIMEOUT = 900


@dataclasses.dataclass(frozen=True)
class UnitClass:
    """count translation units that each preprocess in preprocess_s and compile in compile_s."""

    count: int
    preprocess_s: float
    compile_s: float


@dataclasses.dataclass(frozen=True)
class BuildModel:
    """A build on paper: its units, its serial part (configure, code generation, links: Amdahl's),
    the heavy units kept on the build's node, preprocessing passes per unit (2 behind ccache)."""

    units: tuple[UnitClass, ...]
    serial_s: float
    heavy: int = 0
    preprocess_passes: int = 2

    def unit_seconds(self, u: UnitClass) -> float:
        return self.preprocess_passes * u.preprocess_s + u.compile_s


# PyTorch 2.6's CPU build, as the module docstring counts and measures it
PYTORCH_26 = BuildModel(
    units=(UnitClass(91, 1.1, 26.4), UnitClass(1251, 13.5, 52.1)),
    serial_s=22.0 + 8.1 + 120.0,
    heavy=20,
)


def build_seconds(model: BuildModel, nodes: int, cores: int, overhead_s: float = 0.0) -> float:
    """The model's wall time on `nodes` nodes of `cores` cores each (a lower bound: ideal
    scheduling). One node compiles everything itself; over several, node1 preprocesses every
    unit and compiles the heavy ones, and each shipped unit costs overhead_s more."""
    if nodes < 1 or cores < 1:
        raise ValueError("nodes and cores must be at least 1")
    total = sum(u.count * model.unit_seconds(u) for u in model.units)
    longest = max(model.unit_seconds(u) for u in model.units if u.count)
    if nodes == 1:
        return model.serial_s + max(total / cores, longest)
    heaviest = max((u for u in model.units if u.count), key=model.unit_seconds)
    heavy = min(model.heavy, heaviest.count)
    shipped = sum(u.count for u in model.units) - heavy
    preprocessing = sum(u.count * model.preprocess_passes * u.preprocess_s for u in model.units)
    node1 = preprocessing + heavy * heaviest.compile_s
    work = total + shipped * overhead_s
    return model.serial_s + max(work / (nodes * cores), node1 / cores, longest)


def paper_table(
    model: BuildModel, nodes: Iterable[int] = (1, 2, 4, 8), cores: Iterable[int] = (32, 64), overhead_s: float = 0.0
) -> list[tuple[int, int, float, float]]:
    """(N, M, minutes, speed-up over one node of M cores) for every N and M."""
    rows = []
    for m in cores:
        one = build_seconds(model, 1, m, overhead_s)
        for n in nodes:
            t = build_seconds(model, n, m, overhead_s)
            rows.append((n, m, t / 60, one / t))
    return rows


def format_table(rows: Sequence[tuple[int, int, float, float]]) -> str:
    """The table as the docs show it (Markdown; docs/hooks/generate.py renders it into the site)."""
    lines = ["| nodes N | cores M | build (min) | speed-up over 1 node |", "|---|---|---|---|"]
    lines += [f"| {n} | {m} | {minutes:.1f} | {speedup:.2f}x |" for n, m, minutes, speedup in rows]
    return "\n".join(lines)


def submit(cluster: Any, name: str, nodes: int, cpus: int, sets: list[str]) -> tuple[float, str]:
    """One `invoke submit --wait` in the controller, its own tree and cache: (seconds, output)."""
    s = cluster.shared
    shutil.copytree(s / "minitorch", s / f"tree-{name}")
    extra = " ".join(f"--set {v}" for v in [*sets, f"cache_dir={s}/cache-{name}", "patches=none"])
    start = time.monotonic()
    code, out = cluster.run(
        f"python3 -m invoke submit --engine native --nodes {nodes} --cpus {cpus} --wait "
        f"--source {s}/tree-{name} --out {s}/out-{name} {extra}",
        timeout=SUBMIT_TIMEOUT,
    )
    took = time.monotonic() - start
    if code != 0:
        sys.exit(f"{name}: the job failed (exit {code}):\n{out[-3000:]}\n{cluster.log_tail()}")
    (manifest,) = (s / f"out-{name}").glob("*.manifest.json")
    jobs = json.loads(manifest.read_text())["jobs"]
    return took, f"MAX_JOBS {jobs['max_jobs']}: {jobs['reason']}"


def compiled_units(ninja_log: Path) -> int:
    """The object files a build's .ninja_log lists (its 4th column: the output)."""
    rows = [ln.split("\t") for ln in ninja_log.read_text().splitlines() if not ln.startswith("#")]
    return sum(1 for r in rows if len(r) >= 4 and r[3].endswith(".o"))


def measure(sets: list[str], image_tag: str) -> tuple[float, float, int, int]:
    """Both jobs on the two-node Slurm: (two-node s, one-node s, units node2 compiled, units)."""
    from slurm_nodes import SlurmNodes, image
    from test_spread_nodes import distcc_image

    from torchbuild.runtime.engine import Engine

    client = Engine.connect().client
    if not client.images.list(name=image_tag):
        sys.exit(f"needs the image {image_tag} (made by `nox -s integration`); --image names another")
    tag = distcc_image(client, image(client, image_tag))
    cluster = SlurmNodes(client, tag, Path(tempfile.mkdtemp(prefix="tb-spread-bench-")))
    try:
        cluster.start()
        shutil.copytree(
            ROOT / "tests" / "fixtures" / "minitorch",
            cluster.shared / "minitorch",
            ignore=shutil.ignore_patterns("build", "*.so", "_version.py"),
        )
        two, plan = submit(cluster, "two", 2, 1, sets)
        print(f"two nodes, 1 core each:  {two:6.1f} s  ({plan})", flush=True)
        (log,) = (cluster.shared / "out-two" / "logs").glob("distcc-*-daemons.log")
        compiled = len(re.findall(r"COMPILE_OK", log.read_text(errors="replace")))
        one, plan = submit(cluster, "one", 1, 2, sets)
        print(f"one node, 2 cores:       {one:6.1f} s  ({plan})", flush=True)
        units = compiled_units(cluster.shared / "tree-one" / "build" / ".ninja_log")
    finally:
        cluster.stop()
    return two, one, compiled, units


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--heavy", type=int, default=6, help="MINITORCH_HEAVY: the fixture's memory-heavy units")
    ap.add_argument("--image", default=IMAGE, help="the image the Slurm nodes' image is made from")
    ap.add_argument("--model-only", action="store_true", help="print the on-paper table alone (no Docker)")
    ap.add_argument("--overhead", type=float, default=None, help="distcc's seconds per shipped unit for the model")
    args = ap.parse_args()
    overhead = MEASURED_OVERHEAD_S if args.overhead is None else args.overhead
    if not args.model_only:
        sets = [*args.sets, f"env.MINITORCH_HEAVY={args.heavy}"]
        two, one, compiled, units = measure(sets, args.image)
        print(f"distccd on node2 compiled {compiled} of the fixture's {units} units")
        print(f"two-node / one-node = {two / one:.2f} (the same 2 cores: overhead, not speed-up)")
        if args.overhead is None:
            overhead = max(0.0, two - one) / max(1, compiled)
            print(f"distcc overhead per shipped unit (upper bound): {overhead:.2f} s")
    print(f"\nOn paper: PyTorch 2.6's CPU build on N nodes of M cores (distcc overhead {overhead:.2f} s/unit)")
    print(format_table(paper_table(PYTORCH_26, overhead_s=overhead)))
    print("\nThe same if node1 preprocessed each unit once (ccache handing distcc its preprocessed output):")
    print(format_table(paper_table(dataclasses.replace(PYTORCH_26, preprocess_passes=1), overhead_s=overhead)))


if __name__ == "__main__":
    main()
