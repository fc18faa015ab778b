"""invoke config: show the resolved profile and the build environment."""

from __future__ import annotations

import json

from invoke.context import Context

from torchbuild.configview import need_build
from torchbuild.configview.render import config_data, config_text
from torchbuild.core.console import redact, table
from torchbuild.core.errors import TorchbuildError, UsageError
from torchbuild.profile.config import BuildSpec, available_profiles, describe_keys, resolve
from torchbuild.runtime.backends import ENGINE_HELP, engine_for
from torchbuild.runtime.tasks import HELP, handles_errors, spec_from, task


@task(
    help={
        **HELP,
        "format": "text (default) or json",
        "keys": "list every profile key with type, default and doc",
        "list_profiles": "list the shipped profiles with their descriptions, arch and batch system",
        "in_container": "show the environment of a build in a container: short for --engine docker",
        "engine": f"the environment of a build where: {ENGINE_HELP}; default native",
    },
    iterable=["set_"],
)
@handles_errors
def config(
    c: Context,
    profile: str = "",
    set_: list[str] | None = None,
    arch: str = "",
    format: str = "text",
    keys: bool = False,
    list_profiles: bool = False,
    in_container: bool = False,
    engine: str = "",
) -> None:
    """Print the resolved profile (with where each value came from) and the build's environment."""
    if keys:
        print(describe_keys())
        return
    if list_profiles:
        print(profiles_table())
        return
    if format not in ("text", "json"):
        raise UsageError(f"unknown --format {format!r}", hint="use --format text or --format json")
    backend = engine_for(engine, in_container)
    spec = spec_from(profile, set_, arch)
    data = config_data(spec, backend=backend)
    if format == "json":
        print(redact(json.dumps(data, indent=2)))
    else:
        print(config_text(spec, backend=backend, header=[need_build_line(spec)]))


def need_build_line(spec: BuildSpec) -> str:
    """One line: whether the profile needs a source build at all (`invoke doctor --profile P` says why)."""
    try:
        said = need_build.assess(spec).summary
    except TorchbuildError as exc:
        said = f"cannot tell: {exc.message}"
    except OSError as exc:  # a patch of the series that cannot be read
        said = f"cannot tell: {exc}"
    return f"# source build needed? {said} (`invoke doctor --profile {spec.profile}` says why)"


def profiles_table() -> str:
    """Every shipped profile: name, arch, CUDA, scheduler (with partition), description."""
    rows = []
    for name in available_profiles():
        spec = resolve(name)
        where = spec.scheduler + (f" ({spec.partition})" if spec.partition else "")
        rows.append((name, spec.arch.value, spec.cuda_version or "-", where, spec.description))
    return table(["profile", "arch", "CUDA", "batch jobs", "description"], rows)
