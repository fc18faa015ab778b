"""Apptainer SIFs from the toolchain image: the conversion, the definition, the apptainer-builder image.

Here the SIF is made from the Docker image that `invoke image` built, without re-running the
recipe (recipe.py builds it from the recipe instead, where there is no Docker). A small
definition file, written through spython's Recipe and Singularity writer (DefinitionWriter),
adds what Docker images do not carry: the runscript (the `torchbuild` CLI), `%environment`
(the profile's runtime environment), `%labels` (the image id it came from) and `%help` (the binds).

What makes the conversion cheap (measured in benchmarks/sif_conversion.py against a plain
`docker save` + `apptainer build out.sif docker-archive://image.tar`):

* `docker save` is streamed straight into an OCI image layout with the layers uncompressed
  (`write_oci_layout`), and the definition bootstraps from it (`Bootstrap: oci`). From a
  docker-archive, Apptainer 1.4 first reads the whole tar once, then gzips every layer into
  its blob cache, then gunzips them again to extract the root file system.
* The layout is written where Apptainer's blob cache is (a private APPTAINER_CACHEDIR per
  conversion, `<cachedir>/cache/blob` is an OCI layout): Apptainer finds every blob already
  there and copies nothing. An Apptainer that keeps its cache elsewhere still works; it copies.
* mksquashfs compresses with gzip level 6 instead of its default level 9 (`--mksquashfs-args`,
  Apptainer 1.4+): the same size within 1%, several times faster, and still gzip, which every
  Apptainer and Singularity reads. zstd (`--compression zstd`) is faster again but only
  Apptainer 1.4+ can run such a SIF (see `Compression`).

Apptainer itself (this host's, or the apptainer-builder container this module builds:
`ensure_builder`), which SIF a profile names and its header are the runtime's
(runtime/apptainer.py): the apptainer backend runs steps through them too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import posixpath
import re
import shlex
import shutil
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, ClassVar, TextIO

from spython.main.parse.recipe import Recipe
from spython.main.parse.writers.singularity import SingularityWriter

from torchbuild import __version__
from torchbuild.core.arch import Arch
from torchbuild.core.errors import BuildInterrupted, InsufficientSpace, SifError, UsageError
from torchbuild.core.process import interrupts_unwind
from torchbuild.image.host import inputs_hash, make_context, require_image
from torchbuild.profile.config import DEFAULT_PROFILE, BuildSpec, cache_dir, shareable_profile_text
from torchbuild.profile.config import wanted as comms_wanted
from torchbuild.runtime.apptainer import DEFAULT_SIF, SIF_COMMS, SIF_LABEL, STEP_VARIABLE, Apptainer, sif_filename
from torchbuild.runtime.engine import LABEL_PREFIX, Engine
from torchbuild.runtime.environment import COMMS_DEPS, build_env, comms_runtime_env, prepend_path_lines, runtime_env

BUILDER_REPO = "torchbuild/apptainer-builder"
BUILDER_DOCKERFILE = "apptainer-builder.Dockerfile"
BUILDER_ENTRYPOINT = "apptainer-entrypoint.sh"
TORCHBUILD_EXE = "/opt/venv/bin/torchbuild"
BAKED_PROFILES = "/opt/torchbuild/profiles"
# Where the cache is: the OCI layout (the image size), the root file system Apptainer extracts
# into APPTAINER_TMPDIR (about the image size) and the squashfs it makes there before copying it
# into the SIF (0.42 x the image with gzip:6): measured peak 2.45 x the image with Apptainer
# 1.4.5. Apptainer before 1.4 copies the layout once more into its temp dir (up to one image
# size more). Where the SIF goes: the SIF (0.42 x).
CACHE_FACTOR, OUT_FACTOR = 2.6, 0.6


# --------------------------------------------------------------------------- squashfs compression


@dataclasses.dataclass(frozen=True)
class Compression:
    """The SIF's squashfs compression, given as ALGORITHM or ALGORITHM:LEVEL.

    gzip (default level 6): every Apptainer and Singularity runs it; mksquashfs's own default
    is level 9, which here was several times slower for a SIF under 1% smaller.
    zstd (default level 3): faster to make, about 2% larger than gzip here, but only Apptainer
    1.4 and later open it (earlier Apptainer and SingularityCE up to 4.5 refuse the image:
    "unknown compression algorithm value 6"), and the mount needs Linux 4.14+ with zstd squashfs
    or a squashfuse built with zstd.
    """

    algorithm: str
    level: int

    LEVELS: ClassVar[dict[str, tuple[int, int, int]]] = {"gzip": (1, 9, 6), "zstd": (1, 22, 3)}  # min, max, default

    @classmethod
    def parse(cls, text: str) -> Compression:
        algorithm, _, level_text = text.strip().lower().partition(":")
        if algorithm not in cls.LEVELS:
            raise UsageError(
                f"unknown SIF compression {text!r}",
                hint="use gzip (the default: every Apptainer and Singularity runs it) or zstd (Apptainer 1.4+ only), "
                "optionally with a level: gzip:9, zstd:19",
            )
        low, high, default = cls.LEVELS[algorithm]
        if not level_text:
            return cls(algorithm, default)
        if not level_text.isdigit() or not low <= int(level_text) <= high:
            raise UsageError(f"{algorithm} compression level must be {low} to {high}, not {level_text!r}")
        return cls(algorithm, int(level_text))

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.level}"

    def mksquashfs_args(self) -> str:
        """The value of `apptainer build --mksquashfs-args` (one argv item: Apptainer splits it)."""
        return f"-comp {self.algorithm} -Xcompression-level {self.level}"


DEFAULT_COMPRESSION = "gzip"
# what Apptainer gives without --mksquashfs-args (mksquashfs's gzip default is level 9)
APPTAINER_DEFAULT_COMPRESSION = Compression("gzip", 9)


def build_args(
    sif: Path, deffile: Path, compression: Compression, flags: Iterable[str] = ("--mksquashfs-args",)
) -> list[str]:
    """`apptainer build` arguments, each value its own argv item (never a shell string).
    flags: the build flags this Apptainer has (`Apptainer.build_flags`); without
    --mksquashfs-args the compression must be Apptainer's default. The blob cache stays on
    (no --disable-cache): it is where the OCI layout already is (see build_sif)."""
    args = ["build", "--force"]
    if "--mksquashfs-args" in flags:
        args += ["--mksquashfs-args", compression.mksquashfs_args()]
    elif compression != APPTAINER_DEFAULT_COMPRESSION:
        raise SifError(f"this Apptainer cannot make a {compression} SIF (--mksquashfs-args needs Apptainer 1.4+)")
    return [*args, "--", str(sif), str(deffile)]


# --------------------------------------------------------------------------- docker save -> OCI layout

LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
# docker save writes uncompressed layers; an engine with the containerd image store may write
# them as stored (compressed), so the media type follows the blob's first bytes
LAYER_MAGIC = {b"\x1f\x8b": f"{LAYER_TAR}+gzip", b"\x28\xb5\x2f\xfd": f"{LAYER_TAR}+zstd"}
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


class _ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte chunks (docker-py's image export)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buf = memoryview(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


@dataclasses.dataclass(frozen=True)
class OciLayout:
    path: Path
    manifest_digest: str
    size: int  # bytes of blobs written


# what one archive holds: archive path -> (sha256, size, first bytes) of each regular file
_Blobs = dict[str, tuple[str, int, bytes]]


def write_oci_layout(chunks: Iterable[bytes], dest: Path) -> OciLayout:
    """Write a `docker save` stream (legacy docker-archive, or the OCI-style archive of Docker
    25+) as an OCI image layout in dest: one image, the layers as they come (uncompressed from
    docker save), nothing held in memory but the small JSON files, no intermediate tar.

    Every regular file of the archive is written once, named by its sha256 (so a layer named
    twice, or as a symlink, is one blob); manifest.json then says which are the config and the
    layers, in order. Blobs it does not name are removed."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    files, links, manifest = _save_archive(chunks, blobs)
    if not isinstance(manifest, list) or len(manifest) != 1:
        raise SifError("docker save wrote no manifest.json for exactly one image")
    image, used = _image_manifest(manifest[0], files, links)
    for digest, _, _ in files.values():
        if digest not in used:
            (blobs / digest).unlink(missing_ok=True)
    return _write_index(dest, blobs, image, sum(used.values()))


