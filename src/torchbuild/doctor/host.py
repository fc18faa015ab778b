"""`invoke doctor`: what this host can do, and a verdict per task."""

from __future__ import annotations

import dataclasses
import http.client
import importlib.util
import io
import os
import secrets
import shutil
import socket
import tempfile
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torchbuild.configview import need_build
from torchbuild.core.arch import Arch, binfmt_ready, host_machine
from torchbuild.core.console import printable as console_printable
from torchbuild.core.console import table
from torchbuild.core.errors import EngineUnavailable, TorchbuildError
from torchbuild.core.process import run_captured
from torchbuild.core.safeio import user_path
from torchbuild.profile import remote_cache
from torchbuild.profile.config import DEFAULT_PROFILE, resolve
from torchbuild.runtime.engine import HOST_CA_DIRS, Engine, engine_address, host_ca_files
from torchbuild.runtime.jobs import GiB, HostResources
from torchbuild.sif.recipe import Bootstrap, RecipeError, fakeroot_flags


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclasses.dataclass(frozen=True)
class Verdict:
    task: str
    ok: bool
    why: str


@dataclasses.dataclass(frozen=True)
class _Host:
    """The facts the verdicts are drawn from."""

    arch: Arch | None  # None: a machine torchbuild does not build for (a ppc64le login node)
    machine: str
    # each arch this host runs only under emulation -> whether its qemu binfmt entry is enabled
    emulation: Mapping[Arch, bool]
    engine_ok: bool
    debootstrap: str | None
    root: bool
    apptainer: str | None
    fuse: bool
    native_missing: tuple[str, ...]
    # tools a native build uses from the host when it has them, else does without or brings
    # itself (cmake and ninja: the build venv; ccache: no compile cache)
    native_absent: tuple[str, ...] = ()


def _version_of(cmd: list[str]) -> str | None:
    exe = shutil.which(cmd[0])
    if exe is None:
        return None
    try:
        proc = run_captured(cmd, timeout=20)
    except OSError:
        return None
    text = (proc.stdout or proc.stderr).strip().splitlines()
    return text[0] if proc.returncode == 0 and text else None


def _gpus() -> str | None:
    listing = None
    if shutil.which("nvidia-smi"):
        try:
            proc = run_captured(["nvidia-smi", "-L"], timeout=20)
            if proc.returncode == 0 and proc.stdout.strip():
                listing = "; ".join(proc.stdout.strip().splitlines())
        except OSError:
            pass
    if listing is None and Path("/dev/nvidia0").exists():
        listing = "/dev/nvidia0 present (no nvidia-smi)"
    return listing


def _engine_checks() -> tuple[list[Check], bool]:
    """The Docker engine and BuildKit; whether the engine is reachable."""
    try:
        v = Engine.connect(timeout=10).version()
    except EngineUnavailable as exc:
        engine = Check("docker engine", False, f"{exc.message}; {exc.hint}")
        return [engine, Check("buildkit (docker buildx)", False, "not found (classic builder only)")], False
    engine = Check("docker engine", True, f"{v.get('Version')} (API {v.get('ApiVersion')}) at {engine_address()}")
    buildkit = _version_of(["docker", "buildx", "version"])
    return [
        engine,
        Check("buildkit (docker buildx)", buildkit is not None, buildkit or "not found (classic builder only)"),
    ], True


def _tool_checks(h: _Host) -> list[Check]:
    """Apptainer, qemu emulation, debootstrap and root."""
    missing = "missing: apt-get install qemu-user-static binfmt-support && update-binfmts --enable"
    apptainer = "not found (sif and --engine apptainer use the apptainer-builder container)"
    return [
        Check("apptainer/singularity", h.apptainer is not None, h.apptainer or apptainer),
        *(
            Check(f"{arch} emulation", ok, f"qemu binfmt {arch.qemu_binfmt} enabled" if ok else missing)
            for arch, ok in h.emulation.items()
        ),
        Check("debootstrap", h.debootstrap is not None, h.debootstrap or "not found: apt-get install debootstrap"),
        Check("root", h.root, "yes" if h.root else "no (base-image needs root)"),
    ]


