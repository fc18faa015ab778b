"""The `torchbuild` console script: the entry point inside the toolchain image and the SIF.

On the host the same functions are reached through invoke tasks (tasks.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from . import __version__
from .config import DEFAULT_PROFILE, describe_keys, resolve
from .errors import TorchbuildError, debug_enabled, report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchbuild",
        description="Reproducible PyTorch source builds. On a host, use `invoke --list` for every task.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"torchbuild {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command")
    c = sub.add_parser("config", help="print the resolved profile and the environment the build sees")
    c.add_argument("--profile", default=None, help="profile name or .yaml (default: $TORCHBUILD_PROFILE, else cpu)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument("--arch", default=None)
    c.add_argument("--format", choices=["text", "json"], default="text")
    c.add_argument("--keys", action="store_true", help="list every profile key with its doc")
    sub.add_parser("doctor", help="report what this host can do")
    w = sub.add_parser(
        "build",
        help="fetch/patch the tree (default /src) and build a wheel or --preflight here (in the image or SIF)",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument(
        "--profile", default=None, help="profile name or .yaml (default: $TORCHBUILD_PROFILE, the baked one)"
    )
    w.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    w.add_argument("--source", default=None, help="tree, tarball, .dsc or git URL (default: /src)")
    w.add_argument("--ref", default="", help="git ref when --source is a URL")
    w.add_argument("--out", default=None, help="wheel, manifest and logs (default: /out if bound, else ./out)")
    w.add_argument("--cache", default=None, help="ccache and pip cache (default: /cache if bound, else cache_dir)")
    w.add_argument("--preflight", action="store_true", help="configure and build only preflight targets + canaries")
    w.add_argument("--target", action="append", default=[], help="preflight CMake target (repeatable)")
    w.add_argument("--canary", action="append", default=[], help="preflight canary source file (repeatable)")
    w.add_argument("--clean", action="store_true", help="remove the tree's build/ directory first")
    w.add_argument("--jobs", type=int, default=0, help="parallel compile jobs (default: planned)")
    w.add_argument("--no-verify", action="store_true", help="skip verifying the wheel after the build")
    w.add_argument("--progress", choices=["auto", "bar", "lines", "raw"], default="auto", help="build output")
    v = sub.add_parser("verify-inside", help="run a verify request written by `invoke verify` (used in the image)")
    v.add_argument("request", help="path to the request JSON")
    s = sub.add_parser("sif-labels", help=argparse.SUPPRESS)
    s.add_argument("sif")
    b = sub.add_parser("build-inside", help="run a build request written by `invoke build` (used in the container)")
    b.add_argument("request", help="path to the request JSON")
    return p


EPILOG = """inside a SIF (the runscript is this CLI), bind the tree, the cache and optionally the output:
  apptainer run --bind SRC:/src,CACHE:/cache[,OUT:/out] [--nv] torch-build.sif build --preflight
  /src    the PyTorch tree, read-write (patched in place; build/ is written there)
  /cache  ccache and pip cache: keep it between runs
  /out    wheel, manifest and logs (default ./out in the current directory)
  --nv    on GPU nodes, brings the NVIDIA driver into the SIF
`apptainer run-help torch-build.sif` shows the SIF's profile."""


def _profile(given: str | None) -> str:
    """--profile, else the profile baked into the image or SIF ($TORCHBUILD_PROFILE), else the default."""
    return given or os.environ.get("TORCHBUILD_PROFILE") or DEFAULT_PROFILE


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


def _build_here(args: argparse.Namespace) -> int:
    """`torchbuild build`: the build in this process, with the container binds as defaults."""
    from pathlib import Path

    from .errors import SourceError
    from .runner import build_native, prepare
    from .sif import inside_sif

    spec = resolve(_profile(args.profile), args.overrides)
    source = args.source
    if source is None:
        if not Path("/src/setup.py").is_file():
            raise SourceError(
                "no PyTorch tree at /src",
                hint="bind one (apptainer run --bind /path/to/pytorch:/src ...) or pass --source",
            )
        source = "/src"
    out_dir = Path(args.out or ("/out" if _writable_dir("/out") else "out")).resolve()
    cache = Path(args.cache or ("/cache" if _writable_dir("/cache") else spec.cache_dir)).expanduser()
    req = prepare(
        spec,
        source=source,
        ref=args.ref,
        out_dir=out_dir,
        cache_root=cache,
        preflight=args.preflight,
        clean=args.clean,
        jobs=args.jobs,
        targets=tuple(args.target),
        canaries=tuple(args.canary),
        progress=args.progress,
    )
    sif = inside_sif()
    outcome = build_native(req, engine="apptainer" if sif else "native", image=sif)
    print(f"{outcome.wheel or 'preflight passed'}\nmanifest: {outcome.manifest}\nlog: {outcome.log}")
    if outcome.wheel and not args.no_verify:
        from .verify import verify_in

        verify_in("native", spec, wheel=outcome.wheel)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "config":
            from .render import config_data, config_text

            if args.keys:
                print(describe_keys())
                return 0
            spec = resolve(_profile(args.profile), args.overrides, arch=args.arch)
            print(json.dumps(config_data(spec), indent=2) if args.format == "json" else config_text(spec))
            return 0
        if args.command == "doctor":
            from pathlib import Path

            from .doctor import render, run_checks

            print(render(*run_checks(Path.home() / ".cache" / "torchbuild")))
            return 0
        if args.command == "build":
            return _build_here(args)
        if args.command == "verify-inside":
            from .verify import main_inside as verify_main

            return verify_main(args.request)
        if args.command == "sif-labels":
            from .sif import sif_labels_main

            return sif_labels_main(args.sif)
        if args.command == "build-inside":
            from .build import main_inside

            return main_inside(args.request)
        _parser().print_help()
        return 0
    except TorchbuildError as err:
        if args.debug or debug_enabled():
            raise
        return report(err)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