def _save_archive(chunks: Iterable[bytes], blobs: Path) -> tuple[_Blobs, dict[str, str], Any]:
    """Stream the archive: each regular file becomes a blob (_save_blob), each link is noted
    (archive path -> the path it names), manifest.json is read (None when there is none)."""
    files: _Blobs = {}
    links: dict[str, str] = {}
    manifest: Any = None
    with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks), 1 << 20), mode="r|") as tar:
        for member in tar:
            name = posixpath.normpath(member.name)
            if member.issym() or member.islnk():
                base = posixpath.dirname(name) if member.issym() else ""
                links[name] = posixpath.normpath(posixpath.join(base, member.linkname))
                continue
            src = tar.extractfile(member) if member.isfile() else None
            if src is None:
                continue
            if name == "manifest.json":
                manifest = json.loads(src.read())
                continue
            digest, head = _save_blob(src, blobs)
            files[name] = (digest, member.size, head)
    return files, links, manifest


def _save_blob(src: IO[bytes], blobs: Path) -> tuple[str, bytes]:
    """Copy src into blobs/ under its sha256 (through a partial name); returns the sha256 and
    the first bytes."""
    hasher, head = hashlib.sha256(), b""
    tmp = blobs / f".partial-{uuid.uuid4().hex[:12]}"
    with tmp.open("wb") as f:
        while chunk := src.read(1 << 20):
            head = head or chunk[:4]
            hasher.update(chunk)
            f.write(chunk)
    os.replace(tmp, blobs / hasher.hexdigest())
    return hasher.hexdigest(), head


