"""The toolchain SIF from the recipe, with no Docker anywhere: `invoke sif --from-recipe`.

Most HPC login and compute nodes have Apptainer and no Docker. This route reads the same
recipe `invoke image` builds (containers/toolchain.Dockerfile, in the same build context with
the profile's package lists, CA certificates and torchbuild's source) with spython's Docker
parser, and writes an Apptainer definition with spython's Singularity writer (sif.DefinitionWriter):

* ARG values come from the profile (image.build_args), exported in %post as Docker exports them
  to RUN; ENV is exported in %post too (spython writes bare assignments, which apt and pip
  would not see) and lands in %environment;
* COPY becomes %files from the build context, by absolute path;
* SHELL ["/bin/bash", "-o", "pipefail", "-c"] (which spython does not know) becomes
  `%post -c /bin/bash` with `set -o pipefail`;
* each RUN runs in a subshell whose failure ends %post, as a failed RUN ends a Docker build;
* FROM becomes the bootstrap the profile asks for (`sif_bootstrap`): `docker` pulls base_image
  through a registry, `debootstrap` installs a Debian or Ubuntu suite from a package mirror;
* WORKDIR and CMD do not reach the runscript: it is the converted SIF's (`exec torchbuild "$@"`,
  started in the caller's directory), and so are the labels, %environment and %help;
* a profile with `invoke comms` builds (NCCL from source, aws-ofi-nccl) gets their tools
  (image.comms_packages) but no NCCL or plugin: those are built at the site, in the SIF against
  the site's libfabric (`invoke comms --in-container --engine apptainer`), and bound in at run
  time at SIF_COMMS (sif.bound_comms_lines), so the SIF stays site-independent.

Instructions the parser has no translation for (USER, ONBUILD, SHELL forms other than the one
above, ARG without a value, a second FROM: several stages, options such as COPY --from= or
RUN --mount=, the JSON form of RUN, COPY and ADD, here-documents `RUN <<EOF`) are a RecipeError
naming the line, never a silently different SIF. The recipe is read as UTF-8 text of at most
RECIPE_LIMIT (safeio); other bytes are a RecipeError naming the line.
Apptainer builds unprivileged: as root on a host nothing is needed; otherwise `--fakeroot`
(always in the apptainer-builder container), which for debootstrap needs the caller in
/etc/subuid (a root-mapped namespace cannot unpack a base system), and for a docker bootstrap
at least user namespaces.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import io
import itertools
import json
import os
import re
import shlex
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import docker.utils
from spython.logger import bot
from spython.logger.message import ERROR as SPYTHON_ERRORS_ONLY
from spython.main.parse.parsers.docker import DockerParser
from spython.main.parse.recipe import Recipe

from torchbuild import __version__
from torchbuild.core.arch import Arch
from torchbuild.core.errors import BuildInterrupted, PathError, SifError, UsageError, named_os_errors
from torchbuild.core.errors import (
    RecipeError as RecipeError,  # defined in errors.py (its registry); importable here too
)
from torchbuild.core.glibc import base_family
from torchbuild.core.process import interrupts_unwind
from torchbuild.core.safeio import RECIPE_LIMIT, loads_json, read_text
from torchbuild.image.host import build_args, image_context, labels, tree_digest
from torchbuild.profile.config import BuildSpec, cache_dir, shareable_profile_text
from torchbuild.runtime.apptainer import SIF_LABEL, Apptainer, DockerApptainer, sif_filename
from torchbuild.sif.host import (
    DEFAULT_COMPRESSION,
    Compression,
    DefinitionWriter,
    SifResult,
    check_definition_paths,
    check_space,
    choose_compression,
    environment_section_lines,
    help_text,
    link_default,
    metadata_files,
    remove_tree,
    runtime_hash,
    space_needed,
)
from torchbuild.sif.host import build_args as apptainer_build_args

# containers/toolchain.Dockerfile (toolchain-dnf.Dockerfile on an RPM base), as image_context lays it out
RECIPE = "Dockerfile"
# the root file system a cpu toolchain recipe installs (measured 1.7 GiB as a Docker image): the
# free space a build needs is sif.space_needed of it (the root file system, its squashfs, the SIF)
RECIPE_SIZE_ESTIMATE = 2 << 30


# --------------------------------------------------------------------------- bootstrap

DEBIAN_MIRROR = "http://deb.debian.org/debian"
UBUNTU_MIRROR = "http://archive.ubuntu.com/ubuntu"
UBUNTU_PORTS = "http://ports.ubuntu.com/ubuntu-ports"
# Ubuntu releases by version, for base_image ubuntu:<version>
UBUNTU_SUITES = {"20.04": "focal", "22.04": "jammy", "24.04": "noble", "24.10": "oracular", "25.04": "plucky"}
DEBIAN_SUITES = {"11": "bullseye", "12": "bookworm", "13": "trixie", "14": "forky"}


@dataclasses.dataclass(frozen=True)
class Bootstrap:
    """Where the SIF's root file system comes from."""

    agent: str  # docker | debootstrap
    source: str  # docker: the image reference; debootstrap: the suite
    mirror: str = ""
    components: tuple[str, ...] = ()

    def header(self) -> list[str]:
        if self.agent == "docker":
            return ["Bootstrap: docker", f"From: {self.source}"]
        return ["Bootstrap: debootstrap", f"OSVersion: {self.source}", f"MirrorURL: {self.mirror}"]

    def prelude(self) -> list[str]:
        """%post lines before the recipe's own: a debootstrapped system has only `main` in its
        apt sources; the profile's packages may need the other components (non-free CUDA)."""
        if self.agent != "debootstrap":
            return []
        line = shlex.quote(f"deb {self.mirror} {self.source} {' '.join(self.components)}")
        return [
            "# debootstrap writes `main` only; the components the profile's packages need:",
            f"printf '%s\\n' {line} > /etc/apt/sources.list || exit $?",
        ]

    def __str__(self) -> str:
        if self.agent == "docker":
            return f"docker://{self.source}"
        return f"debootstrap {self.source} {' '.join(self.components)} from {self.mirror}"


