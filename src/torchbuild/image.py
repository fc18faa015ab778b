"""The toolchain image: build args from the BuildSpec, a hashed build context, cache-hit check."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from . import __version__
from .arch import Arch, binfmt_ready
from .config import BuildSpec, data_dir
from .engine import Engine
from .environment import compilers
from .errors import ImageBuildFailed, ImageNotFound, ToolMissing

LABEL_PREFIX = "org.torchbuild"
DOCKERFILE = "toolchain.Dockerfile"

# apt packages per profile choice (Debian and Ubuntu names; nvidia/cuda images are Ubuntu)
BLAS_PACKAGES = {
    "mkl": ["libmkl-dev"],
    "openblas": ["libopenblas-dev"],
    "nvpl": ["nvpl-blas", "nvpl-lapack"],
    "blis": ["libblis-dev"],
    "eigen": ["libeigen3-dev"],
    "generic": [],
}
MPI_PACKAGES = {
    "none": [],
    "openmpi": ["libopenmpi-dev", "openmpi-bin"],
    "mpich": ["libmpich-dev", "mpich"],
    "system": [],
}


def apt_packages(spec: BuildSpec) -> list[str]:
    """The profile-dependent apt packages, in a stable order without duplicates."""
    cc, cxx = compilers(spec)
    if spec.compiler == "clang":
        compiler = [cc, "libomp-dev"] if not spec.compiler_version else [cc, f"libomp-{spec.compiler_version}-dev"]
    else:
        compiler = [cc, cxx]
    wanted = [
        *compiler,
        *BLAS_PACKAGES[spec.blas],
        *MPI_PACKAGES[spec.mpi],
        *spec.cuda_packages,
        *spec.apt_packages,
    ]
    return list(dict.fromkeys(wanted))


def build_args(spec: BuildSpec, apt_options: Iterable[str] = ()) -> dict[str, str]:
    return {
        "BASE_IMAGE": spec.base_image,
        "PYTHON_VERSION": spec.python_version,
        "APT_PACKAGES": " ".join(apt_packages(spec)),
        "PYTHON_PACKAGES": " ".join(shlex.quote(p) for p in spec.python_packages),
        "VENV_FLAGS": "--system-site-packages" if spec.python_system_site_packages else "",
        "APT_OPTIONS": " ".join(apt_options),
    }


_SOURCE_PARTS = ("pyproject.toml", "README.md", "src", "configs", "containers", "patches")


def _copy_tree(root: Path, dest: Path) -> None:
    """Copy the torchbuild source the image installs, without caches or bytecode."""
    if not (root / "pyproject.toml").is_file():
        raise ImageBuildFailed(
            f"torchbuild source not found at {root} (the image installs torchbuild from a checkout)",
            hint="run `invoke image` from a torchbuild git checkout",
        )
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".*")
    for part in _SOURCE_PARTS:
        src = root / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=ignore)
        elif src.is_file():
            shutil.copy2(src, dest / part)


def tree_digest(root: Path) -> str:
    """sha256 over relative paths, modes and contents: equal trees give equal digests."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        h.update(f"{rel}\0{path.stat().st_mode & 0o111}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def make_context(spec: BuildSpec, dest: Path, dockerfile: str = DOCKERFILE, extra: Iterable[str] = ()) -> None:
    """Lay out a docker build context: the Dockerfile, extra files from containers/, site CA
    certificates and torchbuild's source."""
    root = data_dir()
    shutil.copy2(root / "containers" / dockerfile, dest / "Dockerfile")
    for name in extra:
        shutil.copy2(root / "containers" / name, dest / name)
    (dest / ".dockerignore").write_text("**/__pycache__\n**/*.pyc\n")
    certs = dest / "certs"
    certs.mkdir()
    (certs / "README").write_text("CA certificates from the profile's ca_certificates key.\n")
    for i, name in enumerate(spec.ca_certificates):
        src = Path(name).expanduser()
        if not src.is_file():
            raise ImageBuildFailed(
                f"ca_certificates: {src} is not a file",
                hint="list PEM files that exist on this host, e.g. /usr/local/share/ca-certificates/site.crt",
            )
        shutil.copyfile(src, certs / f"{i:02d}-{src.stem}.crt")
    _copy_tree(root, dest / "torchbuild-src")


@dataclasses.dataclass(frozen=True)
class ImageResult:
    tag: str
    image_id: str
    cached: bool
    seconds: float
    log: Path | None


def labels(spec: BuildSpec, inputs_hash: str, base_id: str) -> dict[str, str]:
    p = LABEL_PREFIX
    return {
        "org.opencontainers.image.title": "torchbuild toolchain",
        "org.opencontainers.image.base.name": spec.base_image,
        f"{p}.version": __version__,
        f"{p}.profile": spec.profile,
        f"{p}.profile-hash": spec.hash,
        f"{p}.inputs-hash": inputs_hash,
        f"{p}.base-image": spec.base_image,
        f"{p}.base-image-id": base_id,
        f"{p}.torch-version": spec.torch_version,
        f"{p}.python-version": spec.python_version,
        f"{p}.arch": spec.arch.value,
    }


