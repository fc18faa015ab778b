"""The Docker engine, through docker-py: connect, build images with streamed output, inspect;
the label namespace of the images torchbuild builds, and the toolchain image's check."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from torchbuild.core.errors import EngineUnavailable, ImageBuildFailed
from torchbuild.core.handover import Slot

if TYPE_CHECKING:
    from torchbuild.profile.config import BuildSpec

try:  # docker-py is a host dependency; the code inside the image never connects to an engine
    import docker
    import docker.auth
    import docker.errors
    import docker.utils
    import requests.exceptions  # docker-py's own transport: what it raises when the engine goes away
except ImportError:  # pragma: no cover - exercised only without docker-py
    docker = None

# the labels of every image torchbuild builds (toolchain, apptainer-builder, base) and of its SIFs
LABEL_PREFIX = "org.torchbuild"


class ImageCheck(Protocol):
    def __call__(
        self, spec: BuildSpec, engine: Engine, *, rebuild: bool = False, out: TextIO = sys.stdout
    ) -> dict[str, object]: ...


# image.host.require_image: whether the toolchain image is current is the image feature's
# knowledge (the inputs it records, its lock, its build); torchbuild.tasks hands it over
IMAGE_CHECK: Slot[ImageCheck] = Slot("the toolchain image's check (image.host.require_image)")


def require_image(
    spec: BuildSpec, engine: Engine, *, rebuild: bool = False, out: TextIO = sys.stdout
) -> dict[str, object]:
    """The inspect data of spec's toolchain image when it exists and was built from the inputs
    spec asks for; otherwise ImageNotFound or ImageOutOfDate (with rebuild=True the image is
    built instead), as the image feature checks it (IMAGE_CHECK)."""
    return IMAGE_CHECK.get()(spec, engine, rebuild=rebuild, out=out)


# Where administrators add CAs to a host's trust store (Debian/Ubuntu; RHEL/Fedora): a
# TLS-inspecting proxy's CA is found here, and images get it only through ca_certificates.
HOST_CA_DIRS = (Path("/usr/local/share/ca-certificates"), Path("/etc/pki/ca-trust/source/anchors"))

# pip (CERTIFICATE_VERIFY_FAILED, SSLCertVerificationError), apt (Certificate verification
# failed), curl and git (SSL certificate problem), OpenSSL (certificate verify failed), Go (x509)
_TLS_FAILURE = re.compile(
    r"CERTIFICATE_VERIFY_FAILED|SSLCertVerificationError|Certificate verification failed"
    r"|SSL certificate problem|certificate verify failed|x509: certificate signed by unknown authority",
    re.IGNORECASE,
)


def host_ca_files(dirs: Iterable[Path] = HOST_CA_DIRS) -> list[Path]:
    """The CA files (*.crt, *.pem) added to this host's trust store under dirs (in that order,
    sorted within each)."""
    found: list[Path] = []
    for d in dirs:
        with contextlib.suppress(OSError):
            found += sorted(p for p in d.rglob("*") if p.suffix in (".crt", ".pem") and p.is_file())
    return found


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _excerpt(line: str) -> str:
    """The part of a log line around its certificate failure, without terminal colours."""
    clean = _ANSI.sub("", line).strip()
    m = _TLS_FAILURE.search(clean)
    start = max(0, m.start() - 80) if m else 0
    return ("..." if start else "") + clean[start : start + 200]


def certificate_failure(line: str) -> bool:
    """True when a build log line says a TLS certificate could not be verified."""
    return _TLS_FAILURE.search(line) is not None


def certificate_hint(ca_files: list[Path], dirs: Sequence[Path] = HOST_CA_DIRS) -> str:
    """What to do when a build inside the image cannot verify a certificate (a TLS-inspecting
    proxy, most often): carry the host's CAs into the image with ca_certificates."""
    if ca_files:
        listed = ",".join(str(p) for p in ca_files)
        return (
            "the image does not trust the certificate (a TLS-inspecting proxy?): add this host's CAs with "
            f"--set ca_certificates={listed} (or list them under ca_certificates in the profile)"
        )
    where = " or ".join(str(d) for d in dirs)
    return (
        "the image does not trust the certificate (a TLS-inspecting proxy?): add your site's CA (PEM) with "
        f"--set ca_certificates=/path/to/site-ca.crt (none found under {where})"
    )


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


