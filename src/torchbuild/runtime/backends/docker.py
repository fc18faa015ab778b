"""The docker backend: the step runs in a fresh container of the profile's toolchain image,
named torchbuild-<uuid>, removed on every exit, as the caller's uid:gid (or --user), with
only the declared binds mounted and HOME inside the cache."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchbuild.core.atomic import EXCHANGE
from torchbuild.core.process import nice_prefix
from torchbuild.profile.remote_cache import container_warning
from torchbuild.runtime.backends.base import Backend, Binds, container_view
from torchbuild.runtime.engine import Engine, require_image
from torchbuild.runtime.environment import allocation_env, launch_env
from torchbuild.runtime.manifest import ImageRecord


def caller_user() -> str:
    return f"{os.getuid()}:{os.getgid()}"


def make_dirs_for(user: str, *dirs: Path) -> None:
    """Create dirs the container writes to; when root runs a build as another user (--user),
    hand the new directories to that user so the build can write them."""
    uid, _, gid = user.partition(":")
    for d in dirs:
        missing = [p for p in [d, *d.parents] if not p.exists()]
        d.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and uid.isdigit() and int(uid) != 0:
            for p in missing:
                os.chown(p, int(uid), int(gid or uid))


class DockerBackend(Backend):
    name = "docker"
    stopped = "its container was removed"
    docker: Engine

    def check(self) -> dict[str, Any] | None:
        self.docker = Engine.connect()
        attrs = require_image(self.spec, self.docker, rebuild=self.options.rebuild_image, out=self.out)
        config = attrs.get("Config") or {}
        labels = config.get("Labels") or {}  # type: ignore[attr-defined]
        image_env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)  # type: ignore[attr-defined]
        self.image_library_path = image_env.get("LD_LIBRARY_PATH", "")
        record = ImageRecord.from_labels(labels, tag=self.spec.image_tag, image_id=str(attrs.get("Id")))
        warning = container_warning(self.spec.ccache_remote)
        if warning:
            print(warning, file=self.out)
        return dataclasses.asdict(record)

    def view(self, binds: Binds) -> Binds:
        return container_view(binds)

    @property
    def where(self) -> str:
        return self.spec.image_tag

    @property
    def user(self) -> str:
        return self.options.user or caller_user()

    def make_dirs(self, binds: Binds) -> None:
        """As the container's user (--user): what root creates here the build could not write."""
        make_dirs_for(self.user, binds.out / EXCHANGE, *(binds.cache / d for d in ("home", "ccache", "pip")))

    image_library_path = ""

    def _host_mpi_env(self) -> dict[str, str]:
        """The host MPI directories first on LD_LIBRARY_PATH, before the image's own entries."""
        env = self.options.host_mpi_env()
        if env and self.image_library_path:
            env["LD_LIBRARY_PATH"] += ":" + self.image_library_path
        return env

    def launch(self, step: str, request: Mapping[str, Any], binds: Binds, request_file: str) -> int:
        view = self.view(binds)
        return self.docker.run(
            self.spec.image_tag,
            # the caller's priority (nice -n 19 invoke build ...) holds in the container too
            [*nice_prefix(), "torchbuild", "inside.step", step, request_file],
            mounts={str(host): inside for host, inside in binds.mounts(view).items()},
            read_only={d: d for d in (*self.options.host_mpi, *map(str, binds.read_only))},
            user=self.user,
            environment={**launch_env(self.name, str(view.cache)), **allocation_env(), **self._host_mpi_env()},
            workdir=str(view.src or view.out),
            platform=self.spec.arch.docker_platform,
            memory_limit=self.options.memory or None,
            out=self.out,
        )
