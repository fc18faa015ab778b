"""invoke config: show the resolved profile and the build environment."""

from __future__ import annotations

import dataclasses
import json

from invoke.context import Context

from torchbuild.configview import need_build
from torchbuild.configview.render import config_data, config_text
from torchbuild.core.console import redact, table
from torchbuild.core.errors import TorchbuildError, UsageError
from torchbuild.core.options import like, option
from torchbuild.profile.config import BuildSpec, available_profiles, describe_keys, resolve
from torchbuild.runtime.backends import ENGINE_HELP, engine_for
from torchbuild.runtime.options import LaunchOptions, ProfileChoice
from torchbuild.runtime.tasks import options_task


@dataclasses.dataclass(frozen=True)
class ConfigView:
    """What `invoke config` shows: the profile (its format), every key, the shipped profiles, or the
    environment of a build where (--in-container and --engine: LaunchOptions' options)."""

    format: str = option("text", "text (default) or json")
    keys: bool = option(False, "list every profile key with type, default and doc")
    list_profiles: bool = option(False, "list the shipped profiles with their descriptions, arch and batch system")
    in_container: bool = like(LaunchOptions, "in_container")
    engine: str = like(LaunchOptions, "engine")


@options_task(
    models={"choice": ProfileChoice, "view": ConfigView},
    # a real difference, not a second declaration: config shows the environment a build would
    # have there, it runs nothing, so these two say so instead of LaunchOptions' help
    help={
        "in_container": "show the environment of a build in a container: short for --engine docker",
        "engine": f"the environment of a build where: {ENGINE_HELP}; default native",
    },
)
def config(c: Context, choice: ProfileChoice, view: ConfigView) -> None:
    """Print the resolved profile (with where each value came from) and the build's environment."""
    if view.keys:
        print(describe_keys())
        return
    if view.list_profiles:
        print(profiles_table())
        return
    if view.format not in ("text", "json"):
        raise UsageError(f"unknown --format {view.format!r}", hint="use --format text or --format json")
    backend = engine_for(view.engine, view.in_container)
    spec = choice.spec()
    data = config_data(spec, backend=backend)
    if view.format == "json":
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