def _suite_of(base_image: str) -> tuple[str, str]:
    """(distribution, suite) a base image name says, or ("", "") when it says none. The
    reference is split by docker-py's rule: a registry's port is not a tag; with a digest, the
    tag (if any) stays in the repository part ('debian:trixie@sha256:...')."""
    repo, tag = docker.utils.parse_repository_tag(base_image)
    name = repo.rpartition("/")[2]
    if tag is None or tag.startswith("sha256:"):
        name, _, tag = name.partition(":")
    if name == "ubuntu":
        return "ubuntu", UBUNTU_SUITES.get(tag, tag if tag.isalpha() else "")
    if name == "debian":
        tag = tag.split("-")[0]
        return "debian", DEBIAN_SUITES.get(tag, tag if tag.isalpha() else "")
    if base_image.startswith("torchbuild/base:"):  # `invoke base-image`: torchbuild/base:<suite>-<arch>
        return "debian", tag.rsplit("-", 1)[0]
    return "", ""


def bootstrap_for(spec: BuildSpec) -> Bootstrap:
    """The bootstrap the profile asks for; debootstrap's suite, mirror and components default
    to what base_image names (debian:trixie, ubuntu:24.04, torchbuild/base:trixie-x86_64)."""
    if spec.sif_bootstrap == "docker":
        return Bootstrap("docker", spec.base_image)
    if base_family(spec.base_image) == "rpm":
        raise UsageError(
            f"sif_bootstrap debootstrap: base_image {spec.base_image!r} is an RPM (dnf) distribution, "
            "and debootstrap makes Debian and Ubuntu systems only",
            hint="set sif_bootstrap=docker (Apptainer pulls the base image itself)",
        )
    distro, suite = _suite_of(spec.base_image)
    suite = spec.sif_suite or suite
    if not suite:
        raise UsageError(
            f"sif_bootstrap debootstrap: cannot tell the suite from base_image {spec.base_image!r}",
            hint="set it, e.g. --set sif_suite=trixie (or noble, with --set sif_mirror=http://archive.ubuntu.com/ubuntu)",
        )
    if not distro:
        distro = "ubuntu" if suite in UBUNTU_SUITES.values() else "debian"
    if distro == "ubuntu":
        mirror = UBUNTU_PORTS if spec.arch == Arch.AARCH64 else UBUNTU_MIRROR
        components: tuple[str, ...] = ("main", "universe")
    else:
        mirror, components = DEBIAN_MIRROR, ("main", "contrib", "non-free")
    return Bootstrap("debootstrap", suite, spec.sif_mirror or mirror, tuple(spec.sif_components) or components)


