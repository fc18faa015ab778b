"""The two routes to a toolchain SIF, timed from nothing cached: `invoke image --rebuild` then
`invoke sif --rebuild` (Docker, then conversion) against `invoke sif --from-recipe --rebuild`
(Apptainer alone). Prints both routes' seconds, both SIFs' sizes and the ratios from one run.

Usage: python benchmarks/sif_routes.py [--profile P] [--set key=value ...] [--apptainer auto|host|docker]
The recipe route uses the profile's sif_bootstrap (pass --set sif_bootstrap=debootstrap where
there is no registry). Both routes install their packages from the network (apt, pip), with
no Docker layer cache (--rebuild) and no Apptainer cache (private to each build), and use the
same Apptainer (this host's, or the apptainer-builder container) and the default compression.
Needs a Docker engine for the first route (the second does not use it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torchbuild.tasks  # noqa: E402, F401  (hands the runtime its slots: locate's apptainer-builder image)
from torchbuild.image.host import build_image  # noqa: E402
from torchbuild.profile.config import cache_dir, resolve  # noqa: E402
from torchbuild.runtime.apptainer import locate  # noqa: E402
from torchbuild.runtime.engine import Engine  # noqa: E402
from torchbuild.sif.host import build_sif, remove_tree  # noqa: E402
from torchbuild.sif.recipe import bootstrap_for, build_from_recipe  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--apptainer", default="auto")
    args = ap.parse_args()
    spec = resolve(args.profile, args.sets)
    engine = Engine.connect()
    apptainer = locate(spec, args.apptainer, engine=lambda: engine)
    work = cache_dir(spec).resolve() / "apptainer" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(dir=work))
    try:
        with open(tmpdir / "output.log", "w") as sink:
            t0 = time.monotonic()
            build_image(spec, engine, logs_dir=tmpdir, rebuild=True, out=sink)
            image_seconds = time.monotonic() - t0
            converted = build_sif(spec, engine, apptainer, tmpdir / "converted", rebuild=True, out=sink)
            recipe = build_from_recipe(spec, apptainer, tmpdir / "recipe", rebuild=True, out=sink)
    except BaseException:
        print((tmpdir / "output.log").read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        remove_tree(tmpdir)
    first = image_seconds + converted.seconds
    print(f"profile {spec.profile} ({spec.arch}), base {spec.base_image}; {apptainer.description}")
    print(
        f"image + conversion: {first:.1f} s (invoke image {image_seconds:.1f} s, invoke sif {converted.seconds:.1f} s), "
        f"SIF {converted.size / 2**20:.0f} MiB ({converted.compression}), image {converted.image_size / 2**20:.0f} MiB"
    )
    print(
        f"recipe:             {recipe.seconds:.1f} s ({bootstrap_for(spec)}), "
        f"SIF {recipe.size / 2**20:.0f} MiB ({recipe.compression})"
    )
    print(f"time ratio (recipe / image + conversion) = {recipe.seconds / first:.2f}")
    print(f"size ratio (recipe SIF / converted SIF) = {recipe.size / converted.size:.3f}")


if __name__ == "__main__":
    main()
