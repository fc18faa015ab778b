"""Time `invoke sif` against a plain `apptainer build out.sif docker-archive://image.tar` of the
same image, and the SIF's size against the image's. Prints ratios from one run.

Usage: python benchmarks/sif_conversion.py [--profile P] [--set key=value ...] [--apptainer auto|host|docker]
The profile's toolchain image must exist (`invoke image` with the same --set). Both
conversions use the same Apptainer (this host's, or the apptainer-builder container) and
use the same cache and temp directories; the plain one includes its own `docker save`, as
torchbuild's does.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from torchbuild.config import cache_dir, resolve  # noqa: E402
from torchbuild.engine import Engine  # noqa: E402
from torchbuild.image import require_image  # noqa: E402
from torchbuild.sif import build_sif, locate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--apptainer", default="auto")
    args = ap.parse_args()
    spec = resolve(args.profile, args.sets, arch=args.arch)
    engine = Engine.connect()
    apptainer = locate(spec, args.apptainer, engine=lambda: engine)
    image_size = int(require_image(spec, engine)["Size"])  # type: ignore[call-overload]
    work = cache_dir(spec).resolve() / "apptainer" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        tmpdir = Path(tmp)
        sink = open(tmpdir / "output.log", "w")  # noqa: SIM115 - closed below
        try:
            result = build_sif(spec, engine, apptainer, tmpdir / "tool", rebuild=True, out=sink)
            t0 = time.monotonic()
            engine.save(spec.image_tag, tmpdir / "image.tar")
            saved = time.monotonic() - t0
            # the same cache and temp dirs torchbuild used, so nothing favours torchbuild's run
            root = cache_dir(spec).resolve() / "apptainer"
            env = {"APPTAINER_CACHEDIR": str(root / "cachedir"), "APPTAINER_TMPDIR": str(root / "tmpdir")}
            plain = tmpdir / "plain.sif"
            t1 = time.monotonic()
            rc = apptainer.call(
                ["build", str(plain), f"docker-archive://{tmpdir / 'image.tar'}"], env=env, paths=[root], out=sink
            )
            built = time.monotonic() - t1
        finally:
            sink.close()
        if rc != 0 or not plain.is_file():
            sys.exit(f"plain apptainer build failed ({rc}):\n{(tmpdir / 'output.log').read_text()[-3000:]}")
        plain_total = saved + built
        print(f"image {spec.image_tag}: {image_size / 2**20:.0f} MiB; apptainer: {apptainer.description}")
        print(
            f"invoke sif: {result.seconds:.1f} s (docker save {result.save_seconds:.1f} s, "
            f"apptainer build {result.build_seconds:.1f} s)"
        )
        print(f"plain:      {plain_total:.1f} s (docker save {saved:.1f} s, apptainer build {built:.1f} s)")
        print(f"conversion time ratio (invoke sif / plain) = {result.seconds / plain_total:.2f}")
        print(f"SIF size {result.size / 2**20:.0f} MiB; SIF / image = {result.size / image_size:.2f}")
        print(
            f"plain SIF size {plain.stat().st_size / 2**20:.0f} MiB; SIF / plain SIF = {result.size / plain.stat().st_size:.3f}"
        )
        shutil.rmtree(tmpdir / "tool", ignore_errors=True)


if __name__ == "__main__":
    main()