def _resource_checks(cache_dir: Path, compiler: str | None) -> list[Check]:
    """Cores, memory, free disk under cache_dir, GPUs and the host compiler."""
    res = HostResources.detect()
    probe = next(p for p in [cache_dir, *cache_dir.parents] if p.exists())
    free = shutil.disk_usage(probe).free
    gpu = _gpus()
    return [
        Check("cores", True, str(res.cores)),
        Check("memory", res.memory_bytes >= 8 * GiB, f"{res.memory_bytes / GiB:.1f} GiB ({res.memory_source})"),
        Check("free disk", free >= 40 * GiB, f"{free / GiB:.0f} GiB at {probe} (a CUDA build needs ~40 GiB)"),
        Check("gpu", gpu is not None, gpu or "none visible (builds work; GPU verification is skipped)"),
        Check("host compiler", compiler is not None, compiler or "none (only needed for native builds)"),
    ]


def ca_check(ca_dirs: Sequence[Path], profile: str, listed: Iterable[str]) -> Check:
    """The CAs added to this host's trust store (a TLS-inspecting proxy's, often), and whether
    profile's ca_certificates (listed) carries them into the images it builds."""
    found = host_ca_files(ca_dirs)
    if not found:
        return Check("host CA certificates", True, f"none added under {', '.join(str(d) for d in ca_dirs)}")
    carried = {user_path(p).resolve() for p in listed}
    missing = [str(p) for p in found if p.resolve() not in carried]
    if not missing:
        names = ", ".join(str(p) for p in found)
        return Check("host CA certificates", True, f"{names}: profile {profile} carries them (ca_certificates)")
    return Check(
        "host CA certificates",
        False,
        f"profile {profile} does not carry {', '.join(missing)} into images; behind a TLS-inspecting proxy "
        f"build with --set ca_certificates={','.join(str(p) for p in found)}",
    )


def _profile_ca_check(ca_dirs: Sequence[Path], profile: str) -> Check:
    try:
        listed = resolve(profile).ca_certificates
    except TorchbuildError as exc:
        return Check("host CA certificates", False, f"profile {profile}: {exc.message}")
    return ca_check(ca_dirs, profile, listed)


PROBE_TIMEOUT_S = 3.0  # each storage probe, whole: connection, request and answer


class _Deadline:
    """A connected socket whose every send and receive waits at most until one deadline.
    http.client reads a status line and each header in receives of their own, and a socket's
    timeout bounds each receive: a server trickling a header a second held doctor for a minute.
    (http.client takes any object with these methods for its socket; makefile builds on
    socket.SocketIO as socket.makefile does.)"""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer was still coming when the time was up")
        self._sock.settimeout(left)

    def sendall(self, data: bytes) -> None:
        self._arm()
        self._sock.sendall(data)

    def recv(self, size: int) -> bytes:
        self._arm()
        return self._sock.recv(size)

    def recv_into(self, buffer: Any, size: int = 0) -> int:
        self._arm()
        return self._sock.recv_into(buffer, size)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(socket.SocketIO(self, "rb"))  # type: ignore[arg-type]

    def _decref_socketios(self) -> None:  # SocketIO.close calls it; the socket closes with us
        pass

    def close(self) -> None:
        self._sock.close()


def redis_answer(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> str:
    """A redis server's answer to one PING (`+PONG`, or `-NOAUTH ...`); OSError when none
    comes within timeout (the whole exchange). Reads at most one short line."""
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as raw:
        conn = _Deadline(raw, deadline)
        conn.sendall(b"*1\r\n$4\r\nPING\r\n")
        return conn.recv(256).decode(errors="replace").strip()


class _HTTP(http.client.HTTPConnection):
    """One HEAD within one deadline (_Deadline)."""

    deadline = 0.0

    def connect(self) -> None:
        super().connect()
        self.sock = _Deadline(self.sock, self.deadline)


class _HTTPS(http.client.HTTPSConnection):
    deadline = 0.0

    def connect(self) -> None:
        super().connect()  # the TLS handshake: each receive bounded by the time left
        self.sock = _Deadline(self.sock, self.deadline)


def http_status(url: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, str]:
    """The HTTP status of one HEAD of url and its Location header ('' without one), straight to
    it (no proxy, and no redirect followed: ccache's HTTP client uses neither); the whole
    exchange within timeout. OSError when nothing (whole) answers in time."""
    parts = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + timeout
    kind = _HTTPS if parts.scheme.lower() == "https" else _HTTP
    conn = kind(parts.hostname or "", parts.port, timeout=timeout)
    conn.deadline = deadline
    try:
        conn.request("HEAD", urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, "")))
        response = conn.getresponse()
        return response.status, response.getheader("Location") or ""
    finally:
        conn.close()


