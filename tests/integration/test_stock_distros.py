"""The README's two commands on stock Debian 12, Debian 13 and Ubuntu 24.04 (issue 40).

Each distribution is a container of what a server install has: debootstrap's minbase with
python3, ca-certificates and sudo (the README's second command starts with sudo), and this
host's locally added CAs as a site with a TLS-inspecting proxy has them; no python3-venv, no pip.
Its system Python refuses `pip install` (PEP 668) and cannot make a venv with pip (Debian and
Ubuntu ship ensurepip in python3.X-venv). The checkout is copied in (the working tree's tracked
and untracked, not ignored, files: what a clone holds) and the commands are read from README.md
at run time, never copied here:

- as a user, ./tb stops with one line naming `sudo apt-get install python3.X-venv`;
- the first command, as root with the host's engine socket: ./tb installs python3.X-venv, makes
  .venv, installs torchbuild and reaches the image build, which stops at pulling the profile's
  base (no registry here) with ImageBuildFailed; a second ./tb is instant; `./tb TASK --help`
  exits 0 for every task `./tb --list` names;
- the second command (`sudo bash .ci/run`, given nox's `--list`) cannot run its system part in
  an unprivileged container: its first step mounts binfmt_misc, which needs CAP_SYS_ADMIN and is
  the host kernel's table (and the engine it then needs is the host's, whose images .ci/run
  prunes). The test runs it up to that edge, then runs what .ci/run ends with, `./tb nox "$@"`,
  as `./tb nox --list`;
- afterwards the system Python has nothing installed: no pip, no torchbuild, invoke or nox.

The stock images are made once and kept (torchbuild-test/stock:<suite>, label
org.torchbuild.test=stock-distro, rebuilt when their recipe changes). Each test prints its
phases' times (`pytest -s`).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO, SUITE
from image_builds import BUILDS

from torchbuild.core.arch import Arch
from torchbuild.core.errors import ImageBuildFailed
from torchbuild.image.baseimage import DEFAULT_COMPONENTS, make_base_image
from torchbuild.profile.config import DEFAULT_PROFILE, resolve
from torchbuild.runtime.engine import Engine

pytestmark = pytest.mark.docker

STOCK_REPO = "torchbuild-test/stock"
LABEL = "org.torchbuild.test"
CHECKOUT = "/srv/torchbuild"  # where the newcomer's clone is, in the container
USER_CHECKOUT = "/tmp/user-checkout"  # a copy owned by the unprivileged user
USER = "65534:65534"  # nobody
SOCKET = "/var/run/docker.sock"


@dataclass(frozen=True)
class Distro:
    suite: str
    python: str  # its python3's major.minor
    mirror: str | None = None
    components: tuple[str, ...] = DEFAULT_COMPONENTS


DISTROS = [
    Distro("bookworm", "3.11"),
    Distro("trixie", "3.13"),
    # a server install's sources have universe (docker.io, slurm-wlm: .ci/run's packages)
    Distro("noble", "3.12", "http://archive.ubuntu.com/ubuntu", ("main", "universe")),
]

# the stock layer over debootstrap's minbase; 99torchbuild is the base-image code's apt setting
# for snapshot mirrors, which a stock system does not have
STOCK_DOCKERFILE = """FROM {base}
COPY certs/ /usr/local/share/ca-certificates/
RUN rm -f /etc/apt/apt.conf.d/99torchbuild \\
 && apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y python3 ca-certificates sudo \\
 && rm -rf /var/lib/apt/lists/* \\
 && update-ca-certificates
"""


# ---- the README's commands -------------------------------------------------------------------


# the README's section that opens with the two commands: "The two commands" since the README
# was rewritten (issue 40, part 2), "Quick start" in issue 40's words
README_SECTIONS = ("The two commands", "Quick start")


def readme_commands(text: str) -> list[str]:
    """The command lines (comments stripped) of the first ```bash block of README's section that
    opens with the two commands; fails the test, saying what is missing, when there is no such
    section or block, or the block does not hold two commands."""
    heading = "|".join(map(re.escape, README_SECTIONS))
    section = re.search(rf"^#+ (?:{heading})[ \t]*\n(.*?)(?=^#{{1,2}} |\Z)", text, re.M | re.S)
    if section is None:
        pytest.fail(f"README.md has no section {' or '.join(map(repr, README_SECTIONS))} with the two commands")
    block = re.search(r"^```bash\n(.*?)^```", section.group(1), re.M | re.S)
    if block is None:
        pytest.fail("README.md's section with the two commands has no ```bash block holding them")
    commands = [
        shlex.join(words) for line in block.group(1).splitlines() if (words := shlex.split(line, comments=True))
    ]
    if len(commands) != 2:
        pytest.fail(f"README.md's block of the two commands (the main job, the test suite) holds {commands}")
    return commands


def ci_run_tail() -> list[str]:
    """.ci/run's last command, which hands nox its arguments: ["./tb", "nox"]."""
    lines = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()]
    last = [ln for ln in lines if ln and not ln.startswith("#")][-1]
    words = shlex.split(last)
    assert words[0] == "exec" and words[-1] == "$@", f'.ci/run must end with `exec ... "$@"`: {last}'
    return words[1:-1]


# ---- images and the container ----------------------------------------------------------------


def _gha():
    """.ci/gha/gha.py, for Ubuntu's keyring and a noble debootstrap script."""
    if "gha" in sys.modules:
        return sys.modules["gha"]
    spec = importlib.util.spec_from_file_location("gha", REPO / ".ci" / "gha" / "gha.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gha"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def base_image(engine: Engine, distro: Distro, work: Path) -> str:
    """torchbuild/base:<suite>-x86_64 by the product's make_base_image; noble with Ubuntu's keyring
    and a noble debootstrap script (.ci/gha/gha.py's, which makes the same image)."""
    kwargs = {"suite": distro.suite, "arch": Arch.X86_64, "work_dir": work / "rootfs", "components": distro.components}
    if distro.mirror is None or engine.image_attrs(f"torchbuild/base:{distro.suite}-x86_64") is not None:
        return make_base_image(engine, mirror=distro.mirror, **kwargs)[0]
    gha = _gha()
    with gha.debootstrap_dir(work, gha.ubuntu_keyring(work)):
        return make_base_image(engine, mirror=distro.mirror, **kwargs)[0]


def stock_image(engine: Engine, distro: Distro, work: Path) -> tuple[str, bool]:
    """torchbuild-test/stock:<suite>, unless present with this recipe; (tag, made)."""
    tag = f"{STOCK_REPO}:{distro.suite}"
    certs = sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))
    recipe = hashlib.sha256(STOCK_DOCKERFILE.encode())
    for cert in certs:
        recipe.update(Path(cert).read_bytes())
    attrs = engine.image_attrs(tag)
    if attrs is not None and (attrs["Config"].get("Labels") or {}).get(f"{LABEL}.recipe") == recipe.hexdigest():
        return tag, False
    base = base_image(engine, distro, work)
    ctx = work / f"stock-{distro.suite}"
    shutil.rmtree(ctx, ignore_errors=True)
    (ctx / "certs").mkdir(parents=True)
    for cert in certs:
        shutil.copy(cert, ctx / "certs")
    (ctx / "Dockerfile").write_text(STOCK_DOCKERFILE.format(base=base))
    labels = {LABEL: "stock-distro", f"{LABEL}.recipe": recipe.hexdigest(), f"{LABEL}.base": base}
    engine.build(ctx, tag=tag, labels=labels, log=work / f"stock-{distro.suite}.log", out=io.StringIO())
    return tag, True


def prebuild(items: list, test_cache: Path, after) -> list:
    """The stock images, built with the suite's shared images before the first test
    (conftest.prebuilt_images): bookworm's and noble's debootstraps overlap the other builds.
    trixie's base is the suite's own local_base: its stock image waits for it."""

    def build(distro: Distro):
        def run() -> tuple[str, bool]:
            if distro.suite == SUITE:
                after("local_base")
            return stock_image(Engine.connect(), distro, test_cache / "stock")

        return run

    selected = {item.callspec.params["distro"] for item in items if hasattr(item, "callspec")}
    return [(f"stock_{d.suite}", build(d)) for d in DISTROS if d in selected]


def checkout_tar() -> bytes:
    """The working tree as a clone holds it (tracked and untracked, not ignored, files), as a tar
    rooted at torchbuild/."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in filter(None, names):
            path = REPO / name.decode()
            if path.is_file() or path.is_symlink():  # a deleted but tracked file is left out
                tar.add(path, arcname=f"torchbuild/{name.decode()}", recursive=False)
    return buf.getvalue()


@dataclass
class Box:
    """A running stock container; run() is one command in it, through bash as a user types it."""

    container: object

    def run(self, line: str, *, user: str = "root", workdir: str = CHECKOUT) -> tuple[int, str, str]:
        code, (out, err) = self.container.exec_run(  # type: ignore[attr-defined]
            ["bash", "-c", line], user=user, workdir=workdir, demux=True, environment={"HOME": "/tmp"}
        )
        return code, (out or b"").decode(errors="replace"), (err or b"").decode(errors="replace")

    def ok(self, line: str, **kwargs: str) -> str:
        code, out, err = self.run(line, **kwargs)
        assert code == 0, f"`{line}` exited {code}:\n{out[-3000:]}\n{err[-3000:]}"
        return out


@contextlib.contextmanager
def stock_box(engine: Engine, tag: str, suite: str) -> Iterator[Box]:
    container = engine.client.containers.run(
        tag,
        ["sleep", "infinity"],
        name=f"torchbuild-test-stock-{suite}-{os.getpid()}",
        labels={LABEL: "stock-distro"},
        volumes={SOCKET: {"bind": SOCKET, "mode": "rw"}},
        detach=True,
    )
    try:
        container.exec_run(["mkdir", "-p", "/srv"])
        container.put_archive("/srv", checkout_tar())
        yield Box(container)
    finally:
        container.remove(force=True)


# ---- the test --------------------------------------------------------------------------------


class Clock:
    """Each phase's wall time and the container's CPU time in it (the CPU figure holds on a
    loaded machine, where the wall time stretches)."""

    def __init__(self, name: str) -> None:
        self.name, self.last, self.laps = name, time.monotonic(), []
        self.box: Box | None = None
        self.cpu = 0.0

    def _cpu(self) -> float:
        if self.box is None:
            return 0.0
        stats = self.box.container.stats(stream=False)  # type: ignore[attr-defined]
        return stats["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9

    def lap(self, what: str) -> None:
        now, cpu = time.monotonic(), self._cpu()
        self.laps.append(f"{what} {now - self.last:.0f} s" + (f" (CPU {cpu - self.cpu:.0f} s)" if self.box else ""))
        self.last, self.cpu = time.monotonic(), cpu

    def report(self) -> None:
        print(f"\n{self.name}: " + ", ".join(self.laps), flush=True)


def installed(box: Box, package: str) -> bool:
    """dpkg's word: package is installed (a package only suggested is known, not installed)."""
    code, out, _ = box.run(f"dpkg-query -W -f='${{db:Status-Status}}' {package}")
    return code == 0 and out == "installed"


def check_stock(box: Box, distro: Distro) -> None:
    """What a server install has: python3 of this version, and no pip, no venv package."""
    assert box.ok("python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'").strip() == distro.python
    code, _, err = box.run("python3 -c 'import pip'")
    assert code != 0 and "No module named" in err
    assert not installed(box, f"python{distro.python}-venv"), "the stock image has python3.X-venv"


def check_user_hint(box: Box, distro: Distro) -> None:
    """Without python3.X-venv, an unprivileged user's ./tb names the one command to run and leaves
    no .venv (nor a half-made one) behind."""
    box.ok(f"cp -a {CHECKOUT} {USER_CHECKOUT} && chown -R {USER} {USER_CHECKOUT}")
    code, out, err = box.run("./tb --list", user=USER, workdir=USER_CHECKOUT)
    assert code == 1
    assert (out, err) == (
        "",
        f"tb: python3 cannot make a venv with pip: run `sudo apt-get install python{distro.python}-venv`, "
        "then ./tb again\n",
    )
    assert box.ok(f"ls -A {USER_CHECKOUT} | grep venv || true").strip() == ""


def check_first_command(box: Box, distro: Distro, command: str) -> None:
    """The main job as root: ./tb sets up, and the image build stops at pulling the base."""
    code, out, err = box.run(command)
    base = resolve(DEFAULT_PROFILE).base_image
    assert f"tb: installing python{distro.python}-venv with apt-get" in err, err[-3000:]
    assert "tb: installing torchbuild" in err
    assert code == ImageBuildFailed.exit_code, f"exit {code}\n{out[-3000:]}\n{err[-3000:]}"
    assert f"error: ImageBuildFailed: cannot pull {base}:" in err, err[-3000:]
    assert f"pulling {base} " in out
    assert installed(box, f"python{distro.python}-venv")
    assert box.ok("ls -A | grep venv").split() == [".venv"]  # no temporary venv left
    # made under a temporary name: its scripts and activate name .venv, and they run
    assert box.ok("grep -l .venv.tb- .venv/bin/* .venv/pyvenv.cfg || true") == ""
    assert box.ok(". .venv/bin/activate && pip --version && command -v nox").endswith(f"{CHECKOUT}/.venv/bin/nox\n")
    code, out, err = box.run("time -p ./tb --version")  # bash's time: its seconds on stderr
    assert code == 0 and out.startswith("Invoke "), out + err
    # a second call installs nothing: one python3 start before the exec (seconds allow for load)
    assert "tb: " not in err and float(re.search(r"^real ([\d.]+)", err, re.M).group(1)) < 10, err


def check_task_helps(box: Box) -> int:
    """`./tb TASK --help` exits 0 for every task of `./tb --list`; the number of tasks."""
    listing = json.loads(box.ok("./tb --list --list-format=json"))
    names = [t["name"] for t in listing["tasks"]]
    names += [f"{c['name']}.{t['name']}" for c in listing["collections"] for t in c["tasks"]]
    assert {"image", "build", "base-image", "doctor"} <= set(names), names
    # nproc at once: each is an invoke start importing every task (about a second of CPU)
    failed = box.ok(
        "printf '%s\\n' "
        + " ".join(shlex.quote(n) for n in names)
        + """ | xargs -P "$(nproc)" -I{} sh -c './tb "$1" --help >/dev/null 2>&1 || echo "$1 $?"' sh {}"""
    )
    assert failed == "", f"`./tb TASK --help` failed (task, exit):\n{failed}"
    return len(names)


def check_second_command(box: Box, command: str) -> None:
    """`sudo bash .ci/run --list`: the system part stops at its first step in an unprivileged
    container; what .ci/run ends with (`./tb nox "$@"`) then lists the sessions."""
    assert shlex.split(command)[-1] == ".ci/run", command
    code, out, err = box.run(f"{command} --list")
    assert code == 1, f"exit {code}:\n{out}\n{err}"
    assert err.splitlines()[-1] == "cannot mount binfmt_misc: in a container, give it --cap-add SYS_ADMIN", err
    assert box.ok("ls -A | grep venv").split() == [".venv"]  # made by the first command, not here
    tail = ci_run_tail()
    assert tail == ["./tb", "nox"], tail
    listing = box.ok(shlex.join([*tail, "--list"]))
    for session in ("* lint", "* tests", "* integration", "- slow"):
        assert session in listing, listing


def check_system_python_clean(box: Box) -> None:
    """Nothing went into the system Python: no pip, no torchbuild, invoke or nox outside .venv."""
    for module in ("pip", "torchbuild", "invoke", "nox"):
        code, _, err = box.run(f"cd / && python3 -c 'import {module}'")
        assert code != 0 and f"No module named '{module}'" in err, (module, err)
    assert box.ok("command -v pip pip3 invoke nox torchbuild || true").strip() == ""
    assert box.ok("ls -A /usr/local/lib/python3*/dist-packages 2>/dev/null || true").strip() == ""
    assert box.ok("test -x .venv/bin/torchbuild && test -x .venv/bin/nox && echo yes").strip() == "yes"


@pytest.mark.parametrize("distro", DISTROS, ids=[d.suite for d in DISTROS])
def test_readme_commands_on_stock_distro(engine: Engine, test_cache: Path, distro: Distro) -> None:
    first, second = readme_commands((REPO / "README.md").read_text())
    clock = Clock(f"stock {distro.suite}")
    tag, made = BUILDS.get(f"stock_{distro.suite}", lambda: stock_image(engine, distro, test_cache / "stock"))
    clock.lap("image " + ("made" if made else "cached"))
    try:
        with stock_box(engine, tag, distro.suite) as box:
            clock.box, clock.cpu = box, clock._cpu()
            check_stock(box, distro)
            check_user_hint(box, distro)
            clock.lap("user hint")
            check_first_command(box, distro, first)
            clock.lap(f"`{first}`")
            tasks = check_task_helps(box)
            clock.lap(f"{tasks} tasks' --help")
            check_second_command(box, second)
            check_system_python_clean(box)
            clock.lap(f"`{second} --list`")
    finally:
        clock.report()