@dataclasses.dataclass
class Engine:
    """A reachable Docker engine."""

    client: Any  # docker.DockerClient

    @classmethod
    def connect(cls, timeout: int = 600) -> Engine:
        if docker is None:
            raise EngineUnavailable("docker-py is not installed", hint="pip install docker")
        try:
            # version="auto": negotiate, so old engines (Debian's 20.10 speaks API 1.41) work
            client = docker.from_env(version="auto", timeout=timeout)
            client.ping()
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"Docker engine not reachable at {engine_address()}: {_short(exc)}") from exc
        return cls(client)

    def version(self) -> dict[str, Any]:
        return dict(self.client.version())

    def image_attrs(self, ref: str) -> dict[str, Any] | None:
        """`docker image inspect` of ref, or None when there is no such image."""
        try:
            return dict(self.client.api.inspect_image(ref))
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            if exc.status_code == 404:
                return None
            raise

    def pull(self, ref: str, platform: str | None, out: TextIO = sys.stdout) -> None:
        repo, tag = split_reference(ref)
        print(f"pulling {ref} ({platform or 'default platform'})", file=out, flush=True)
        with engine_lost(f"while it pulled {ref}"):
            try:
                for chunk in self.client.api.pull(repo, tag=tag, platform=platform, stream=True, decode=True):
                    if "error" in chunk:
                        raise pull_failure(ref, str(chunk["error"]))
            except docker.errors.APIError as exc:
                raise pull_failure(ref, _short(exc)) from exc

    def build(
        self,
        context: Path,
        *,
        tag: str,
        dockerfile: str = "Dockerfile",
        buildargs: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        platform: str | None = None,
        nocache: bool = False,
        log: Path,
        out: TextIO = sys.stdout,
    ) -> str:
        """Build context/dockerfile into tag; stream every line to out and to log; return the id.

        Intermediate containers are removed even when a step fails (forcerm), so a failed
        build leaves no container behind.
        """
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        seen = _BuildOutput()
        with log.open("w") as logf, engine_lost(f"while it built {tag}"):
            try:
                stream = self._build_stream(context, dockerfile, tag, buildargs, labels, platform, nocache)
                for chunk in _chunks(stream):
                    error = seen.take(chunk, logf, out)
                    if error is not None:
                        detail = f"failed after {time.monotonic() - start:.0f} s: {step_failed(seen.step, error)}"
                        raise build_failure(tag, detail, log, seen.tls_line)
            except docker.errors.APIError as exc:
                raise build_failure(tag, f"failed: {_short(exc)}", log, seen.tls_line) from exc
        if not seen.image_id:
            attrs = self.image_attrs(tag)
            return str(attrs["Id"]) if attrs else ""
        return seen.image_id

    def _build_stream(
        self,
        context: Path,
        dockerfile: str,
        tag: str,
        buildargs: Mapping[str, str] | None,
        labels: Mapping[str, str] | None,
        platform: str | None,
        nocache: bool,
    ) -> Any:
        """The engine's decoded output of building context/dockerfile into tag: no pull, and intermediate
        containers removed even when a step fails (forcerm)."""
        return self.client.api.build(
            path=str(context),
            dockerfile=dockerfile,
            tag=tag,
            buildargs=dict(buildargs or {}),
            labels=dict(labels or {}),
            platform=platform,
            nocache=nocache,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
        )

    def save(self, ref: str, dest: Path) -> int:
        """`docker save ref > dest` (a docker-archive), streamed to disk; returns its size."""
        size = 0
        with dest.open("wb") as f, engine_lost(f"while it saved {ref}"):
            for chunk in self.client.api.get_image(ref):
                f.write(chunk)
                size += len(chunk)
        return size

    def run(
        self,
        image: str,
        command: list[str],
        *,
        mounts: Mapping[str, str],
        user: str,
        environment: Mapping[str, str],
        workdir: str,
        read_only: Mapping[str, str] | None = None,
        out: TextIO = sys.stdout,
        platform: str | None = None,
        memory_limit: str | None = None,
        cap_add: list[str] | None = None,
        devices: list[str] | None = None,
        security_opt: list[str] | None = None,
    ) -> int:
        """Run command in a fresh container named torchbuild-<uuid>; stream its output; return its exit code.

        mounts maps host paths to container paths (read-write bind mounts, nothing else),
        read_only the same for read-only ones (a host MPI library directory). The
        container is removed on every way out of this function: success, failure, Ctrl-C.
        cap_add, devices and security_opt are for the apptainer-builder only (never --privileged).
        """
        name = f"torchbuild-{uuid.uuid4().hex[:12]}"
        cid = None
        self.remove_exited_runs()
        try:
            host_config = self._host_config(mounts, read_only, memory_limit, cap_add, devices, security_opt)
            cid = self._create(image, command, name, user, environment, workdir, host_config, platform)
            return self._follow(cid, out)
        except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
            raise EngineUnavailable(
                f"the Docker engine at {engine_address()} went away while container {name} ran: {_short(exc)}",
                hint=ENGINE_LOST_HINT,
            ) from exc
        finally:
            if cid is not None:  # an engine that went away took its containers (or keeps them: live-restore)
                with contextlib.suppress(docker.errors.NotFound, requests.exceptions.ConnectionError):
                    self.client.api.remove_container(cid, force=True)

    def _create(
        self,
        image: str,
        command: list[str],
        name: str,
        user: str,
        environment: Mapping[str, str],
        workdir: str,
        host_config: dict[str, Any],
        platform: str | None,
    ) -> str:
        """Create run's container, labelled as a torchbuild run (remove_exited_runs finds it); its id."""
        created = self.client.api.create_container(
            image,
            command,
            name=name,
            user=user,
            environment=dict(environment),
            working_dir=workdir,
            labels={"org.torchbuild.run": "1"},
            host_config=host_config,
            platform=platform,
        )
        return str(created["Id"])

    def _follow(self, cid: str, out: TextIO) -> int:
        """Start container cid, copy its output to out as it comes, and return its exit code."""
        container = self.client.containers.get(cid)
        container.start()
        for chunk in container.logs(stream=True, follow=True):
            out.write(chunk.decode(errors="replace"))
            out.flush()
        result = container.wait()
        return int(result.get("StatusCode", 1))

    def remove_exited_runs(self) -> list[str]:
        """Remove the exited containers of earlier runs (label org.torchbuild.run): run() removes
        its own on every way out, except when the engine went away under it (a reboot, a stopped
        daemon); the engine keeps those, exited, after it starts again. Running and created ones
        may be another torchbuild's, and are left. Returns the names removed."""
        removed = []
        for c in self.client.api.containers(all=True, filters={"label": "org.torchbuild.run=1", "status": "exited"}):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                self.client.api.remove_container(c["Id"])
                removed += [n.lstrip("/") for n in c.get("Names", [])]
        return removed

    def _host_config(
        self,
        mounts: Mapping[str, str],
        read_only: Mapping[str, str] | None,
        memory_limit: str | None,
        cap_add: list[str] | None,
        devices: list[str] | None,
        security_opt: list[str] | None,
    ) -> dict[str, Any]:
        """run's host config: the bind mounts (read-write, then read-only), the memory limit
        (swap included) and the apptainer-builder's capabilities, devices and security options."""
        host_config: dict[str, Any] = self.client.api.create_host_config(
            binds={
                **{host: {"bind": inside, "mode": "rw"} for host, inside in mounts.items()},
                **{host: {"bind": inside, "mode": "ro"} for host, inside in (read_only or {}).items()},
            },
            mem_limit=memory_limit,
            memswap_limit=memory_limit,
            cap_add=cap_add,
            devices=devices,
            security_opt=[o for o in security_opt or [] if o != UNMASK] or None,
        )
        if UNMASK in (security_opt or []):
            # the CLI's --security-opt systempaths=unconfined; docker-py has no parameter for it
            host_config["MaskedPaths"], host_config["ReadonlyPaths"] = [], []
        return host_config


