"""A compile cache shared by two "nodes": time the first node's build (cold: nothing in the
storage) and the second's (its own empty local cache, everything in the shared storage), and
print second / first (goal: <= 0.1) with the ccache counters both manifests record.

Usage: python benchmarks/shared_cache.py [--set key=value ...] [--heavy 12] [--light 80]
Starts Debian's redis-server (the image tests/integration/test_shared_cache.py builds from the
local trixie base: torchbuild-test/redis:trixie, built here too if missing) in a container on a
Docker network it creates, its port published on that network's gateway address only; the
two nodes are two fresh copies of tests/fixtures/minitorch with two local cache directories,
each built natively (`invoke build`, the host's g++, cmake, ninja and ccache >= 4.7 with
redis-storage) with the profile's ccache_remote pointing at the redis. The container and the
network are removed at the end, also on Ctrl-C or a failure.

The fixture's own light kernels compile in well under a second each, so configure, packaging and
verify would dominate and the ratio would measure them, not the cache. The fixture has three
knobs that reach CMake from the environment: MINITORCH_HEAVY=N adds N memory-heavy units
(each a 2,000-entry std::map initializer at -O2: about 4.5 s and 0.8 GB in cc1plus) and
MINITORCH_SLOW_SECONDS a sleep that no cache can skip; MINITORCH_LIGHT=N adds N light units
with real work (each a 300-entry map: about 1.2 s and 0.12 GB). This uses 12 heavy and 80 light
units by default, PyTorch's mix of many light units and a few heavy ones (a few minutes of
compiles on two cores). Wheel
verification is left out of both builds (--no-verify): it is the same on both nodes and no
compile. The ratio is still bounded by what every build does besides compiling (the build
venv check, CMake's configure, the links, the wheel), which a real PyTorch build's ~1,500
units dwarf. The second node's one miss is CMake's compiler check (CMakeCXXCompilerABI.cpp,
compiled in a fresh scratch directory by every configure), not one of the fixture's units.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import bridge_gateway  # noqa: E402

from torchbuild.runtime.engine import Engine  # noqa: E402

REDIS_IMAGE = "torchbuild-test/redis:trixie"
REDIS_DOCKERFILE = """FROM {base}
RUN apt-get -o Acquire::Check-Valid-Until=false update \\
 && apt-get install -y --no-install-recommends redis-server \\
 && rm -rf /var/lib/apt/lists/*
"""
BASE = "torchbuild/base:trixie-x86_64"


def redis_image(client: Any) -> str:
    """The redis-server image the integration test uses (built from the local trixie base if missing)."""
    if not client.images.list(name=REDIS_IMAGE):
        if not client.images.list(name=BASE):
            sys.exit(f"needs {BASE} (made by `nox -s integration` or `invoke image --profile cpu`)")
        dockerfile = io.BytesIO(REDIS_DOCKERFILE.format(base=BASE).encode())
        client.images.build(fileobj=dockerfile, tag=REDIS_IMAGE, rm=True, forcerm=True)
    return REDIS_IMAGE


@contextlib.contextmanager
def redis(client: Any) -> Iterator[str]:
    """redis://<gateway>:<port> of a redis-server on a network made for it; both removed afterwards."""
    image = redis_image(client)
    network = client.networks.create(f"tb-bench-cache-{uuid.uuid4().hex[:8]}", driver="bridge")
    container = None
    try:
        network.reload()
        gateway = bridge_gateway(network.attrs)
        container = client.containers.run(
            image,
            ["redis-server", "--protected-mode", "no", "--save", "", "--appendonly", "no"],
            detach=True,
            network=network.name,
            ports={"6379/tcp": (gateway, None)},
            labels={"org.torchbuild.benchmark": "shared-cache"},
        )
        container.reload()
        port = container.attrs["NetworkSettings"]["Ports"]["6379/tcp"][0]["HostPort"]
        yield f"redis://{gateway}:{port}"
    finally:
        if container is not None:
            with contextlib.suppress(Exception):
                container.remove(force=True)
        with contextlib.suppress(Exception):
            network.remove()


def build(work: Path, name: str, sets: list[str]) -> tuple[float, dict[str, Any]]:
    """One node's native build of a fresh fixture copy with its own local cache: (seconds, manifest)."""
    tree, out, cache = work / name / "minitorch", work / name / "out", work / name / "cache"
    shutil.copytree(
        ROOT / "tests" / "fixtures" / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py")
    )
    cmd = [
        sys.executable, "-m", "invoke", "build", "--source", str(tree), "--out", str(out), "--no-verify",
        *[a for s in [*sets, f"cache_dir={cache}"] for a in ("--set", s)],
    ]  # fmt: skip
    start = time.monotonic()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    if res.returncode != 0:
        sys.exit(f"{name}: the build failed (exit {res.returncode}):\n{res.stdout[-3000:]}{res.stderr}")
    if "remote compile cache (ccache_remote) failed" in res.stdout:
        sys.exit(f"{name}: the shared storage failed during the build:\n{res.stdout[-2000:]}")
    (manifest,) = out.glob("*.manifest.json")
    return took, json.loads(manifest.read_text())


def counters(manifest: dict[str, Any]) -> str:
    """The manifest's build-step time and ccache counters, as the report line shows them."""
    c = manifest["ccache"]
    r = c["remote"]
    counts = f"local hits {r['local_hits']}, remote hits {r['remote_hits']}, misses {c['misses']}"
    return f"build step {manifest['duration_s']:.1f} s; {counts}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--heavy", type=int, default=12, help="MINITORCH_HEAVY: the fixture's memory-heavy units")
    ap.add_argument("--light", type=int, default=80, help="MINITORCH_LIGHT: light units with real work (~1.2 s each)")
    args = ap.parse_args()
    missing = [t for t in ("g++", "cmake", "ninja", "ccache") if not shutil.which(t)]
    if missing:
        sys.exit(f"native builds need {', '.join(missing)} on PATH")
    client = Engine.connect().client
    with tempfile.TemporaryDirectory(prefix="tb-cache-bench-") as tmp, redis(client) as url:
        sets = [
            *args.sets,
            "patches=none",
            f"env.MINITORCH_HEAVY={args.heavy}",
            f"env.MINITORCH_LIGHT={args.light}",
            f"ccache_remote={url}",
        ]
        print(f"shared storage: {url} (redis-server in a container on its own network)", flush=True)
        first, a = build(Path(tmp), "node-a", sets)
        print(f"first node (cold):            {first:6.1f} s  ({counters(a)})", flush=True)
        second, b = build(Path(tmp), "node-b", sets)
        print(f"second node (shared storage): {second:6.1f} s  ({counters(b)})", flush=True)
    ratio = second / first
    print(f"second / first = {ratio:.2f} ({'within' if ratio <= 0.1 else 'OVER'} 0.1)")
    sys.exit(0 if ratio <= 0.1 else 1)


if __name__ == "__main__":
    main()
