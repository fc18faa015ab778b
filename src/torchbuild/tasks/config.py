"""invoke config: show the resolved profile and the build environment."""

from __future__ import annotations

import json

from invoke.context import Context
from invoke.tasks import task

from ..config import DEFAULT_PROFILE, available_profiles, describe_keys
from ..render import config_data, config_text
from .common import HELP, handles_errors, spec_from


@task(
    help={
        **HELP,
        "format": "text (default) or json",
        "keys": "list every profile key with type, default and doc",
        "list_profiles": "list the shipped profiles",
    },
    iterable=["set_"],
)
@handles_errors
def config(
    c: Context,
    profile: str = DEFAULT_PROFILE,
    set_: list[str] | None = None,
    arch: str = "",
    format: str = "text",
    keys: bool = False,
    list_profiles: bool = False,
) -> None:
    """Print the resolved profile (with where each value came from) and the build's environment."""
    if keys:
        print(describe_keys())
        return
    if list_profiles:
        print("\n".join(available_profiles()))
        return
    spec = spec_from(profile, set_, arch)
    print(json.dumps(config_data(spec), indent=2) if format == "json" else config_text(spec))