# --------------------------------------------------------------------------- Dockerfile -> Recipe


@dataclasses.dataclass
class Translation:
    """The recipe as spython parsed it, and what torchbuild translated around it."""

    recipe: Any  # spython.main.parse.recipe.Recipe
    shell: list[str]  # SHELL's interpreter and options, [] when the recipe sets none
    notes: list[str]  # where this definition differs from the Docker build, for its comment


# Dockerfile instructions spython's parser has no translation for (it would paste them into
# %post as commands): refused by name.
UNTRANSLATABLE = ("USER", "ONBUILD")
# instructions whose options (COPY --from=stage, --chown, RUN --mount=...) spython drops or
# pastes into %post, whose JSON form it pastes as text, and that can take a here-document
WITH_OPTIONS = ("RUN", "COPY", "ADD")
# a here-document word as BuildKit finds one (`<<EOF`, `<<-"EOF"`, `2<<EOF`; not `<<<` nor `$((1<<3))`)
HEREDOC = re.compile(r"\d*<<-?[\"']?[^<\s\"']")


class ToolchainParser(DockerParser):  # type: ignore[misc]
    """spython's DockerParser with ARG values from the profile (args), ENV exported in %post,
    each RUN in a subshell, COPY sources from the build context (context) by absolute path,
    SHELL kept for %post -c, and RecipeError, naming the line, for what has no translation."""

    def __init__(self, dockerfile: Path, context: Path, args: Mapping[str, str]) -> None:
        self.dockerfile, self.context, self.build_args = dockerfile, context, dict(args)
        self.shell: list[str] = []
        self.number = 0
        self.run_open = False  # inside a RUN that continues on the next line
        self.stages = 0  # FROM instructions seen
        self.instruction = ""  # the instruction the current line belongs to
        # read bounded and strictly as UTF-8 (spython's own read is neither), lines split as
        # open() splits them
        text = read_text(dockerfile, RECIPE_LIMIT, "the toolchain recipe", RecipeError)
        previous, bot.level = bot.level, SPYTHON_ERRORS_ONLY  # its warnings (ARG, COPY) are not for users
        try:
            super().__init__(None, load=False)
            self.filename = str(dockerfile.absolute())
            self.recipe = {self.active_layer: Recipe(self.filename)}
            self.lines = io.StringIO(text, newline=None).readlines()
            self.parse()
        finally:
            bot.level = previous

    def parse(self) -> Any:
        parser, previous = None, None
        for number, line in enumerate(self.lines, 1):
            self.number = number
            parser = self._get_mapping(line, parser, previous)
            if parser:
                parser(line)
            previous = line
        return self.recipe

    def _where(self) -> str:
        return f"{self.dockerfile.name}:{self.number}"

    def _clean_line(self, line: Any) -> str:
        """The line as Docker reads it for a continuation: a comment only where `#` starts it.
        spython's cuts every line at its first `#`, so a RUN line such as `n="${v#x}"; \\` looked
        unended, and its RUN's subshell was closed in the middle of the command."""
        text = str(line or "").strip()
        return "" if text.startswith("#") else text

    def _get_mapping(self, line: Any, parser: Any = None, previous: Any = None) -> Any:
        continued = self._clean_line(previous).endswith("\\")
        words = line.split() if isinstance(line, str) else line
        instruction = words[0].upper() if words and not continued else ""
        if instruction == "SHELL":
            return self._shell
        if instruction in UNTRANSLATABLE:
            raise RecipeError(
                f"{self._where()}: spython cannot translate {instruction} into an Apptainer definition",
                hint="drop it from the recipe, or build with Docker and convert: `invoke image` then `invoke sif`",
            )
        if instruction == "FROM":
            self.stages += 1
            if self.stages > 1:
                raise RecipeError(
                    f"{self._where()}: a second FROM: a multi-stage recipe has no translation (a definition "
                    "has one %post, and COPY --from= another stage has no %files form)",
                    hint="keep the recipe to one stage, or build with Docker and convert: `invoke image` then "
                    "`invoke sif`",
                )
        if instruction:
            self.instruction = instruction
        if instruction in WITH_OPTIONS:
            self._refuse_forms(instruction, words[1:], line)
        elif continued and self.instruction in WITH_OPTIONS:  # a here-document may start on any line
            self._refuse_heredoc(self.instruction, words)
        return super()._get_mapping(line, parser, previous)

    def _refuse_forms(self, instruction: str, words: list[str], line: str) -> None:
        """RecipeError for what spython would drop or paste into %post as text: options, the
        JSON form, a here-document."""
        options = list(itertools.takewhile(lambda w: w.startswith("--"), words))
        if options:
            raise RecipeError(
                f"{self._where()}: {instruction} {' '.join(options)}: options of {instruction} have no "
                "translation into an Apptainer definition (spython drops or misplaces them)",
                hint=f"write the {instruction} without options, or build with Docker and convert: "
                "`invoke image` then `invoke sif`",
            )
        rest = line.strip()[len(instruction) :].strip()
        if rest.startswith("["):
            try:
                exec_form = isinstance(loads_json(rest), list)
            except ValueError:
                exec_form = False
            if exec_form:
                raise RecipeError(
                    f"{self._where()}: the JSON form of {instruction} ({rest}) has no translation into an "
                    "Apptainer definition",
                    hint=f"write it in the shell form: {instruction} command args",
                )
        self._refuse_heredoc(instruction, words)

    def _refuse_heredoc(self, instruction: str, words: list[str]) -> None:
        heredoc = next((w for w in words if HEREDOC.match(w)), None)
        if heredoc is not None:
            raise RecipeError(
                f"{self._where()}: the here-document {instruction} {heredoc} has no translation into an "
                "Apptainer definition (%post is indented, so its terminator and text would change)",
                hint=f"write it as one {instruction} of commands joined by && and continued with \\, or "
                "build with Docker and convert: `invoke image` then `invoke sif`",
            )

    def _shell(self, line: str) -> None:
        try:
            shell = loads_json(line.split(None, 1)[1])
        except (IndexError, ValueError):
            shell = None
        ok = isinstance(shell, list) and len(shell) >= 2 and shell[-1] == "-c"
        options = shell[1:-1] if ok else []
        if not ok or len(options) % 2 or any(o != "-o" for o in options[::2]):
            raise RecipeError(
                f'{self._where()}: only SHELL ["SHELL", "-o", "OPTION", ..., "-c"] has an Apptainer form '
                f"(`%post -c SHELL` and `set -o OPTION`), not {line.strip()!r}",
                hint="use that form, or build with Docker and convert: `invoke image` then `invoke sif`",
            )
        if self.shell and self.shell != shell:
            raise RecipeError(f"{self._where()}: a second, different SHELL has no Apptainer form")
        self.shell = shell

    def _arg(self, line: str) -> None:
        rest = self._setup("ARG", line)
        try:
            words = shlex.split(rest[0] if rest else "")
        except ValueError as exc:
            raise RecipeError(f"{self._where()}: ARG cannot be read: {exc}") from None
        for word in words:
            name, eq, default = word.partition("=")
            value = self.build_args.get(name, default if eq else None)
            if value is None:
                raise RecipeError(
                    f"{self._where()}: ARG {name} has no value (no default, and the profile gives none)",
                    hint=f"give it a default in the recipe: ARG {name}=...",
                )
            if "\n" in value or "\r" in value:  # it would start a line of its own in %post
                raise RecipeError(f"{self._where()}: the value of ARG {name} has a line break: {value!r}")
            self.args[name] = value  # what FROM ${NAME} resolves to
            self.recipe[self.active_layer].install.append(f"export {name}={shlex.quote(value)}")

    def _env(self, line: str) -> None:
        install = self.recipe[self.active_layer].install
        before = len(install)
        super()._env(line)
        install[before:] = [f"export {assignment}" for assignment in install[before:]]

    def _add_files(self, source: str, dest: str, layer: Any = None) -> None:
        path = self.context / source
        if not path.resolve().is_relative_to(self.context.resolve()):  # as Docker refuses it
            raise RecipeError(f"{self._where()}: COPY source {source!r} is outside the build context {self.context}")
        if not path.exists():
            raise RecipeError(f"{self._where()}: COPY source {source!r} is not in the build context {self.context}")
        if path.is_dir():  # COPY DIR/ DEST/ copies DIR's content; %files DIR DEST/ would make DEST/DIR
            dest = dest.rstrip("/") or "/"
        super()._add_files(str(path), dest, layer)

    def _run(self, line: str) -> None:
        """Each RUN in a subshell whose failure ends %post, as a failed RUN ends a Docker
        build (`set -e` would not: it ignores all but the last command of a && chain)."""
        install = self.recipe[self.active_layer].install
        before = len(install)
        super()._run(line)
        if not self.run_open and len(install) > before:
            install[before] = f"( {install[before]}"
            self.run_open = True
        if self.run_open and not self._clean_line(line).endswith("\\"):
            install[-1] = f"{install[-1]}\n) || exit $?"
            self.run_open = False