def probe_url(url: str) -> str:
    """A key path under an http storage's URL that no build wrote: the doctor asks for it, as a
    build asks for an entry (a WebDAV root without autoindex refuses a HEAD of itself: 403)."""
    return f"{url.rstrip('/')}/torchbuild-doctor-{secrets.token_hex(8)}"


def _http_detail(url: str) -> tuple[bool, str]:
    """Whether an http storage answers a HEAD of a key that is not there (404; 200 or another
    client status too), and how to say it; 401/403: it refuses the builds' requests."""
    status, location = http_status(probe_url(url))
    if 300 <= status < 400:
        where = f" to {console_printable(location[:120])}" if location else ""
        return False, (
            f"redirects a key's HEAD (HTTP {status}{where}): ccache follows no redirect, so every "
            "lookup would miss; name the URL the storage answers at"
        )
    if status in (401, 403):
        return False, (
            f"refuses a key's HEAD (HTTP {status}): let this node read and write under the URL "
            "without credentials (ccache's URL carries none here)"
        )
    ok = status < 500
    return ok, f"answers HTTP {status} for an absent key" + ("" if ok else " (failing)")


def remote_cache_check(url: str, readonly: bool = False) -> Check:
    """Whether the profile's ccache_remote answers: redis a PONG, http(s) a HEAD of a random key
    under the URL with any status but a server error or a refusal (401, 403). A storage that
    does not answer, or answers no HTTP, only slows builds (local-only)."""
    scheme, host, port = remote_cache.endpoint(url)
    shown = url + (" (read-only)" if readonly else "")
    slow = "builds will go on with the local cache alone"
    try:
        if scheme == "redis":
            answer = redis_answer(host, port)
            ok = answer.startswith("+PONG")
            detail = "answers PING" if ok else f"answered {answer[:80]!r} to PING (a password or TLS needed?)"
        else:
            ok, detail = _http_detail(url)
    except (OSError, ValueError) as exc:
        ok, detail = False, f"no answer within {PROBE_TIMEOUT_S:g} s ({exc})"
    except http.client.HTTPException as exc:  # e.g. BadStatusLine: no OSError, the server spoke no HTTP
        ok, detail = False, f"not an HTTP storage: no HTTP answer to a HEAD ({type(exc).__name__}: {exc})"
    return Check("ccache remote", ok, f"{shown}: {detail}" + ("" if ok else f"; {slow}"))


CCACHE_PROBE_S = 30.0  # one compile of a one-line file through ccache, its storage lookups included


def ccache_remote_check(url: str, readonly: bool = False) -> Check | None:
    """What this host's ccache does with the storage, as a build's ccache would: one compile of
    a new one-line file through it, with the build's settings (remote_cache.storage_env) in an
    empty cache of its own, then its counters. A URL ccache cannot parse, a lookup that failed
    or timed out, or no lookup at all is not ok. None without ccache or a C compiler here."""
    ccache, cc = shutil.which("ccache"), shutil.which("cc") or shutil.which("gcc")
    if ccache is None or cc is None:
        return None
    name = "ccache remote via ccache"
    with tempfile.TemporaryDirectory(prefix="torchbuild-doctor-") as tmp:
        env = _ccache_env(Path(tmp), url, readonly)
        version = _first(run_captured([ccache, "--version"], env=env, timeout=10).stdout) or "ccache"
        source = Path(tmp) / "probe.c"
        source.write_text(f"int torchbuild_doctor_{secrets.token_hex(8)}(void) {{ return 0; }}\n")
        compiled = run_captured([ccache, cc, "-c", str(source), "-o", str(Path(tmp) / "probe.o")], env=env,
                                cwd=tmp, timeout=CCACHE_PROBE_S)  # fmt: skip
        if compiled.returncode is None:
            return Check(name, False, f"{version}: one compile did not finish within {CCACHE_PROBE_S:g} s")
        if compiled.returncode != 0:
            said = _first(compiled.stderr, "ccache: error:") or _first(compiled.stderr) or f"exit {compiled.returncode}"
            return Check(name, False, f"{version} refuses it: {said}; every compile of a build would fail")
        stats = _ccache_stats(ccache, env)
    return Check(name, *_ccache_verdict(version, stats, readonly))


