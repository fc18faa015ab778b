"""Toolchain image locks, and the list of what an image has installed.

A lock pins what `invoke image` installed into a toolchain image beyond its base: every Debian
package as `name=version` (apt's own syntax) and, per Python of the image, every pip package as
`name==version --hash=sha256:...` (pip's own requirement syntax). `invoke image --lock` writes it
from an image it just built (from what that build recorded under RECORD_DIR); when a lock is
present, `invoke image` installs exactly it: `apt-get install name=version ...` and
`pip install --require-hashes --no-deps -r ...` per venv.

The file is YAML (the profiles' language, read with yaml.safe_load), one entry a line, so that
a refresh reads as a diff. Its entries are checked here, each against a strict pattern, before
anything is written into a build context: a lock cannot smuggle an apt option, a pip option
(`--index-url`) or a shell word into the image build. The Dockerfile reads the rendered lists
with `mapfile` into arrays it expands quoted (apt) and with `pip install -r` (pip).

The installed list (runtime/installed.py's INSTALLED_LIST, written by the image's last RUN with
`python -m torchbuild.image.lock installed`) is one line a package: `dpkg name=version` and
`pip <venv> name==version`, sorted; its sha256 (installed_digest) is what a build's manifest records.

This module runs inside the image too: only the standard library, PyYAML and packaging.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from torchbuild.core.atomic import atomic_write_bytes
from torchbuild.core.errors import LockError as LockError  # defined in errors.py (its registry); importable here too
from torchbuild.core.errors import named_os_errors
from torchbuild.core.process import QUERY_TIMEOUT, run_captured
from torchbuild.runtime.installed import canonical_list

LOCK_VERSION = 1
SUFFIX = ".lock"
# what an unlocked image build leaves for `invoke image --lock`
RECORD_DIR = "/opt/torchbuild/record"
PRIMARY_VENV = "/opt/venv"
# the line an image build prints when a locked install step fails (the Dockerfile's printf;
# anchored, so the build log's echo of the RUN command, with its %s, is no match)
FAILED_RE = re.compile(r"torchbuild-lock: the locked (.+) packages did not install")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# Debian policy: name [a-z0-9][a-z0-9+.-]+, optionally :arch; version [epoch:]upstream[-revision]
_APT_PIN_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?=([0-9]+:)?[0-9A-Za-z][A-Za-z0-9.+~-]*")
_PIP_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_URL_RE = re.compile(r"(https?|file)://[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+")
_PIP_LINE_RE = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:==(?P<version>[A-Za-z0-9.+!_-]+)| @ (?P<url>\S+))"
    r"(?P<hashes>(?: --hash=sha256:[0-9a-f]{64})+)"
)


def _fail(where: str, message: str) -> LockError:
    return LockError(f"{where}: {message}", hint="refresh it with `invoke image --lock`, or remove it")


def check_apt_pin(entry: object, where: str) -> str:
    """entry as an apt `name=version` pin; LockError naming it otherwise."""
    if not isinstance(entry, str) or not _APT_PIN_RE.fullmatch(entry):
        raise _fail(where, f"{entry!r} is not an apt pin (name=version)")
    return entry


@dataclasses.dataclass(frozen=True)
class PipPin:
    """One pip package, pinned: name==version (or name @ url for a direct URL) and its sha256s."""

    name: str
    version: str
    sha256: tuple[str, ...]
    url: str = ""  # a requirement given as `name @ url` in python_packages (its version: "" when read back)

    def __post_init__(self) -> None:
        where = f"pip {self.name}"
        if not _PIP_NAME_RE.fullmatch(self.name):
            raise _fail(where, f"{self.name!r} is not a project name")
        try:
            if self.version or not self.url:  # a direct URL pin names no version in its line
                Version(self.version)
        except InvalidVersion:
            raise _fail(where, f"{self.version!r} is not a version") from None
        if not self.sha256 or not all(_SHA256_RE.fullmatch(h) for h in self.sha256):
            raise _fail(where, "needs a sha256 (64 hex digits) to install with --require-hashes")
        if self.url and not _URL_RE.fullmatch(self.url):
            raise _fail(where, f"{self.url!r} is not a URL")

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)

    def line(self) -> str:
        """The pip requirement line: `name==version --hash=sha256:...` (or `name @ url ...`)."""
        req = f"{self.name} @ {self.url}" if self.url else f"{self.name}=={self.version}"
        return req + "".join(f" --hash=sha256:{h}" for h in self.sha256)

    @classmethod
    def parse(cls, entry: object, where: str) -> PipPin:
        """A lock line back into a pin; LockError for anything else (a pip option, a range)."""
        match = _PIP_LINE_RE.fullmatch(entry) if isinstance(entry, str) else None
        if match is None:
            raise _fail(where, f"{entry!r} is not a pinned pip requirement (name==version --hash=sha256:...)")
        hashes = tuple(h[len("--hash=sha256:") :] for h in match["hashes"].split())
        try:
            return cls(match["name"], match["version"] or "", hashes, match["url"] or "")
        except LockError as err:
            raise _fail(where, err.message) from None


@dataclasses.dataclass(frozen=True)
class Lock:
    """One lock: a profile's toolchain image for one arch, as it was installed."""

    profile: str
    arch: str
    inputs: Mapping[str, Any]  # the profile's image inputs it was made from (image.lock_inputs)
    apt: tuple[str, ...]
    pip: Mapping[str, tuple[PipPin, ...]]  # python version -> pins, the primary first
    base_image_id: str = ""
    torchbuild_version: str = ""
    created: str = ""

    def counts(self) -> tuple[int, int]:
        """(apt entries, pip entries over every venv)."""
        return len(self.apt), sum(len(p) for p in self.pip.values())

    def dump(self) -> str:
        """The lock as YAML text, a header comment first."""
        data = {
            "lock_version": LOCK_VERSION,
            "profile": self.profile,
            "arch": self.arch,
            "torchbuild_version": self.torchbuild_version,
            "created": self.created,
            "base_image_id": self.base_image_id,
            "inputs": {k: list(v) if isinstance(v, tuple) else v for k, v in self.inputs.items()},
            "apt": list(self.apt),
            "pip": {v: [p.line() for p in pins] for v, pins in self.pip.items()},
        }
        header = (
            f"# torchbuild toolchain lock: profile {self.profile}, {self.arch}. Written by `invoke image --lock`\n"
            "# (run it again to refresh); while this file is present, `invoke image` installs exactly these\n"
            "# apt packages (beyond the base image) and, per Python, these pip packages (--require-hashes).\n"
        )
        return header + yaml.safe_dump(data, sort_keys=False, width=1000, default_flow_style=False)

    def render(self, dest: Path) -> None:
        """The lists the Dockerfile reads, in dest (inputs/lock/): apt.txt, one pin a line
        (mapfile), and pip-<version>.txt per Python (pip -r)."""
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "apt.txt").write_text("".join(f"{e}\n" for e in self.apt))
        for version, pins in self.pip.items():
            (dest / f"pip-{version}.txt").write_text("".join(f"{p.line()}\n" for p in pins))


