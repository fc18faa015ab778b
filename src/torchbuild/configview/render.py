"""Text and JSON views of a resolved profile (shared by `invoke config` and `torchbuild config`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchbuild.builder.host import derived_refs
from torchbuild.core import console
from torchbuild.profile.config import BuildSpec, cache_dir, derived
from torchbuild.runtime.environment import build_env, format_env
from torchbuild.runtime.jobs import HostResources, plan_for

CONTAINER_CACHE = "/cache"


def config_data(spec: BuildSpec, host: HostResources | None = None, backend: str = "native") -> dict[str, Any]:
    """The resolved profile and the environment a build on `backend` sees (the cache at /cache
    in the image or SIF, at cache_dir natively)."""
    host = host or HostResources.detect()
    cache = cache_dir(spec)
    plan = plan_for(spec, host, cache)
    cache_root = str(cache) if backend == "native" else CONTAINER_CACHE
    env = build_env(
        spec, cache_root=cache_root, jobs=plan.jobs, nvcc_threads=plan.nvcc_threads or None, backend=backend
    )
    return {
        "backend": backend,
        "profile": spec.profile,
        "profile_file": spec.origins.get("profile", ""),
        "hash": spec.hash,
        "image": spec.image_tag,
        "build_version": spec.build_version,
        "values": spec.to_dict(),
        "origins": dict(spec.origins),
        # what the build uses where a key is left empty, and what it is derived from
        "derived": {
            key: {"value": value, "from": source}
            for key, (value, source) in {**derived(spec), **derived_refs(spec)}.items()
        },
        "jobs_reason": plan.reason,
        "env": env,
    }


def config_text(
    spec: BuildSpec, host: HostResources | None = None, backend: str = "native", header: Sequence[str] = ()
) -> str:
    """The resolved profile, the build's environment and the derived values; header: more `# ...`
    lines after the profile's own (the task's word on whether a build is needed at all)."""
    data = config_data(spec, host, backend)
    values: dict[str, Any] = data["values"]
    origins: dict[str, str] = data["origins"]
    rows = [(k, json.dumps(v), _short_origin(origins.get(k, ""))) for k, v in values.items() if k != "profile"]
    lines = [
        f"# profile {spec.profile} ({data['profile_file']})",
        *([f"# {spec.description}"] if spec.description else []),
        f"# sha256 {data['hash']}",
        f"# image {data['image']}, wheel version {data['build_version']}",
        *header,
        console.table(("key", "value", "set in"), rows),
        "",
        f"# environment the build sees on {backend} (MAX_JOBS {data['jobs_reason']}; replanned where the build runs)",
        format_env(data["env"]),
        *_derived_lines(data["derived"]),
    ]
    # values as written, no terminal escape sequences, no credentials of a URL
    return console.printable(console.redact("\n".join(lines)))


def _derived_lines(values: dict[str, dict[str, str]]) -> list[str]:
    """The derived values as a table of their own, after the environment (none: no lines)."""
    if not values:
        return []
    rows = [(key, json.dumps(v["value"]), f"derived: {v['from']}") for key, v in values.items()]
    return ["", "# derived: what the build uses for keys left empty", console.table(("key", "value", "set in"), rows)]


def _short_origin(origin: str) -> str:
    """'/long/path/configs/profiles/gh200.yaml:12' -> 'gh200.yaml:12'."""
    return Path(origin).name if "/" in origin else origin