def _archive_blob(files: _Blobs, links: Mapping[str, str], path: str) -> tuple[str, int, bytes]:
    """The blob an archive path names, through its links."""
    for _ in range(32):  # symlinks to symlinks, never a loop
        if path not in links:
            break
        path = links[path]
    if path not in files:
        raise SifError(f"docker save wrote no {path!r}, which its manifest.json names")
    return files[path]


def _image_manifest(
    entry: Mapping[str, Any], files: _Blobs, links: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, int]]:
    """The OCI image manifest of the archive's one manifest.json entry, and the blobs it uses
    (sha256 -> size)."""
    config = _archive_blob(files, links, posixpath.normpath(str(entry["Config"])))
    layers: list[dict[str, Any]] = []
    used = {config[0]: config[1]}
    for path in entry["Layers"]:
        digest, size, head = _archive_blob(files, links, posixpath.normpath(str(path)))
        media = next((m for magic, m in LAYER_MAGIC.items() if head.startswith(magic)), LAYER_TAR)
        layers.append({"mediaType": media, "digest": f"sha256:{digest}", "size": size})
        used[digest] = size
    image = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": f"sha256:{config[0]}", "size": config[1]},
        "layers": layers,
    }
    return image, used


def _write_index(dest: Path, blobs: Path, image: Mapping[str, Any], blob_bytes: int) -> OciLayout:
    """Write the image manifest as a blob, then oci-layout and index.json naming it."""
    data = json.dumps(image, indent=1).encode()
    manifest_digest = hashlib.sha256(data).hexdigest()
    (blobs / manifest_digest).write_bytes(data)
    (dest / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": OCI_MANIFEST, "digest": f"sha256:{manifest_digest}", "size": len(data)}],
    }
    (dest / "index.json").write_text(json.dumps(index, indent=1))
    return OciLayout(dest, f"sha256:{manifest_digest}", len(data) + blob_bytes)


def baked_profile_path(spec: BuildSpec) -> str:
    return f"{BAKED_PROFILES}/{spec.profile}.yaml"


def sif_build_env(spec: BuildSpec) -> dict[str, str]:
    """%environment, first part: the environment the profile's build sees, with the cache at
    /cache. MAX_JOBS is left out: it is planned on the node that runs the build."""
    env = build_env(spec, cache_root="/cache", jobs=1, backend="apptainer")
    env.pop("MAX_JOBS")
    return {"TORCHBUILD_PROFILE": baked_profile_path(spec), **env}


COMMS_MANIFEST_NAME = "torchbuild-comms.json"  # steps.comms.COMMS_MANIFEST (a higher layer)


def environment_section(spec: BuildSpec, comms: Mapping[str, Any] | None = None) -> str:
    """The %environment body, indented (environment_section_lines)."""
    return "\n".join(f"    {line}" for line in environment_section_lines(spec, comms))


def environment_section_lines(spec: BuildSpec, comms: Mapping[str, Any] | None = None) -> list[str]:
    """The %environment lines: the build's environment, then apart from it the profile's
    runtime_env (what jobs running torch need), then the host_mpi directories first on
    LD_LIBRARY_PATH wherever they are bound in (`apptainer exec --bind DIR ...`); with comms
    (the comms manifest), the carried NCCL's lib/ first and the plugin NCCL should load."""
    lines = ["# the build's environment (invoke build, `torchbuild build`)"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sif_build_env(spec).items()]
    if comms:
        lines.append(f"# the NCCL and aws-ofi-nccl plugin of `invoke comms`, carried in {SIF_COMMS}")
        for k, v in comms_runtime_env(SIF_COMMS, comms).items():
            if k == "LD_LIBRARY_PATH":  # lib/, then the plugin's deps/lib when it has one
                lines += prepend_path_lines(k, v.split(":"))
            else:
                lines.append(f"export {k}={shlex.quote(v)}")
    elif comms_wanted(spec):
        lines += bound_comms_lines(spec)
    runtime = runtime_env(spec)
    if runtime:
        lines.append("# runtime_env: what jobs that run torch need")
        lines += [f"export {k}={shlex.quote(v)}" for k, v in runtime.items()]
    if spec.host_mpi:
        lines.append("# host_mpi: the host's MPI library first, where it is bound in")
        lines += prepend_path_lines("LD_LIBRARY_PATH", spec.host_mpi, only_if_present=True)
    return lines


