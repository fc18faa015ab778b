"""Shared pieces of the invoke tasks: the error handler and the common options' help."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from invoke.exceptions import Exit

from ..config import DEFAULT_PROFILE, BuildSpec, resolve
from ..errors import TorchbuildError, debug_enabled, report

F = TypeVar("F", bound=Callable[..., Any])

HELP = {
    "profile": f"profile name (configs/profiles) or path to a .yaml file; default {DEFAULT_PROFILE}",
    "set_": "override a profile key: --set key=value (repeatable; maps: --set switches.USE_MPI=1)",
    "arch": "target architecture: x86_64 or aarch64 (default: the profile's, else this host's); image takes all",
}


def handles_errors(fn: F) -> F:
    """Print named errors as `error:` + `hint:` and exit with their code (traceback with --debug)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TorchbuildError as err:
            if debug_enabled():
                raise
            raise Exit(code=report(err)) from None

    return wrapper  # type: ignore[return-value]


def spec_from(profile: str, set_: list[str] | None, arch: str | None) -> BuildSpec:
    return resolve(profile or DEFAULT_PROFILE, set_ or [], arch=arch or None)