UNMASK = "systempaths=unconfined"

_PULL_HINT = (
    "check registry access; without one, make a local base with `invoke base-image` "
    "and use it with --set base_image=torchbuild/base:<suite>-<arch>"
)


_STEP = re.compile(r"Step (\d+/\d+) : (\S+)\s*(.*)")


@dataclasses.dataclass
class _BuildOutput:
    """What an image build's output has said so far, taken one chunk at a time."""

    tls_line: str | None = None  # the first line saying a certificate could not be verified
    step: str = ""  # the step running: "Step 7/15 : RUN ...", as the builder prints it
    image_id: str = ""

    def take(self, chunk: Mapping[str, Any], logf: TextIO, out: TextIO) -> str | None:
        """Log and echo chunk's text, note what it says; the builder's error, or None."""
        if "stream" in chunk:
            text = chunk["stream"]
            logf.write(text)
            logf.flush()
            for line in text.splitlines():
                if line.strip():
                    print(f"  {line}", file=out, flush=True)
                if self.tls_line is None and certificate_failure(line):
                    self.tls_line = line.strip()
                if _STEP.match(line):
                    self.step = line.strip()
        if "aux" in chunk and "ID" in chunk["aux"]:
            self.image_id = chunk["aux"]["ID"]
        if "error" in chunk:
            logf.write(f"ERROR: {chunk['error']}\n")
            return str(chunk["error"])
        return None