def _ccache_env(tmp: Path, url: str, readonly: bool) -> dict[str, str]:
    """This environment without the user's CCACHE_* settings (CCACHE_DISABLE, another remote),
    an empty cache and configuration under tmp, and the build's remote storage settings."""
    (tmp / "ccache.conf").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCACHE_")}
    env.update(CCACHE_DIR=str(tmp / "cache"), CCACHE_CONFIGPATH=str(tmp / "ccache.conf"), LC_ALL="C")
    env.update(remote_cache.storage_env(url, readonly))
    return env


def _ccache_stats(ccache: str, env: Mapping[str, str]) -> dict[str, int]:
    done = run_captured([ccache, "--print-stats"], env=env, timeout=10)
    stats: dict[str, int] = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        key, _, value = line.partition("\t")
        if value.strip().isdigit():
            stats[key] = int(value)
    return stats


def _ccache_verdict(version: str, stats: Mapping[str, int], readonly: bool) -> tuple[bool, str]:
    failed = stats.get("remote_storage_error", 0), stats.get("remote_storage_timeout", 0)
    if any(failed):
        return False, (
            f"{version} could not use it ({failed[0]} error(s), {failed[1]} timeout(s) in one compile); "
            "builds will go on with the local cache alone"
        )
    if not stats.get("remote_storage_miss", 0) + stats.get("remote_storage_hit", 0):
        return False, f"{version} did not ask it (ccache 4.4 or newer reads ccache_remote)"
    stored = "read-only: stored nothing" if readonly else f"stored {stats.get('remote_storage_write', 0)} entries"
    return True, f"{version} looked a new entry up there (a miss) and {stored}"


def _first(text: str, prefix: str = "") -> str:
    """The first non-empty line of text (that starts with prefix), stripped."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip().startswith(prefix)), "")


def _profile_remote_checks(profile: str) -> list[Check]:
    """The profile's ccache_remote checks, when it has one: the storage's own answer, and what
    this host's ccache does with it."""
    try:
        spec = resolve(profile)
    except TorchbuildError:
        return []  # the CA check names the profile's problem
    if not spec.ccache_remote:
        return []
    by_ccache = ccache_remote_check(spec.ccache_remote, spec.ccache_remote_readonly)
    return [remote_cache_check(spec.ccache_remote, spec.ccache_remote_readonly), *([by_ccache] if by_ccache else [])]


def _verdicts(h: _Host) -> list[Verdict]:
    engine_why = "engine reachable" if h.engine_ok else "needs a Docker engine"
    base_ok = h.engine_ok and h.debootstrap is not None and h.root
    if h.apptainer:
        sif_why = f"this host's {h.apptainer}"
    elif h.engine_ok and h.fuse:
        sif_why = "the apptainer-builder container (engine + /dev/fuse)"
    else:
        sif_why = "needs apptainer, or a Docker engine and /dev/fuse"
    return [
        Verdict("config", True, "always available"),
        *([Verdict(f"image --arch {h.arch}", h.engine_ok, engine_why)] if h.arch else []),
        *(
            Verdict(
                f"image --arch {arch}",
                h.engine_ok and ok,
                "engine + qemu binfmt" if h.engine_ok and ok else "needs a Docker engine and qemu-user binfmt",
            )
            for arch, ok in h.emulation.items()
        ),
        Verdict(
            "base-image", base_ok, "engine, debootstrap, root" if base_ok else "needs engine, debootstrap and root"
        ),
        Verdict(
            "build --in-container",
            h.engine_ok,
            "engine reachable (the profile's image must be built)" if h.engine_ok else "needs a Docker engine",
        ),
        Verdict("sif, build --engine apptainer", h.apptainer is not None or (h.engine_ok and h.fuse), sif_why),
        _recipe_verdict(h),
        _native_verdict(h),
    ]


