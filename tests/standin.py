"""A stand-in site node for the rehearsals (tests/slow): an image made from a fixture directory
on the bookworm base, and one running container of it whose commands run in a login shell
(the site's profile.d: Lmod and its MODULEPATH) as the site's user."""

from __future__ import annotations

import time
from pathlib import Path

from helpers import REPO

from torchbuild.core.arch import Arch
from torchbuild.image.baseimage import make_base_image


def build_standin(engine, test_cache: Path, fixture: Path, tag: str) -> str:
    """The stand-in image tag, built from fixture (a Dockerfile taking ARG BASE) on the bookworm
    base (made here if missing)."""
    base, _ = make_base_image(
        engine, suite="bookworm", arch=Arch.X86_64, work_dir=test_cache / "rootfs", ignore_valid_until=True
    )
    t0 = time.monotonic()
    engine.client.images.build(path=str(fixture), tag=tag, buildargs={"BASE": base}, rm=True, forcerm=True)
    print(f"stand-in image: {time.monotonic() - t0:.0f} s")
    return tag


class StandinNode:
    """One running stand-in container; commands run in a login shell as user."""

    def __init__(self, engine, image: str, mounts: dict[str, tuple[str, str]], env: dict[str, str], user: str) -> None:
        self.env, self.user = env, user
        volumes = {host: {"bind": inside, "mode": mode} for host, (inside, mode) in mounts.items()}
        self.container = engine.client.containers.run(
            image, ["sleep", "infinity"], volumes=volumes, detach=True, user="0", network_mode="bridge"
        )

    def sh(self, script: str, timeout_note: str = "") -> str:
        """bash -l as the site's user; fails the test on a non-zero exit with the output's tail."""
        rc, output = self.container.exec_run(
            ["bash", "-lc", f"set -eo pipefail\n{script}"], user=self.user, workdir=str(REPO), environment=self.env
        )
        text = output.decode(errors="replace")
        assert rc == 0, f"{timeout_note}exit {rc}:\n{text[-6000:]}"
        return text

    def stop(self) -> None:
        self.container.remove(force=True)