def bound_comms_lines(spec: BuildSpec) -> list[str]:
    """%environment lines for a comms profile whose SIF carries none: the NCCL and plugin
    `invoke comms --engine apptainer` built at the site are bound at SIF_COMMS at run time
    (`runtime_binds`); its lib/ goes first on LD_LIBRARY_PATH, then the plugin's site
    dependencies (deps/lib) where it has them, and NCCL_NET_PLUGIN names the plugin found there. Without the bind NCCL_NET_PLUGIN names the missing file and a line on
    stderr says what to bind: a job must not quietly fall back to NCCL's sockets."""
    q = shlex.quote(SIF_COMMS)
    lib = f"{q}/lib"
    bind = f"--bind <the prefix `invoke comms --profile {spec.profile}` printed>:{SIF_COMMS}:ro"
    if spec.libfabric_prefix:
        bind += f",{spec.libfabric_prefix}:{spec.libfabric_prefix}:ro"
    warning = shlex.quote(f"torchbuild: no NCCL and aws-ofi-nccl plugin at {SIF_COMMS}: bind them, {bind}")
    return [
        f"# the NCCL and aws-ofi-nccl plugin of `invoke comms`, bound at {SIF_COMMS} at run time",
        f"if [ -f {q}/{COMMS_MANIFEST_NAME} ]; then",
        # deps/lib first here, so that lib/ ends up before it
        *(
            f"    {ln}"
            for ln in prepend_path_lines("LD_LIBRARY_PATH", [f"{SIF_COMMS}/{COMMS_DEPS}"], only_if_present=True)
        ),
        *(f"    {line}" for line in prepend_path_lines("LD_LIBRARY_PATH", [f"{SIF_COMMS}/lib"])),
        f"    for f in {lib}/libnccl-net-ofi.so {lib}/libnccl-net.so; do",
        '        if [ -e "$f" ]; then NCCL_NET_PLUGIN="$f"; export NCCL_NET_PLUGIN; break; fi',
        "    done",
        "else",
        f"    NCCL_NET_PLUGIN={lib}/libnccl-net.so; export NCCL_NET_PLUGIN",
        f'    if [ -z "${{{STEP_VARIABLE}:-}}" ]; then echo {warning} >&2; fi',
        "fi",
    ]