def _native_verdict(h: _Host) -> Verdict:
    if h.arch is None:
        why = f"this host is {h.machine}: build on an x86_64 or aarch64 node (`invoke submit` from here)"
        return Verdict("build (native)", False, why)
    if h.native_missing:
        return Verdict("build (native)", False, f"missing: {', '.join(h.native_missing)}")
    why = "a compiler and Python's venv"
    if {"cmake", "ninja"} & set(h.native_absent):
        why += "; cmake and ninja from PyPI in the build venv (build_venv)"
    if "ccache" in h.native_absent:
        why += "; no ccache on PATH: no compile cache"
    return Verdict("build (native)", True, why)


def _recipe_verdict(h: _Host, etc: Path = Path("/etc"), uid: int | None = None, user: str | None = None) -> Verdict:
    """`invoke sif --from-recipe`: which bootstraps Apptainer can build here unprivileged."""
    name = "sif --from-recipe"
    if h.apptainer is None:
        ok = h.engine_ok and h.fuse
        return Verdict(
            name, ok, "in the apptainer-builder container" if ok else "needs apptainer (module load apptainer)"
        )
    if h.root:
        return Verdict(name, True, f"this host's {h.apptainer}, as root: debootstrap or docker bootstrap")
    try:
        fakeroot_flags(
            Bootstrap("debootstrap", "", ""), uid=uid if uid is not None else os.getuid(), user=user, etc=etc
        )
    except RecipeError as exc:
        return Verdict(name, True, f"docker bootstrap only: {exc.message.split(', and ', 1)[-1]} ({exc.hint})")
    return Verdict(name, True, "--fakeroot with subordinate ids: debootstrap or docker bootstrap")


def run_checks(
    cache_dir: Path, *, ca_dirs: Sequence[Path] = HOST_CA_DIRS, profile: str = DEFAULT_PROFILE
) -> tuple[list[Check], list[Verdict]]:
    """Every check of this host, and a verdict per task; ca_dirs are where added CAs are looked
    for, profile the one whose ca_certificates is compared with them and whose ccache_remote is asked."""
    host = Arch.host_or_none()
    engine_checks, engine_ok = _engine_checks()
    compiler = _version_of(["g++", "--version"]) or _version_of(["clang++", "--version"])
    native_missing = [] if compiler else ["g++ or clang++"]
    if importlib.util.find_spec("ensurepip") is None:  # Debian's python3 without python3-venv
        native_missing.append("Python's venv (ensurepip; Debian: python3-venv) for the build venv")
    h = _Host(
        arch=host,
        machine=host_machine(),
        emulation={arch: binfmt_ready(arch) for arch in Arch if arch is not host},
        engine_ok=engine_ok,
        debootstrap=shutil.which("debootstrap"),
        root=os.geteuid() == 0,
        apptainer=_version_of(["apptainer", "--version"]) or _version_of(["singularity", "--version"]),
        fuse=Path("/dev/fuse").exists(),
        native_missing=tuple(native_missing),
        native_absent=tuple(t for t in ("cmake", "ninja", "ccache") if shutil.which(t) is None),
    )
    checks = [
        *engine_checks,
        *_tool_checks(h),
        *_resource_checks(cache_dir, compiler),
        _profile_ca_check(ca_dirs, profile),
        *_profile_remote_checks(profile),
    ]
    return checks, _verdicts(h)


def need_build_section(profile: str) -> str:
    """Whether profile needs a source build at all (need_build), or the official wheel would do;
    a profile that does not resolve is named, as the other profile checks do."""
    try:
        spec = resolve(profile)
        text = need_build.render(need_build.assess(spec, profile=profile), profile)
    except TorchbuildError as exc:
        text = f"source build needed? (profile {profile})\n  cannot tell: {exc.message}"
    except OSError as exc:  # a patch of the series that cannot be read
        text = f"source build needed? (profile {profile})\n  cannot tell: {exc}"
    return console_printable(text)


def render(checks: list[Check], verdicts: list[Verdict]) -> str:
    host = table(["", "host", "detail"], [("ok" if c.ok else "--", c.name, c.detail) for c in checks])
    tasks = table(["", "task", "why"], [("ready" if v.ok else "NOT READY", v.task, v.why) for v in verdicts])
    return f"{host}\n\n{tasks}"