def translate(dockerfile: Path, context: Path, args: Mapping[str, str]) -> Translation:
    """Parse dockerfile (whose COPY sources are in context) with spython's DockerParser, ARG
    values taken from args. RecipeError for what it cannot translate."""
    parser = ToolchainParser(dockerfile, context, args)
    stages = list(parser.recipe.values())
    if len(stages) != 1:
        raise RecipeError(f"{dockerfile.name}: {len(stages)} stages; only a single-stage recipe is translated")
    recipe = stages[0]
    if not recipe.fromHeader:
        raise RecipeError(f"{dockerfile.name}: no FROM; the bootstrap replaces it, but a recipe starts with one")
    notes = [
        f"made by torchbuild {__version__} from {dockerfile.name} with spython's Docker parser and Singularity writer",
        "ARG values are the profile's, exported in %post as Docker exports them to RUN",
        "ENV is exported in %post (for apt and pip) and set in %environment",
    ]
    if parser.shell:
        notes.append(f"SHELL {json.dumps(parser.shell)}: %post runs under {parser.shell[0]} with its -o options")
    notes.append("each RUN runs in a subshell, and its failure ends %post, as in a Docker build")
    notes.append(
        "COPY of a directory: its content goes to a new directory (Docker would also merge into an existing one)"
    )
    if recipe.workdir:
        notes.append(f"WORKDIR {recipe.workdir}: made in %post; the runscript starts in the caller's directory")
        recipe.workdir = None
    if recipe.cmd or recipe.entrypoint:
        notes.append("CMD/ENTRYPOINT: replaced by the runscript (the torchbuild CLI), as in a converted SIF")
    return Translation(recipe, parser.shell, notes)