_EXIT = re.compile(r"returned a non-zero code: (\d+)")


def step_failed(step: str, error: str) -> str:
    """One line for a failed build step: its number, its instruction and the start of its
    command (the whole multi-line RUN block is in the log, not in the message), and the exit
    code; the error's first line, shortened, when the builder named no step."""
    code = _EXIT.search(error)
    m = _STEP.match(step)
    if m and code:
        command = " ".join(m[3].split())
        shown = command if len(command) <= 60 else command[:57] + "..."
        return f"step {m[1]} ({m[2]} {shown}) exited with code {code[1]}"
    first = next((ln.strip() for ln in error.splitlines() if ln.strip()), "no message")
    return first if len(first) <= 200 else first[:197] + "..."


def build_failure(
    tag: str, detail: str, log: Path, tls_line: str | None, ca_dirs: Sequence[Path] = HOST_CA_DIRS
) -> ImageBuildFailed:
    """The error for a failed image build; when the log showed a certificate that could not be
    verified, the message quotes that line and the hint names ca_certificates."""
    message = f"building {tag} {detail} (full log: {log})"
    if tls_line is None:
        return ImageBuildFailed(message)
    return ImageBuildFailed(
        f"{message}; a TLS certificate could not be verified: {_excerpt(tls_line)}",
        hint=certificate_hint(host_ca_files(ca_dirs), ca_dirs),
    )


def pull_failure(ref: str, detail: str) -> ImageBuildFailed:
    """The error for a failed pull; an unverifiable registry certificate is the engine's trust
    store to fix (ca_certificates reaches only the builds inside the image)."""
    if certificate_failure(detail):  # the engine's own trust store, not the image's
        return ImageBuildFailed(
            f"cannot pull {ref}: {detail}",
            hint="the Docker engine does not trust the registry's certificate (a TLS-inspecting proxy?): add the "
            "CA to the engine host's trust store or /etc/docker/certs.d/<registry>/ca.crt and restart dockerd",
        )
    return ImageBuildFailed(f"cannot pull {ref}: {detail}", hint=_PULL_HINT)


def split_reference(ref: str) -> tuple[str, str]:
    """An image reference as the repository and the tag (or digest) to pull or push, by
    docker-py's parse_repository_tag, the split its own pull makes: 'ubuntu:24.04' ->
    ('ubuntu', '24.04'); a registry port is not a tag ('localhost:5000/x' -> latest); a digest
    is the tag the engine is asked for ('x@sha256:...' -> ('x', 'sha256:...'), and with a tag
    as well the digest wins: 'x:1@sha256:...' -> ('x:1', 'sha256:...')); no tag is latest, as
    for `docker pull`. Nothing is lowercased: the engine refuses 'Ubuntu' by name."""
    repo, tag = docker.utils.parse_repository_tag(ref)
    return str(repo), str(tag or "latest")


def registry_of(name: str) -> str:
    """The registry (host[:port]) an image name lives in, '' for Docker Hub: docker-py's
    resolve_repository_name, the CLI's rule (the first component is a registry when it has a
    dot or a colon or is localhost). A name docker-py refuses (a scheme, a host beginning or
    ending with '-') is no registry it could talk to: ''."""
    try:
        index, _ = docker.auth.resolve_repository_name(name)
    except docker.errors.InvalidRepository:
        return ""
    return "" if index == docker.auth.INDEX_NAME else str(index)


ENGINE_LOST_HINT = (
    "start the engine again (`sudo systemctl start docker`) and rerun the same command: "
    "a build resumes from its tree and ccache"
)


@contextlib.contextmanager
def engine_lost(what: str) -> Iterator[None]:
    """EngineUnavailable when the engine goes away mid-call (stopped, restarted, its socket
    gone): docker-py raises requests' ConnectionError, an OSError, which would otherwise be
    named a path fault of the task's working directory."""
    try:
        yield
    except (requests.exceptions.ConnectionError, requests.exceptions.ChunkedEncodingError) as exc:
        raise EngineUnavailable(
            f"the Docker engine at {engine_address()} went away {what}: {_short(exc)}", hint=ENGINE_LOST_HINT
        ) from exc


def _chunks(stream: Iterator[Any]) -> Iterator[dict[str, Any]]:
    for chunk in stream:
        if isinstance(chunk, dict):
            yield chunk


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
