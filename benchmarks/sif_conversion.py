"""Time `invoke sif` against a plain `docker save` + `apptainer build out.sif docker-archive://image.tar`
of the same image, and compare the two SIFs' sizes. Prints both routes' seconds, both sizes and
the ratios from one run.

Usage: python benchmarks/sif_conversion.py [--profile P] [--set key=value ...] [--apptainer auto|host|docker]
                                           [--compression ALGORITHM[:LEVEL]]
The profile's toolchain image must exist (`invoke image` with the same --set). Both
conversions use the same Apptainer (this host's, or the apptainer-builder container) and an
Apptainer cache and temp dir of their own that start empty, on the same file system (torchbuild's
are private to each conversion; the plain one gets fresh ones, removed afterwards, so no blob
cached by an earlier run helps it and none is left behind). The plain route includes its own
`docker save`, as torchbuild's includes writing its OCI layout.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torchbuild.tasks  # noqa: E402, F401  (hands the runtime its slots: locate's apptainer-builder image)
from torchbuild.image.host import require_image  # noqa: E402
from torchbuild.profile.config import cache_dir, resolve  # noqa: E402
from torchbuild.runtime.apptainer import locate  # noqa: E402
from torchbuild.runtime.engine import Engine  # noqa: E402
from torchbuild.sif.host import APPTAINER_DEFAULT_COMPRESSION, build_sif  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--apptainer", default="auto")
    ap.add_argument("--compression", default="", help="invoke sif --compression (default: its default)")
    args = ap.parse_args()
    spec = resolve(args.profile, args.sets, arch=args.arch)
    engine = Engine.connect()
    apptainer = locate(spec, args.apptainer, engine=lambda: engine)
    image_size = int(require_image(spec, engine)["Size"])  # type: ignore[call-overload]
    root = cache_dir(spec).resolve() / "apptainer"
    work = root / "bench"
    work.mkdir(parents=True, exist_ok=True)
    version = io.StringIO()
    apptainer.call(["--version"], out=version)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        tmpdir = Path(tmp)
        sink = open(tmpdir / "output.log", "w")  # noqa: SIM115 - closed below
        try:
            result = build_sif(
                spec, engine, apptainer, tmpdir / "tool", rebuild=True, compression=args.compression, out=sink
            )
            t0 = time.monotonic()
            engine.save(spec.image_tag, tmpdir / "image.tar")
            saved = time.monotonic() - t0
            env = {"APPTAINER_CACHEDIR": str(tmpdir / "cachedir"), "APPTAINER_TMPDIR": str(tmpdir / "tmp")}
            for d in env.values():
                Path(d).mkdir()
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
        plain_total, plain_size = saved + built, plain.stat().st_size
        print(
            f"image {spec.image_tag}: {image_size / 2**20:.0f} MiB; {version.getvalue().strip()}, {apptainer.description}"
        )
        print(
            f"invoke sif: {result.seconds:.1f} s (OCI layout {result.save_seconds:.1f} s, "
            f"apptainer build {result.build_seconds:.1f} s), squashfs {result.compression}"
        )
        print(
            f"plain:      {plain_total:.1f} s (docker save {saved:.1f} s, apptainer build {built:.1f} s), "
            f"squashfs {APPTAINER_DEFAULT_COMPRESSION} (Apptainer's default)"
        )
        print(f"conversion time ratio (invoke sif / plain) = {result.seconds / plain_total:.2f}")
        print(f"SIF size {result.size / 2**20:.0f} MiB; SIF / image = {result.size / image_size:.2f}")
        print(f"plain SIF size {plain_size / 2**20:.0f} MiB; SIF / plain SIF = {result.size / plain_size:.3f}")
        shutil.rmtree(tmpdir / "tool", ignore_errors=True)


if __name__ == "__main__":
    main()