def loads(text: str, where: str = "lock") -> Lock:
    """A Lock from its YAML text; LockError naming what is wrong."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _fail(where, f"not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise _fail(where, "not a torchbuild lock (no mapping at the top)")
    if data.get("lock_version") != LOCK_VERSION:
        raise _fail(where, f"lock_version {data.get('lock_version')!r}: this torchbuild reads version {LOCK_VERSION}")
    for key in ("profile", "arch"):
        if not isinstance(data.get(key), str):
            raise _fail(where, f"{key}: missing or not a string")
    inputs = data.get("inputs")
    if not isinstance(inputs, dict):
        raise _fail(where, "inputs: missing or not a mapping")
    apt = data.get("apt")
    if not isinstance(apt, list):
        raise _fail(where, "apt: missing or not a list")
    pip = data.get("pip")
    if not isinstance(pip, dict) or not pip:
        raise _fail(where, "pip: missing or not a mapping of Python version to pins")
    pins: dict[str, tuple[PipPin, ...]] = {}
    for version, entries in pip.items():
        if not isinstance(version, str) or not re.fullmatch(r"3\.\d+", version):
            raise _fail(where, f'pip: {version!r} is not a Python version (quote it: "3.13")')
        if not isinstance(entries, list):
            raise _fail(where, f"pip.{version}: not a list")
        pins[version] = tuple(PipPin.parse(e, f"{where}: pip.{version}") for e in entries)
    extra = {k: str(data.get(k) or "") for k in ("base_image_id", "torchbuild_version", "created")}
    return Lock(
        profile=data["profile"],
        arch=data["arch"],
        inputs=dict(inputs),
        apt=tuple(check_apt_pin(e, f"{where}: apt") for e in apt),
        pip=pins,
        **extra,
    )


def read(path: Path) -> tuple[Lock, str]:
    """The lock in path and the sha256 of the file; PathError when it cannot be read."""
    with named_os_errors(path, "reading the lock"):
        raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(str(path), "not a lock (not UTF-8 text)") from None
    return loads(text, str(path)), hashlib.sha256(raw).hexdigest()


def write(lock: Lock, path: Path) -> tuple[str, int]:
    """Write lock to path atomically; (its sha256, its size in bytes)."""
    raw = lock.dump().encode()
    atomic_write_bytes(path, raw, what="writing the lock")
    return hashlib.sha256(raw).hexdigest(), len(raw)


# --------------------------------------------------------------------------- from a built image


def venv_of(version: str, primary: str) -> str:
    """The venv of a Python in the image: /opt/venv for the primary, /opt/venv-<v> for others."""
    return PRIMARY_VENV if version == primary else f"{PRIMARY_VENV}-{version}"


def _report_pins(report: Mapping[str, Any], where: str, skip: Iterable[str] = ()) -> list[PipPin]:
    """The pins of a `pip install --report` (what pip downloaded and installed, with the sha256
    pip checked or computed for each file); LockError for an install that has no hash (a
    directory or a VCS checkout)."""
    pins = []
    for item in report.get("install") or []:
        meta, info = item.get("metadata") or {}, item.get("download_info") or {}
        name, version = str(meta.get("name", "")), str(meta.get("version", ""))
        if canonicalize_name(name) in skip:
            continue
        archive = info.get("archive_info")
        if archive is None:
            kind = "a directory" if "dir_info" in info else "a VCS checkout" if "vcs_info" in info else "no archive"
            raise LockError(
                f"{where}: {name} {version} was installed from {kind} ({info.get('url', '?')}): pip cannot pin it by hash",
                hint="list it in python_packages as a release (name==version) or an archive URL, then lock again",
            )
        hashes = dict(archive.get("hashes") or {})
        if "sha256" not in hashes and str(archive.get("hash", "")).startswith("sha256="):
            hashes["sha256"] = archive["hash"].split("=", 1)[1]
        if "sha256" not in hashes:
            raise LockError(f"{where}: pip recorded no sha256 for {name} {version}")
        pins.append(PipPin(name, version, (hashes["sha256"],), info["url"] if item.get("is_direct") else ""))
    return pins


def _pip_self_pin(text: str, where: str) -> PipPin:
    """pip's own pin from `sha256sum pip-<version>-*.whl` (the wheel the build upgraded pip with)."""
    try:
        digest, path = text.split()
        version = Path(path).name.split("-")[1]
        return PipPin("pip", version, (digest,))
    except (ValueError, IndexError, LockError):
        raise LockError(f"{where}: not a sha256sum line of a pip wheel: {text.strip()[:120]!r}") from None