# --------------------------------------------------------------------------- the definition


def recipe_hash(context: Path, args: Mapping[str, str], bootstrap: Bootstrap, arch: Arch) -> str:
    """Everything that decides the SIF's root file system (the recipe route's inputs-hash)."""
    blob = json.dumps(
        {
            "args": dict(args),
            "bootstrap": dataclasses.asdict(bootstrap),
            "context": tree_digest(context),
            "arch": arch.value,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def recipe_labels(spec: BuildSpec, digest: str, bootstrap: Bootstrap, compression: str) -> dict[str, str]:
    """The converted SIF's labels (its image's, then its own) with the recipe in place of the image."""
    return {
        **labels(spec, digest, ""),
        "org.opencontainers.image.base.name": str(bootstrap),
        f"{SIF_LABEL}.route": "recipe",
        f"{SIF_LABEL}.bootstrap": str(bootstrap),
        f"{SIF_LABEL}.recipe-hash": digest,
        f"{SIF_LABEL}.profile-hash": spec.hash,
        f"{SIF_LABEL}.torchbuild-version": __version__,
        f"{SIF_LABEL}.runtime-hash": runtime_hash(spec),
        f"{SIF_LABEL}.compression": compression,
    }


def recipe_definition(
    spec: BuildSpec,
    context: Path,
    bootstrap: Bootstrap,
    *,
    profile_file: Path,
    compression: str,
    digest: str = "",
) -> str:
    """The Apptainer definition of spec's toolchain, from the recipe in context."""
    check_definition_paths([context, profile_file])
    translation = translate(context / RECIPE, context, build_args(spec))
    return write_recipe(
        translation,
        header=bootstrap.header(),
        prelude=bootstrap.prelude(),
        files=metadata_files(spec, profile_file),
        environment=environment_section_lines(spec),
        labels=recipe_labels(spec, digest, bootstrap, compression),
        help_text=help_text(spec),
        notes=[
            f"bootstrap: {bootstrap} (profile key sif_bootstrap)",
            "the runscript, labels, %environment and %help are the converted SIF's (`invoke sif`)",
        ],
    )


def write_recipe(
    translation: Translation,
    *,
    header: Sequence[str],
    prelude: Sequence[str] = (),
    files: Sequence[Sequence[str]] = (),
    environment: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    help_text: str = "",
    notes: Sequence[str] = (),
) -> str:
    """The definition of a translated recipe: header (the bootstrap), then %files, %labels,
    %post (SHELL's options, prelude, the recipe), %environment (the recipe's ENV, then
    environment), the torchbuild runscript and %help, with the notes as comments on top."""
    recipe = translation.recipe
    options = [f"set -o {o}" for o in translation.shell[2:-1:2]]
    recipe.install = [*options, *prelude, *recipe.install]
    recipe.files += [list(f) for f in files]
    recipe.environ += list(environment)
    recipe.labels = [[k, v] for k, v in (labels or {}).items()]
    writer = DefinitionWriter(
        recipe,
        header=header,
        help_text=help_text,
        comments=[*translation.notes, *notes],
        post_interpreter=translation.shell[0] if translation.shell else "",
    )
    return writer.convert()


# --------------------------------------------------------------------------- unprivileged build


def _subid_entry(path: Path, user: str, uid: int) -> bool:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return False
    return any(line.split(":")[0] in (user, str(uid)) for line in lines if line.count(":") == 2)


def _userns_blocked(proc: Path = Path("/proc/sys")) -> str:
    """Why this kernel refuses unprivileged user namespaces ("" when it allows them)."""
    for name, off in (("user/max_user_namespaces", "0"), ("kernel/unprivileged_userns_clone", "0")):
        try:
            if (proc / name).read_text().strip() == off:
                return f"{name.replace('/', '.')} = {off}"
        except OSError:
            continue
    return ""


def fakeroot_flags(
    bootstrap: Bootstrap,
    *,
    uid: int | None = None,
    user: str | None = None,
    etc: Path = Path("/etc"),
    proc: Path = Path("/proc/sys"),
) -> list[str]:
    """The `apptainer build` flags that make the build work unprivileged on this host: none as
    root; otherwise --fakeroot. RecipeError naming the setting when the host cannot."""
    uid = os.getuid() if uid is None else uid
    if uid == 0:
        return []
    blocked = _userns_blocked(proc)
    if blocked:
        raise RecipeError(
            f"this host does not allow unprivileged user namespaces ({blocked}), so Apptainer cannot build as you",
            hint="ask the administrators for `sysctl -w user.max_user_namespaces=15000` (and "
            "kernel.unprivileged_userns_clone=1 where it exists), or build as root",
        )
    user = user or _user_name(uid)
    if bootstrap.agent == "debootstrap" and not (
        _subid_entry(etc / "subuid", user, uid) and _subid_entry(etc / "subgid", user, uid)
    ):
        raise RecipeError(
            f"a debootstrap bootstrap needs fakeroot with subordinate ids, and {user} has no entry in "
            f"{etc / 'subuid'} and {etc / 'subgid'}",
            hint=f"as root: `apptainer config fakeroot --add {user}`; or use --set sif_bootstrap=docker with a registry",
        )
    return ["--fakeroot"]


def _user_name(uid: int) -> str:
    try:
        return getpass.getuser() if uid == os.getuid() else str(uid)
    except (KeyError, OSError):
        return str(uid)


# --------------------------------------------------------------------------- build


def build_from_recipe(
    spec: BuildSpec,
    apptainer: Apptainer,
    out_dir: Path,
    *,
    rebuild: bool = False,
    compression: str = "",
    out: TextIO = sys.stdout,
) -> SifResult:
    """Build out_dir/torch-build-<profile>-<arch>.sif from the toolchain recipe with Apptainer
    alone. Up to date (a label check) when the recipe, its context, the bootstrap and the
    runtime keys are the same; written under a temporary name and renamed, like a conversion."""
    start = time.monotonic()
    _check_recipe_route(spec)
    bootstrap = bootstrap_for(spec)
    requested = Compression.parse(compression) if compression else None
    out_dir = out_dir.resolve()
    final = out_dir / sif_filename(spec)
    root = (cache_dir(spec) / "apptainer").resolve()
    run_id = uuid.uuid4().hex[:12]
    run = _RecipeRun(root, root / "work" / run_id, final, out_dir / f".{final.name}.partial-{run_id}")
    try:
        with interrupts_unwind():
            context, digest = _context(spec, run.work, bootstrap)
            current = _current_sif(spec, apptainer, final, digest, requested, start) if not rebuild else None
            if current is not None:
                return current
            plan = _plan_recipe_build(spec, apptainer, bootstrap, run, context, digest, requested)
            build_seconds = _run_recipe_build(apptainer, bootstrap, run, plan, out)
    except KeyboardInterrupt:
        raise BuildInterrupted(f"build from the recipe interrupted; no {final.name} was written") from None
    finally:
        run.partial.unlink(missing_ok=True)
        remove_tree(run.work)
    return _built_sif(spec, final, start, build_seconds, plan)


def _built_sif(spec: BuildSpec, final: Path, start: float, build_seconds: float, plan: _RecipePlan) -> SifResult:
    """The result for the SIF just built at final."""
    return SifResult(
        final,
        False,
        time.monotonic() - start,
        final.stat().st_size,
        0,
        build_seconds=build_seconds,
        log=plan.log,
        link=link_default(spec, final),
        compression=str(plan.chosen),
    )


def _current_sif(
    spec: BuildSpec,
    apptainer: Apptainer,
    final: Path,
    digest: str,
    requested: Compression | None,
    start: float,
) -> SifResult | None:
    """The result for a SIF at final already built from this recipe (its labels: the digest, the compression);
    None when there is none or it is not current."""
    if not final.exists():
        return None
    chosen = choose_compression(requested, apptainer.build_flags())
    if not _recipe_sif_is_current(spec, apptainer.labels(final), digest, chosen):
        return None
    size = final.stat().st_size
    return SifResult(
        final,
        True,
        time.monotonic() - start,
        size,
        0,
        link=link_default(spec, final),
        compression=str(chosen),
    )


def _check_recipe_route(spec: BuildSpec) -> None:
    """UsageError unless the recipe route can build spec's SIF: this host's arch. A profile with
    `invoke comms` builds gets their tools (image.comms_packages) and no NCCL or plugin: those
    are built at the site in the SIF (`invoke comms --in-container --engine apptainer`, the
    first step of `invoke submit`'s job) and bound in at run time (sif.bound_comms_lines)."""
    if spec.arch != Arch.host():
        raise UsageError(
            f"--from-recipe builds for this host's arch ({Arch.host()}), not {spec.arch}",
            hint=f"run it on a {spec.arch} node, or build the image with Docker and convert it: "
            f"`invoke image --arch {spec.arch}` then `invoke sif --arch {spec.arch}`",
        )


def _recipe_sif_is_current(spec: BuildSpec, labels: Mapping[str, str], digest: str, chosen: Compression) -> bool:
    """Whether a SIF with these labels was built from the same recipe, runtime keys and compression."""
    return (
        labels.get(f"{SIF_LABEL}.recipe-hash") == digest
        and labels.get(f"{SIF_LABEL}.runtime-hash") == runtime_hash(spec)
        and labels.get(f"{SIF_LABEL}.compression") == str(chosen)
    )


@dataclasses.dataclass(frozen=True)
class _RecipeRun:
    """Where one build from the recipe works and writes."""

    root: Path  # the cache's apptainer directory
    work: Path  # this build's own directory under root, removed at the end
    final: Path
    partial: Path  # the SIF being written, next to final


@dataclasses.dataclass(frozen=True)
class _RecipePlan:
    """How one build from the recipe runs."""

    flags: frozenset[str]  # this Apptainer's build flags
    chosen: Compression
    privilege: list[str]  # --fakeroot, or nothing
    deffile: Path
    log: Path


def _plan_recipe_build(
    spec: BuildSpec,
    apptainer: Apptainer,
    bootstrap: Bootstrap,
    run: _RecipeRun,
    context: Path,
    digest: str,
    requested: Compression | None,
) -> _RecipePlan:
    """Check the free space, choose the compression and the privilege flags, and write the
    definition (into the work directory, and beside the build's log)."""
    check_space(space_needed(RECIPE_SIZE_ESTIMATE, run.root, run.final.parent))
    flags = apptainer.build_flags()
    chosen = choose_compression(requested, flags)
    # In the apptainer-builder, --fakeroot even as root: the container lacks the capabilities
    # a root build's %post asks for ("Requesting capability set ..."); its entrypoint gives
    # the caller subordinate ids.
    privilege = ["--fakeroot"] if isinstance(apptainer, DockerApptainer) else fakeroot_flags(bootstrap)
    deffile, text = _definition_in(spec, run.work, context, bootstrap, str(chosen), digest)
    run.final.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log = cache_dir(spec) / "logs" / f"sif-recipe-{spec.profile}-{spec.arch.value}-{stamp}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.with_suffix(".def").write_text(text)  # what was built, kept beside its log
    return _RecipePlan(frozenset(flags), chosen, privilege, deffile, log)


def _run_recipe_build(
    apptainer: Apptainer, bootstrap: Bootstrap, run: _RecipeRun, plan: _RecipePlan, out: TextIO
) -> float:
    """Run `apptainer build` of the definition into the partial SIF and rename it into place;
    SifError unless it made one. Returns its seconds."""
    tmp = run.work / "apptainer-tmp"
    tmp.mkdir()
    env = {}
    for var, d in (("CACHEDIR", run.work / "apptainer-cache"), ("TMPDIR", tmp)):
        env[f"APPTAINER_{var}"] = env[f"SINGULARITY_{var}"] = str(d)
    chosen, log = plan.chosen, plan.log
    print(f"building {run.final.name} from toolchain.Dockerfile with {apptainer.description}", file=out, flush=True)
    print(f"  bootstrap: {bootstrap}; {' '.join(plan.privilege) or 'as root'}; squashfs {chosen}", file=out, flush=True)
    t0 = time.monotonic()
    build = apptainer_build_args(run.partial, plan.deffile, chosen, plan.flags)
    rc = apptainer.call(
        [build[0], *plan.privilege, *build[1:]], env=env, paths=[run.root, run.final.parent], out=out, log=log
    )
    if rc != 0 or not run.partial.is_file():
        raise SifError(
            f"apptainer build from the recipe exited with {rc} (log: {log}, definition: {log.with_suffix('.def')})"
        )
    os.replace(run.partial, run.final)
    return time.monotonic() - t0


def _context(spec: BuildSpec, work: Path, bootstrap: Bootstrap) -> tuple[Path, str]:
    """The recipe's build context in work/context (image_context) and its recipe hash."""
    context = work / "context"
    context.mkdir(parents=True)
    image_context(spec, context)
    return context, recipe_hash(context, build_args(spec), bootstrap, spec.arch)


def _definition_in(
    spec: BuildSpec, work: Path, context: Path, bootstrap: Bootstrap, compression: str, digest: str
) -> tuple[Path, str]:
    """The resolved profile and the definition written into work; (definition path, its text)."""
    profile_file = work / f"{spec.profile}.yaml"
    profile_file.write_text(shareable_profile_text(spec))
    text = recipe_definition(
        spec, context, bootstrap, profile_file=profile_file, compression=compression, digest=digest
    )
    deffile = work / "torch-build.def"
    deffile.write_text(text)
    return deffile, text


def write_definition(spec: BuildSpec, dest: Path, compression: str = "") -> Path:
    """Write the definition `--from-recipe` would build, with its context beside it, into dest
    (a new or empty directory), to review it or build it by hand where it was written (its
    %files name the context by absolute path); returns its path. The squashfs compression is
    only recorded. Whatever fails leaves dest as it was (absent, or empty)."""
    if any(c.isspace() for c in str(dest)):
        raise PathError(
            f"--write-definition: {str(dest)!r} has whitespace, and a definition names its build context "
            "by absolute path, unquoted (%files)",
            hint="choose a directory whose path has no spaces, tabs or line breaks",
        )
    bootstrap = bootstrap_for(spec)
    chosen = str(Compression.parse(compression or DEFAULT_COMPRESSION))
    with named_os_errors(dest, "--write-definition"):
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise PathError(f"--write-definition: {dest} is not an empty directory", hint="name a new directory")
        existed = dest.exists()
        dest.mkdir(parents=True, exist_ok=True)
        try:
            context, digest = _context(spec, dest, bootstrap)
            return _definition_in(spec, dest, context, bootstrap, chosen, digest)[0]
        except BaseException:
            for written in [*dest.iterdir()] if existed else [dest]:
                if written.is_dir():
                    remove_tree(written)
                else:
                    written.unlink()
            raise
