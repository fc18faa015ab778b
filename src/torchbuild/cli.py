"""The `torchbuild` console script: the entry point inside the toolchain image and the SIF.

On the host the same functions are reached through invoke tasks (tasks.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from . import __version__
from .config import DEFAULT_PROFILE, describe_keys, resolve
from .errors import TorchbuildError, debug_enabled, report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchbuild",
        description="Reproducible PyTorch source builds. On a host, use `invoke --list` for every task.",
    )
    p.add_argument("--version", action="version", version=f"torchbuild {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command")
    c = sub.add_parser("config", help="print the resolved profile and the environment the build sees")
    c.add_argument("--profile", default=DEFAULT_PROFILE, help="profile name or path to a .yaml file")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument("--arch", default=None)
    c.add_argument("--format", choices=["text", "json"], default="text")
    c.add_argument("--keys", action="store_true", help="list every profile key with its doc")
    sub.add_parser("doctor", help="report what this host can do")
    b = sub.add_parser("build-inside", help="run a build request written by `invoke build` (used in the container)")
    b.add_argument("request", help="path to the request JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "config":
            from .render import config_data, config_text

            if args.keys:
                print(describe_keys())
                return 0
            spec = resolve(args.profile, args.overrides, arch=args.arch)
            print(json.dumps(config_data(spec), indent=2) if args.format == "json" else config_text(spec))
            return 0
        if args.command == "doctor":
            from pathlib import Path

            from .doctor import render, run_checks

            print(render(*run_checks(Path.home() / ".cache" / "torchbuild")))
            return 0
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