def installed_pip(installed: Iterable[str], venv: str) -> dict[str, str]:
    """{canonical name: version} of one venv's lines of an installed list."""
    found = {}
    for line in installed:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "pip" and parts[1] == venv:
            name, _, version = parts[2].partition("==")
            found[name] = version
    return found


# packages a fresh venv has before pip installs anything (ensurepip's): not in any report
_ENSUREPIP = {"pip", "setuptools"}


def from_records(
    records: Mapping[str, bytes],
    installed: Sequence[str],
    *,
    profile: str,
    arch: str,
    pythons: Sequence[str],
    inputs: Mapping[str, Any],
    base_image_id: str = "",
    torchbuild_version: str = "",
) -> Lock:
    """The lock of an image from what its unlocked build recorded (records: RECORD_DIR's files
    by name) and its installed list. Each pin is checked against the installed list: the lock
    holds exactly the versions the image has."""

    apt = _apt_pins(records, installed)
    primary = pythons[0]
    pip = {version: _pip_pins(records, installed, version, primary=primary) for version in pythons}
    return Lock(
        profile=profile,
        arch=arch,
        inputs=dict(inputs),
        apt=tuple(apt),
        pip=pip,
        base_image_id=base_image_id,
        torchbuild_version=torchbuild_version,
        created=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def _apt_pins(records: Mapping[str, bytes], installed: Sequence[str]) -> list[str]:
    """The apt pins: the installed list's dpkg packages that the base image (dpkg-base.txt) did not have."""
    base = records.get("dpkg-base.txt")
    if base is None:
        raise LockError(f"the image records no dpkg-base.txt in {RECORD_DIR}: it was built from a lock, or by hand")
    before = set(base.decode().split())
    return sorted({line.split(" ", 1)[1] for line in installed if line.startswith("dpkg ")} - before)


def _pip_pins(
    records: Mapping[str, bytes], installed: Sequence[str], version: str, *, primary: str
) -> tuple[PipPin, ...]:
    """Python version's pip pins (pip itself, its reports' and, for the primary, torchbuild's requirements),
    checked against what its venv has: the same versions, and nothing no recorded install put there."""
    where = f"pip for Python {version}"
    own = records.get(f"pip-{version}.sha256")
    if own is None:
        raise LockError(f"the image records no pip-{version}.sha256 in {RECORD_DIR}")
    pins = {"pip": _pip_self_pin(own.decode(), where)}
    reports = [f"pip-{version}.json", *(["torchbuild.json"] if version == primary else [])]
    for name in reports:
        raw = records.get(name)
        if raw is not None:  # no requirements: no report
            skip = {"torchbuild"} if name == "torchbuild.json" else set()
            pins.update((p.key, p) for p in _report_pins(json.loads(raw), where, skip))
    venv = venv_of(version, primary)
    has = installed_pip(installed, venv)
    for key, pin in pins.items():
        if has.get(key) != pin.version:
            raise LockError(f"{where}: the report says {pin.name} {pin.version}, {venv} has {has.get(key)}")
    unpinned = sorted(set(has) - set(pins) - _ENSUREPIP - {"torchbuild"})
    if unpinned:
        raise LockError(f"{where}: {venv} has {', '.join(unpinned)}, which no recorded pip install put there")
    return tuple(sorted(pins.values(), key=lambda p: p.key))


# --------------------------------------------------------------------------- the installed list


def install_failures(log_text: str) -> tuple[list[str], list[str]]:
    """From an image build's log: the locked steps that failed (apt, pip (Python 3.13), ...) and
    the apt (`E: ...`) and pip (`ERROR: ...`) error lines that say why."""
    steps, errors = [], []
    for raw in _ANSI_RE.sub("", log_text).splitlines():  # the engine colours a step's stderr
        line = raw.strip()
        match = FAILED_RE.fullmatch(line)
        if match and match[1] != "%s":
            steps.append(match[1])
        elif (
            line.startswith(("E: ", "ERROR: ", "Expected sha256 "))
            and not line.startswith("ERROR: The command '")  # the engine's own line: it repeats the RUN
            and line[:200] not in errors
        ):
            errors.append(line[:200])
    return steps, errors


def list_differences(a: Iterable[str], b: Iterable[str]) -> list[str]:
    """`- line` for what only a has, `+ line` for what only b has."""
    sa, sb = set(canonical_list(a)), set(canonical_list(b))
    return [f"- {x}" for x in sorted(sa - sb)] + [f"+ {x}" for x in sorted(sb - sa)]


def dpkg_installed() -> list[str]:
    """`name=version` of every installed Debian package ([] where there is no dpkg)."""
    fmt = "${db:Status-Status} ${binary:Package}=${Version}\n"
    try:
        out = run_captured(["dpkg-query", "-W", f"-f={fmt}"], timeout=QUERY_TIMEOUT).checked()
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("installed ")]