def runtime_hash(spec: BuildSpec, comms: Mapping[str, Any] | None = None) -> str:
    """What of the runtime keys the SIF bakes in (its %environment and the comms it carries),
    as a label: a SIF whose label differs is converted again even when the image is the same."""
    data: dict[str, Any] = {"runtime_env": dict(spec.runtime_env), "host_mpi": list(spec.host_mpi)}
    if comms:
        data["comms"] = comms.get("key", "")
    blob = json.dumps(data, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def help_text(spec: BuildSpec) -> str:
    return f"""torchbuild toolchain SIF: profile {spec.profile} (PyTorch {spec.torch_version}, {spec.arch.value},
Python {spec.python_version}{", CUDA " + spec.cuda_version if spec.cuda else ""}). The runscript is the torchbuild CLI.

Binds (--bind HOST:CONTAINER,...):
  /src    the PyTorch source tree, read-write (patches are applied there, build/ is written there)
  /cache  ccache, pip cache and logs; keep it between runs so rebuilds hit ccache
  /out    optional: wheel, manifest and logs (default: ./out in the current directory)

Examples:
  apptainer run --bind $PWD/pytorch:/src,$HOME/.cache/torchbuild:/cache torch-build.sif build --preflight
  apptainer run --bind $PWD/pytorch:/src,$HOME/.cache/torchbuild:/cache,$PWD/out:/out torch-build.sif build
  apptainer run --nv --bind ... torch-build.sif build    # GPU node: --nv brings in the NVIDIA driver
  apptainer run torch-build.sif build --help             # every build option
  apptainer run torch-build.sif config                   # the baked profile and its environment
"""


def check_definition_paths(paths: Iterable[Path], *, layout: Path | None = None) -> None:
    """Definition files name paths unquoted (%files, From:): refuse whitespace, and ':' or '@'
    in an OCI layout's path (Apptainer reads `DIR:TAG` and `DIR@DIGEST` there)."""
    for p in [*paths, *([layout] if layout else [])]:
        if any(c.isspace() for c in str(p)) or (p == layout and any(c in str(p) for c in ":@")):
            raise SifError(
                f"{p}: Apptainer definition files cannot name paths with whitespace"
                + (" (nor an OCI layout with ':' or '@')" if p == layout else ""),
                hint="set cache_dir to a path without spaces, ':' or '@' (--set cache_dir=...)",
            )


def metadata_files(
    spec: BuildSpec, profile_file: Path, comms: tuple[Path, Mapping[str, Any]] | None = None
) -> list[list[str]]:
    """%files: the resolved profile where `torchbuild` in the SIF finds it, and the comms prefix."""
    files = [[str(profile_file), baked_profile_path(spec)]]
    if comms:
        files.append([str(comms[0]), SIF_COMMS])
    return files


STAGE = "torchbuild"


class DefinitionWriter(SingularityWriter):  # type: ignore[misc]
    """spython's Singularity writer for one stage, plus what it does not write: a bootstrap
    other than `docker` (header), comments, %help, `%post -c SHELL`, and %environment lines
    that are not assignments (comments, conditional PATH prepends): spython prefixes every
    environment entry with `export`, so only NAME=VALUE entries get it here. Its %startscript
    (a copy of the runscript) is left out; sections are separated by a blank line and their
    lines indented."""

    _ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")

    def __init__(
        self,
        recipe: Recipe,
        *,
        header: Sequence[str] = (),
        help_text: str = "",
        comments: Sequence[str] = (),
        post_interpreter: str = "",
    ) -> None:
        super().__init__({STAGE: recipe})
        self.header, self.help_text, self.comments = list(header), help_text, list(comments)
        self.post_interpreter = post_interpreter

    def _create_section(self, attribute: str, name: str | None = None, stage: str | None = None) -> list[str]:
        if attribute != "environ":
            return list(super()._create_section(attribute, name, stage))
        lines = self.recipe[self.stage].environ
        return ["%environment", *(f"export {x}" if self._ASSIGNMENT.match(x) else x for x in lines)] if lines else []

    def _check_one_line(self) -> None:
        """A line break in a value would start a line of its own in the definition, where
        `%post` or `%runscript` opens a section Apptainer runs: refused."""
        recipe = self.recipe[STAGE]
        values = [*self.header, *self.comments, *recipe.environ, str(recipe.fromHeader or "")]
        values += [item for pair in [*recipe.labels, *recipe.files] for item in pair]
        for value in values:
            if "\n" in value or "\r" in value:
                raise SifError(
                    f"a value with a line break cannot go into an Apptainer definition: {value!r}",
                    hint="remove the line break from the profile value (labels, paths, environment, base_image)",
                )

    def convert(self, runscript: str = TORCHBUILD_EXE, force: bool = True) -> str:
        self._check_one_line()
        lines = super().convert(runscript=runscript, force=force).splitlines()
        stage = lines.index(f"Stage: {STAGE}")  # after spython's "Bootstrap: docker", "From: ..."
        body: list[str] = []
        skip = False
        for line in lines[stage + 1 :]:
            if not line.strip():  # spython's own spacing; sections get one blank line each
                continue
            if line.startswith("%"):
                skip = line == "%startscript"
                if line == "%post" and self.post_interpreter:
                    line = f"%post -c {self.post_interpreter}"
                if not skip:
                    body.append("")
            if not skip:
                body.append(line if line.startswith("%") else f"    {line}")
        text = [*(f"# {c}" for c in self.comments), *(self.header or lines[:stage]), *body]
        if self.help_text:
            text += ["", "%help", *(f"    {x}" if x else "" for x in self.help_text.splitlines())]
        return "\n".join(text) + "\n"


def definition(
    spec: BuildSpec,
    *,
    archive: Path,
    profile_file: Path,
    image_id: str,
    compression: Compression = APPTAINER_DEFAULT_COMPRESSION,
    comms: tuple[Path, Mapping[str, Any]] | None = None,
) -> str:
    """The definition file, written through spython's Recipe and Singularity writer: bootstrap
    from archive, the OCI layout directory the image was saved to (`write_oci_layout`), and
    add metadata only (no %post); comms: (the host prefix, its manifest) of `invoke comms`,
    copied to SIF_COMMS."""
    check_definition_paths([profile_file, *([comms[0]] if comms else [])], layout=archive)
    manifest = comms[1] if comms else None
    recipe = Recipe()
    recipe.fromHeader = str(archive)
    recipe.files = metadata_files(spec, profile_file, comms)
    recipe.environ = environment_section_lines(spec, manifest)
    recipe.labels = [
        [f"{SIF_LABEL}.route", "image"],  # recipe.py's SIFs say "recipe"
        [f"{SIF_LABEL}.image", spec.image_tag],
        [f"{SIF_LABEL}.image-id", image_id],
        [f"{SIF_LABEL}.profile-hash", spec.hash],
        [f"{SIF_LABEL}.torchbuild-version", __version__],
        [f"{SIF_LABEL}.runtime-hash", runtime_hash(spec, manifest)],
        [f"{SIF_LABEL}.compression", str(compression)],
    ]
    writer = DefinitionWriter(recipe, header=["Bootstrap: oci", f"From: {archive}"], help_text=help_text(spec))
    return writer.convert()


def builder_tag(arch: Arch | None = None) -> str:
    return f"{BUILDER_REPO}:{__version__}-{(arch or Arch.host()).value}"


def ensure_builder(spec: BuildSpec, engine: Engine, *, rebuild: bool = False, out: TextIO = sys.stdout) -> str:
    """The apptainer-builder image for this host's arch, built on first use (then a label check)."""
    tag = builder_tag()
    arch = Arch.host()
    if engine.image_attrs(spec.sif_builder_base) is None:
        engine.pull(spec.sif_builder_base, arch.docker_platform, out=out)
    base_id = (engine.image_attrs(spec.sif_builder_base) or {}).get("Id", "")
    args = {"BASE_IMAGE": spec.sif_builder_base}
    with tempfile.TemporaryDirectory(prefix="torchbuild-builder-") as tmp:
        ctx = Path(tmp)
        make_context(spec, ctx, dockerfile=BUILDER_DOCKERFILE, extra=[BUILDER_ENTRYPOINT])
        digest = inputs_hash(arch, ctx, args, base_id)
        current = ((engine.image_attrs(tag) or {}).get("Config") or {}).get("Labels") or {}
        if not rebuild and current.get(f"{LABEL_PREFIX}.inputs-hash") == digest:
            return tag
        log = cache_dir(spec) / "logs" / f"apptainer-builder-{time.strftime('%Y%m%d-%H%M%S')}.log"
        print(f"building {tag} from {spec.sif_builder_base}", file=out, flush=True)
        engine.build(
            ctx,
            tag=tag,
            buildargs=args,
            labels={
                "org.opencontainers.image.title": "torchbuild apptainer-builder",
                f"{LABEL_PREFIX}.version": __version__,
                f"{LABEL_PREFIX}.inputs-hash": digest,
            },
            platform=arch.docker_platform,
            nocache=rebuild,
            log=log,
            out=out,
        )
    return tag


# --------------------------------------------------------------------------- conversion


def space_needed(image_size: int, cache: Path, out_dir: Path) -> dict[Path, int]:
    """Bytes needed per file system (keyed by an existing path on it) for one conversion."""
    need: dict[int, tuple[Path, int]] = {}
    for path, n in ((cache, int(image_size * CACHE_FACTOR)), (out_dir, int(image_size * OUT_FACTOR))):
        probe = _existing(path)
        dev = probe.stat().st_dev
        prev = need.get(dev, (probe, 0))
        need[dev] = (prev[0], prev[1] + n)
    return dict(need.values())


def check_space(needs: Mapping[Path, int], free: Callable[[Path], int] = lambda p: shutil.disk_usage(p).free) -> None:
    for path, n in needs.items():
        have = free(path)
        if have < n:
            raise InsufficientSpace(
                f"converting needs {n / 2**30:.1f} GiB free on the file system of {path}, "
                f"which has {have / 2**30:.1f} GiB; nothing was written"
            )


def _existing(path: Path) -> Path:
    for p in [path, *path.parents]:
        if p.exists():
            return p
    return Path("/")


@dataclasses.dataclass(frozen=True)
class SifResult:
    path: Path
    cached: bool
    seconds: float
    size: int
    image_size: int
    save_seconds: float = 0.0
    build_seconds: float = 0.0
    log: Path | None = None
    link: Path | None = None  # torch-build.sif, for the default profile
    compression: str = ""  # the squashfs compression, as ALGORITHM:LEVEL


def choose_compression(requested: Compression | None, flags: Iterable[str]) -> Compression:
    """requested (None: the default) as this Apptainer can make it: without --mksquashfs-args
    (before Apptainer 1.4) the default falls back to Apptainer's own gzip level 9, and any
    other request is refused."""
    settable = "--mksquashfs-args" in flags
    if requested is None:
        return Compression.parse(DEFAULT_COMPRESSION) if settable else APPTAINER_DEFAULT_COMPRESSION
    if not settable and requested != APPTAINER_DEFAULT_COMPRESSION:
        raise SifError(
            f"this Apptainer cannot make a {requested} SIF: --mksquashfs-args needs Apptainer 1.4 or later",
            hint="leave --compression out (its default gzip level 9 is used), or use --apptainer docker",
        )
    return requested


def build_sif(
    spec: BuildSpec,
    engine: Engine,
    apptainer: Apptainer,
    out_dir: Path,
    *,
    rebuild: bool = False,
    comms: tuple[Path, Mapping[str, Any]] | None = None,
    compression: str = "",
    out: TextIO = sys.stdout,
) -> SifResult:
    """Convert spec's toolchain image into out_dir/torch-build-<profile>-<arch>.sif (carrying
    the prefix `invoke comms` built, when given), its squashfs compressed as compression says
    (ALGORITHM[:LEVEL], see Compression; empty: the default).

    Nothing changes when the SIF already comes from the current image with the same runtime
    keys and compression (a label check). The SIF is written under a temporary name and renamed
    into place, so a failed or interrupted conversion leaves the previous SIF (or none), never a
    partial one.
    """
    start = time.monotonic()
    requested = Compression.parse(compression) if compression else None
    attrs = require_image(spec, engine)
    image_id, image_size = str(attrs["Id"]), int(attrs.get("Size") or 0)  # type: ignore[call-overload]
    out_dir = out_dir.resolve()
    final = out_dir / sif_filename(spec)
    current = None if rebuild else _current_sif(spec, apptainer, final, image_id, image_size, requested, comms, start)
    if current is not None:
        return current
    job = _plan_conversion(spec, apptainer, image_size, final, requested)
    save_seconds, build_seconds = _convert(spec, engine, apptainer, job, image_id, image_size, comms, out)
    return _converted_sif(spec, final, start, image_size, save_seconds, build_seconds, job)


def _converted_sif(
    spec: BuildSpec,
    final: Path,
    start: float,
    image_size: int,
    save_seconds: float,
    build_seconds: float,
    job: _Conversion,
) -> SifResult:
    """The result for the SIF just converted from the image at final."""
    link = link_default(spec, final)
    return SifResult(
        final,
        False,
        time.monotonic() - start,
        final.stat().st_size,
        image_size,
        save_seconds,
        build_seconds,
        job.log,
        link,
        str(job.chosen),
    )


def _current_sif(
    spec: BuildSpec,
    apptainer: Apptainer,
    final: Path,
    image_id: str,
    image_size: int,
    requested: Compression | None,
    comms: tuple[Path, Mapping[str, Any]] | None,
    start: float,
) -> SifResult | None:
    """The result for a SIF at final already made from the image (image_id) with the same runtime keys, comms and
    compression; None when there is none or it is not current."""
    if not final.exists():
        return None
    chosen = choose_compression(requested, apptainer.build_flags())
    if not _sif_is_current(spec, apptainer.labels(final), image_id, chosen, comms):
        return None
    link = link_default(spec, final)
    size = final.stat().st_size
    return SifResult(final, True, time.monotonic() - start, size, image_size, link=link, compression=str(chosen))


def _sif_is_current(
    spec: BuildSpec,
    labels: Mapping[str, str],
    image_id: str,
    chosen: Compression,
    comms: tuple[Path, Mapping[str, Any]] | None,
) -> bool:
    """Whether a SIF with these labels comes from the current image, with this torchbuild, the
    same runtime keys and compression."""
    return (
        labels.get(f"{SIF_LABEL}.image-id") == image_id
        and labels.get(f"{LABEL_PREFIX}.version") == __version__
        and labels.get(f"{SIF_LABEL}.runtime-hash") == runtime_hash(spec, comms[1] if comms else None)
        and labels.get(f"{SIF_LABEL}.compression") == str(chosen)
    )


@dataclasses.dataclass(frozen=True)
class _Conversion:
    """Where one conversion works and writes, and how it compresses."""

    root: Path  # the cache's apptainer directory
    final: Path
    work: Path  # this conversion's own directory under root, removed at the end
    partial: Path  # the SIF being written, next to final
    log: Path
    flags: frozenset[str]  # this Apptainer's build flags
    requested: Compression | None
    chosen: Compression

    # A private Apptainer cache per conversion whose blob cache (an OCI layout at
    # <cachedir>/cache/blob) is the image's layout: Apptainer finds every blob there and copies
    # none (a shared cache kept a gzipped copy of every image). Its temp dir (the extracted root
    # file system) is private too: a conversion stopped with the container leaves nothing behind.
    @property
    def apptainer_cache(self) -> Path:
        return self.work / "apptainer-cache"

    @property
    def apptainer_tmp(self) -> Path:
        return self.work / "apptainer-tmp"

    @property
    def layout_dir(self) -> Path:
        return self.apptainer_cache / "cache" / "blob"

    def env(self) -> dict[str, str]:
        env = {}
        for var, d in (("CACHEDIR", self.apptainer_cache), ("TMPDIR", self.apptainer_tmp)):
            env[f"APPTAINER_{var}"] = env[f"SINGULARITY_{var}"] = str(d)
        return env


def _plan_conversion(
    spec: BuildSpec, apptainer: Apptainer, image_size: int, final: Path, requested: Compression | None
) -> _Conversion:
    """Check the free space, choose the compression and name this conversion's places (making
    the output and log directories)."""
    out_dir = final.parent
    root = (cache_dir(spec) / "apptainer").resolve()
    check_space(space_needed(image_size, root, out_dir))
    flags = apptainer.build_flags()  # after the check: the builder container writes its home
    chosen = choose_compression(requested, flags)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    work = root / "work" / run_id
    partial = out_dir / f".{final.name}.partial-{run_id}"
    log = cache_dir(spec) / "logs" / f"sif-{spec.profile}-{spec.arch.value}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    return _Conversion(root, final, work, partial, log, frozenset(flags), requested, chosen)


def _convert(
    spec: BuildSpec,
    engine: Engine,
    apptainer: Apptainer,
    job: _Conversion,
    image_id: str,
    image_size: int,
    comms: tuple[Path, Mapping[str, Any]] | None,
    out: TextIO,
) -> tuple[float, float]:
    """Save the image as an OCI layout, write the definition, build the SIF and rename it into
    place; returns the seconds saving and building took. Whatever happens, the partial SIF and
    the work directory are removed; an interrupt is BuildInterrupted."""
    try:
        with interrupts_unwind():
            job.work.mkdir(parents=True)
            job.apptainer_tmp.mkdir()
            t0 = time.monotonic()
            print(
                f"saving {spec.image_tag} ({image_size / 2**30:.2f} GiB) as an OCI layout in {job.work}",
                file=out,
                flush=True,
            )
            layout = write_oci_layout(engine.client.api.get_image(spec.image_tag), job.layout_dir)
            save_seconds = time.monotonic() - t0
            deffile = _write_definition(spec, job, layout, image_id, comms)
            build_seconds = _apptainer_build(apptainer, job, deffile, comms, out)
            os.replace(job.partial, job.final)
    except KeyboardInterrupt:
        raise BuildInterrupted(f"conversion interrupted; no {job.final.name} was written") from None
    finally:
        job.partial.unlink(missing_ok=True)
        remove_tree(job.work)
    return save_seconds, build_seconds


def _write_definition(
    spec: BuildSpec,
    job: _Conversion,
    layout: OciLayout,
    image_id: str,
    comms: tuple[Path, Mapping[str, Any]] | None,
) -> Path:
    """Write the profile and the definition file into the work directory; returns the definition."""
    profile_file = job.work / f"{spec.profile}.yaml"
    profile_file.write_text(shareable_profile_text(spec))
    deffile = job.work / "torch-build.def"
    deffile.write_text(
        definition(
            spec,
            archive=layout.path,
            profile_file=profile_file,
            image_id=image_id,
            compression=job.chosen,
            comms=comms,
        )
    )
    return deffile


def _apptainer_build(
    apptainer: Apptainer,
    job: _Conversion,
    deffile: Path,
    comms: tuple[Path, Mapping[str, Any]] | None,
    out: TextIO,
) -> float:
    """Run `apptainer build` into the partial SIF; SifError unless it made one. Returns its seconds."""
    if job.requested is None and job.chosen == APPTAINER_DEFAULT_COMPRESSION:
        print(
            "this Apptainer has no --mksquashfs-args (1.4+): its default gzip level 9 compresses the SIF"
            f" (slower than {DEFAULT_COMPRESSION}:{Compression.parse(DEFAULT_COMPRESSION).level})",
            file=out,
            flush=True,
        )
    print(f"converting with {apptainer.description} (squashfs {job.chosen})", file=out, flush=True)
    t1 = time.monotonic()
    rc = apptainer.call(
        build_args(job.partial, deffile, job.chosen, job.flags),
        env=job.env(),
        paths=[job.root, job.final.parent, *([comms[0]] if comms else [])],
        out=out,
        log=job.log,
    )
    build_seconds = time.monotonic() - t1
    if rc != 0 or not job.partial.is_file():
        raise SifError(f"apptainer build exited with {rc} (log: {job.log})")
    return build_seconds


def remove_tree(path: Path) -> None:
    """Remove path and everything under it, also what an unprivileged extraction left without
    write permission (directories of the image that are read-only); never raises."""

    def retry(func: Callable[[str], object], name: str, _exc: object) -> None:
        try:
            if name != str(path):  # never the permissions of what holds path
                os.chmod(os.path.dirname(name), 0o700)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, 0o700)
                shutil.rmtree(name, ignore_errors=True)
            else:
                func(name)
        except OSError:
            pass

    if not os.path.lexists(path):
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)


def link_default(spec: BuildSpec, final: Path) -> Path | None:
    """torch-build.sif names the default profile's SIF for this host (a hard link, replaced
    atomically); returns it, or None for other profiles and arches."""
    if spec.profile != DEFAULT_PROFILE or spec.arch != Arch.host():
        return None
    link = final.parent / DEFAULT_SIF
    if link.exists() and os.path.samefile(link, final):
        return link  # (rename(2) over another link to the same file does nothing and keeps the source)
    tmp = final.parent / f".{DEFAULT_SIF}.partial-{uuid.uuid4().hex[:8]}"
    try:
        os.link(final, tmp)
    except OSError:
        shutil.copy2(final, tmp)
    os.replace(tmp, link)
    return link