def inputs_hash(arch: Arch, context: Path, args: dict[str, str], base_id: str) -> str:
    """Everything that decides the image's content; equal hash means the image is current."""
    blob = json.dumps(
        {"args": args, "base_id": base_id, "context": tree_digest(context), "platform": arch.docker_platform},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def require_emulation(arch: Arch) -> None:
    """A foreign-arch image builds only where the host can run its binaries (qemu-user binfmt)."""
    if not binfmt_ready(arch):
        raise ToolMissing(
            f"cannot build a {arch} image on this {Arch.host()} host: no {arch.qemu_binfmt} binfmt entry",
            hint="apt-get install qemu-user-static binfmt-support && update-binfmts --enable (see `invoke doctor`)",
        )


def check_platform(engine: Engine, ref: str, arch: Arch) -> None:
    attrs = engine.image_attrs(ref)
    got = attrs.get("Architecture") if attrs else None
    if got != arch.docker_arch:
        raise ImageBuildFailed(
            f"{ref} is {got}, not {arch.docker_arch} ({arch.value})",
            hint=f"use a base image for {arch.docker_platform}, or build one with `invoke base-image --arch {arch}`",
        )


def build_image(
    spec: BuildSpec,
    engine: Engine,
    *,
    logs_dir: Path,
    rebuild: bool = False,
    pull: bool = False,
    apt_options: Iterable[str] = (),
    out: TextIO = sys.stdout,
) -> ImageResult:
    """Build (or find current) the toolchain image for spec; a rerun with nothing changed is a hit."""
    start = time.monotonic()
    platform = spec.arch.docker_platform
    require_emulation(spec.arch)
    if pull or engine.image_attrs(spec.base_image) is None:
        engine.pull(spec.base_image, platform, out=out)
    check_platform(engine, spec.base_image, spec.arch)
    base_id = (engine.image_attrs(spec.base_image) or {}).get("Id", "")
    args = build_args(spec, apt_options)
    with tempfile.TemporaryDirectory(prefix="torchbuild-ctx-") as tmp:
        ctx = Path(tmp)
        make_context(spec, ctx)
        digest = inputs_hash(spec.arch, ctx, args, base_id)
        current = engine.image_attrs(spec.image_tag)
        current_labels = ((current or {}).get("Config") or {}).get("Labels") or {}
        if not rebuild and current_labels.get(f"{LABEL_PREFIX}.inputs-hash") == digest:
            return ImageResult(spec.image_tag, current["Id"] if current else "", True, time.monotonic() - start, None)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        log = logs_dir / f"image-{spec.profile}-{spec.arch.value}-{stamp}.log"
        print(f"building {spec.image_tag} for {platform} from {spec.base_image}", file=out, flush=True)
        print(f"  apt packages: {args['APT_PACKAGES'] or '(none beyond the base set)'}", file=out, flush=True)
        image_id = engine.build(
            ctx,
            tag=spec.image_tag,
            buildargs=args,
            labels=labels(spec, digest, base_id),
            platform=platform,
            nocache=rebuild,
            log=log,
            out=out,
        )
    check_platform(engine, spec.image_tag, spec.arch)
    return ImageResult(spec.image_tag, image_id, False, time.monotonic() - start, log)


def require_image(spec: BuildSpec, engine: Engine) -> dict[str, object]:
    """The inspect data of spec's toolchain image, or ImageNotFound with the command to build it."""
    attrs = engine.image_attrs(spec.image_tag)
    hint = f"build it with `invoke image --profile {spec.profile} --arch {spec.arch}`"
    if attrs is None:
        raise ImageNotFound(f"toolchain image {spec.image_tag} does not exist", hint=hint)
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    built_with = labels.get(f"{LABEL_PREFIX}.version")
    if built_with != __version__:  # the build request format belongs to one torchbuild version
        raise ImageNotFound(
            f"toolchain image {spec.image_tag} carries torchbuild {built_with}, this is {__version__}",
            hint=hint.replace("build it", "rebuild it"),
        )
    return attrs


def manifest_commands(specs: list[BuildSpec], insecure: bool = False) -> list[list[str]]:
    """docker CLI calls that publish one manifest list over the pushed per-arch images."""
    tags = [s.image_tag for s in specs]
    target = specs[0].manifest_tag
    flag = ["--insecure"] if insecure else []
    cmds = [["docker", "manifest", "create", *flag, "--amend", target, *tags]]
    for s in specs:
        cmds.append(
            ["docker", "manifest", "annotate", "--os", "linux", "--arch", s.arch.docker_arch, target, s.image_tag]
        )
    cmds.append(["docker", "manifest", "push", *flag, "--purge", target])
    return cmds


def registry_is_insecure(engine: Engine, image_name: str) -> bool:
    """True when the engine talks plain HTTP to the image's registry (127.0.0.0/8 by default)."""
    import ipaddress

    host = image_name.split("/", 1)[0] if "/" in image_name else ""
    if not host or ("." not in host and ":" not in host and host != "localhost"):
        return False  # Docker Hub
    config = engine.client.info().get("RegistryConfig") or {}
    index = (config.get("IndexConfigs") or {}).get(host)
    if index is not None:
        return not index.get("Secure", True)
    name = host.rsplit(":", 1)[0]
    if name == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return False
    return any(addr in ipaddress.ip_network(c) for c in config.get("InsecureRegistryCIDRs") or [])


def push_images(engine: Engine, specs: list[BuildSpec], out: TextIO = sys.stdout) -> str:
    """Push each per-arch image, then a manifest list naming them all; returns the list's tag."""
    import subprocess

    hint = "set image_name to a registry path (registry.example.org/group/toolchain) and `docker login` to it"
    for s in specs:
        repo, _, tag = s.image_tag.rpartition(":")
        print(f"pushing {s.image_tag}", file=out, flush=True)
        for chunk in engine.client.api.push(repo, tag=tag, stream=True, decode=True):
            if isinstance(chunk, dict) and "error" in chunk:
                raise ImageBuildFailed(f"pushing {s.image_tag} failed: {chunk['error']}", hint=hint)
    for cmd in manifest_commands(specs, insecure=registry_is_insecure(engine, specs[0].image_name)):
        print(f"$ {' '.join(cmd)}", file=out, flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ImageBuildFailed(f"{' '.join(cmd[:3])} failed: {proc.stderr.strip()[-300:]}", hint=hint)
    return specs[0].manifest_tag