def venv_packages(venv: Path) -> list[str]:
    """`name==version` of the distributions in a venv's own site-packages (not the system's)."""
    import importlib.metadata as md

    found = []
    for site in sorted(venv.glob("lib/python3*/site-packages")):
        for dist in md.distributions(path=[str(site)]):
            name = dist.metadata["Name"]
            if name:
                found.append(f"{canonicalize_name(name)}=={dist.version}")
    return found


def installed_lines(root: Path = Path(PRIMARY_VENV).parent) -> list[str]:
    """The image's installed list: every dpkg package and every venv's pip packages."""
    venvs = [root / "venv", *sorted(root.glob("venv-*"))]
    lines = [f"dpkg {x}" for x in dpkg_installed()]
    lines += [f"pip /{venv.relative_to('/')} {x}" for venv in venvs if venv.is_dir() for x in venv_packages(venv)]
    return canonical_list(lines)


def unmet_requirements(dist: str) -> list[str]:
    """The requirements of dist (and theirs, recursively) that this environment does not
    satisfy: what a `pip install --no-deps` left missing."""
    import importlib.metadata as md

    unmet: list[str] = []
    seen: set[str] = set()
    todo = [dist]
    while todo:
        name = todo.pop()
        if canonicalize_name(name) in seen:
            continue
        seen.add(canonicalize_name(name))
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            req = Requirement(text)
            try:
                if req.marker and not req.marker.evaluate({"extra": ""}):
                    continue
            except UndefinedEnvironmentName:
                continue
            try:
                version = md.version(req.name)
            except md.PackageNotFoundError:
                unmet.append(f"{text} (required by {name}): not installed")
                continue
            if not req.specifier.contains(version, prereleases=True):
                unmet.append(f"{text} (required by {name}): {version} is installed")
            todo.append(req.name)
    return unmet


def main(argv: Sequence[str] | None = None) -> int:
    """In the image: `installed` prints the installed list; `requires DIST` exits 1 naming each
    unmet requirement of DIST (recursively)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["installed"]:
        sys.stdout.write("".join(f"{line}\n" for line in installed_lines()))
        return 0
    if len(args) == 2 and args[0] == "requires":
        unmet = unmet_requirements(args[1])
        for line in unmet:
            print(f"unmet: {line}", file=sys.stderr)
        return 1 if unmet else 0
    print("usage: python -m torchbuild.image.lock installed | requires DIST", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
