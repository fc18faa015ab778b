"""`invoke sif --from-recipe` without Apptainer: the toolchain recipe translated by spython into
an Apptainer definition (checked against the recipe itself), its %post run by a real bash,
the bootstrap the profile asks for, and the checks that say whether this host can build it
unprivileged."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TEST_TORCH, run_invoke

from torchbuild import __version__
from torchbuild.core.arch import Arch
from torchbuild.core.errors import PathError, ProfileError, SifError, TorchbuildError, UsageError
from torchbuild.image.host import apt_packages, build_args, image_context, labels, python_requirements
from torchbuild.profile.config import data_dir, resolve
from torchbuild.runtime.apptainer import SIF_LABEL
from torchbuild.sif.host import TORCHBUILD_EXE, definition
from torchbuild.sif.recipe import (
    Bootstrap,
    RecipeError,
    bootstrap_for,
    fakeroot_flags,
    recipe_definition,
    translate,
    write_definition,
)

DOCKERFILE = data_dir() / "containers" / "toolchain.Dockerfile"


def sections(text: str) -> dict[str, list[str]]:
    """A definition's sections by header (`%post -c /bin/bash` under "post"), lines unindented."""
    found: dict[str, list[str]] = {"comments": [], "header": []}
    current = "header"
    for line in text.splitlines():
        if current == "header" and line.startswith("# "):
            found["comments"].append(line[2:])
        elif line.startswith("%"):
            current = line[1:].split()[0]
            found[current] = []
        elif line.strip():
            found[current].append(line.strip())
    return found


def instructions(path: Path) -> list[tuple[str, str]]:
    """The Dockerfile's instructions with their continuation lines joined (comments dropped)."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        word, _, rest = pending.partition(" ")
        result.append((word.upper(), rest.strip()))
        pending = ""
    return result


@pytest.fixture
def cpu_recipe(tmp_path):
    spec = resolve("cpu", ["sif_bootstrap=debootstrap", "base_image=debian:trixie", "python_version=3.13"])
    context = tmp_path / "context"
    context.mkdir()
    image_context(spec, context)
    profile_file = tmp_path / "cpu.yaml"
    profile_file.write_text("profile")
    text = recipe_definition(
        spec, context, bootstrap_for(spec), profile_file=profile_file, compression="gzip:6", digest="d" * 64
    )
    return spec, context, text


def test_the_definition_carries_every_instruction_of_the_recipe(cpu_recipe):
    spec, context, text = cpu_recipe
    parts = sections(text)
    post = "\n".join(parts["post"])
    joined = re.sub(r"\s*\\\n", " ", post)  # continuation lines joined, as Docker reads them
    environment = parts["environment"]
    steps = instructions(DOCKERFILE)
    assert {word for word, _ in steps} <= {"ARG", "FROM", "ENV", "SHELL", "COPY", "RUN", "WORKDIR", "CMD"}
    args = build_args(spec)
    position = 0
    for word, rest in steps:
        if word == "ARG":  # the profile's value, exported for RUN, as `docker build --build-arg` gives it
            name = rest.split("=", 1)[0]
            assert f"export {name}={shlex.quote(args[name])}" in parts["post"]
        elif word == "ENV":  # exported for the later RUNs and set for whatever runs in the SIF
            for assignment in re.findall(r"(\w+)=(\S+)", rest):
                line = "export {}={}".format(*assignment)
                assert line in parts["post"] and line in environment, line
        elif word == "RUN":  # the whole command, in order, in a subshell whose failure ends %post
            position = joined.index(f"( {rest}\n) || exit $?", position)
        elif word == "COPY":  # from the build context, by absolute path
            source, dest = rest.split()
            assert f"{context / source.rstrip('/')} {dest.rstrip('/')}" in parts["files"]
    # the packages: the fixed tools in %post, the profile's in the list %files brings in
    assert "ca-certificates git patch make pkg-config ccache cmake ninja-build" in post
    assert (context / "inputs" / "apt-packages.txt").read_text().split() == apt_packages(spec)
    assert (context / "inputs" / "requirements.txt").read_text().split() == python_requirements(spec)
    assert (context / "inputs" / "pythons.txt").read_text().split() == ["3.13"]
    # SHELL ["/bin/bash", "-o", "pipefail", "-c"] has no spython translation: torchbuild's
    assert re.search(r"^%post -c /bin/bash$", text, re.M) and parts["post"][0] == "set -o pipefail"
    # the debootstrapped system gets the components the profile's packages come from
    assert "deb http://deb.debian.org/debian trixie main contrib non-free" in post


def test_the_definition_has_the_converted_sifs_labels_runscript_and_environment(cpu_recipe, tmp_path):
    spec, _, text = cpu_recipe
    parts = sections(text)
    assert parts["header"] == ["Bootstrap: debootstrap", "OSVersion: trixie", "MirrorURL: http://deb.debian.org/debian"]
    recipe_labels = dict(line.split(" ", 1) for line in parts["labels"])
    for key, value in labels(spec, "d" * 64, "").items():
        if key != "org.opencontainers.image.base.name":
            assert recipe_labels[key] == value, key
    assert recipe_labels[f"{SIF_LABEL}.route"] == "recipe"
    assert recipe_labels[f"{SIF_LABEL}.torchbuild-version"] == __version__
    assert recipe_labels[f"{SIF_LABEL}.compression"] == "gzip:6"
    converted = sections(
        definition(spec, archive=tmp_path / "layout", profile_file=tmp_path / "cpu.yaml", image_id="sha256:x")
    )
    assert parts["runscript"] == converted["runscript"] == [f'exec {TORCHBUILD_EXE} "$@"']
    assert parts["help"] == converted["help"]
    # the converted SIF's %environment after the recipe's ENV (which an image carries in its config)
    assert parts["environment"][-len(converted["environment"]) :] == converted["environment"]
    assert "startscript" not in parts
    # where the routes differ is said in the definition
    assert any("subshell" in c for c in parts["comments"]) and any("WORKDIR /src" in c for c in parts["comments"])


def post_script(tmp_path: Path, dockerfile_text: str, args: dict[str, str] | None = None) -> str:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(dockerfile_text)
    recipe = translate(dockerfile, tmp_path, args or {}).recipe
    return "\n".join(recipe.install)


def run_bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, check=False)


def test_a_failing_run_ends_post_as_it_ends_a_docker_build(tmp_path):
    script = post_script(
        tmp_path,
        "FROM x\nRUN echo first >> log \\\n && false \\\n && echo not-reached >> log\nRUN echo second >> log\n",
    )
    proc = run_bash(script, tmp_path)
    assert proc.returncode == 1
    assert (tmp_path / "log").read_text() == "first\n"  # `set -e` would have gone on to "second"


def test_each_run_is_its_own_shell_and_env_carries_over(tmp_path):
    script = post_script(
        tmp_path,
        "FROM x\nARG WHO=nobody\nENV GREETING=hello\n"
        'RUN cd / && LOCAL=1 && echo "$GREETING $WHO" > "$OLDPWD/out"\n'
        'RUN echo "${LOCAL:-unset} $(basename "$PWD")" >> out\n',
        {"WHO": "a b; $(touch pwned)"},
    )
    proc = run_bash(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    # the profile's value arrives literally; cd and shell variables end with their RUN
    assert (tmp_path / "out").read_text() == f"hello a b; $(touch pwned)\nunset {tmp_path.name}\n"
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("USER builder", "Dockerfile:2: spython cannot translate USER"),
        ("ONBUILD RUN true", "Dockerfile:2: spython cannot translate ONBUILD"),
        ('SHELL ["/bin/zsh", "-e", "-c"]', "Dockerfile:2: only SHELL"),
        ("ARG NEEDED", "Dockerfile:2: ARG NEEDED has no value"),
        ("COPY missing/ /opt/x/", "Dockerfile:2: COPY source 'missing/' is not in the build context"),
        # options spython drops (COPY --from= a stage or an image) or takes for a source or a command
        ("COPY --from=builder /out /opt/out", "Dockerfile:2: COPY --from=builder: options of COPY"),
        ("COPY --from=debian:trixie /etc/os-release /x", "Dockerfile:2: COPY --from=debian:trixie: options"),
        ("COPY --chown=1000:1000 --chmod=644 sub/ /opt/", "Dockerfile:2: COPY --chown=1000:1000 --chmod=644:"),
        ("ADD --checksum=sha256:00 https://example.org/x /x", "Dockerfile:2: ADD --checksum=sha256:00: options"),
        ("RUN --mount=type=cache,target=/root/.cache pip install x", "Dockerfile:2: RUN --mount=type=cache"),
        ("RUN --network=none true", "Dockerfile:2: RUN --network=none: options of RUN"),
        # the JSON (exec) form: spython pastes it into %post as text
        ('RUN ["/bin/sh", "-c", "touch /x"]', "Dockerfile:2: the JSON form of RUN"),
        ('COPY ["sub/", "/opt/a b/"]', "Dockerfile:2: the JSON form of COPY"),
        # here-documents: spython runs the body's lines as instructions' text, the writer indents them
        ("RUN <<EOF\necho hi > /x\nEOF", "Dockerfile:2: the here-document RUN <<EOF"),
        ("RUN <<-'EOT' bash\n\techo hi\n\tEOT", "Dockerfile:2: the here-document RUN <<-'EOT'"),
        ('RUN cat > /x <<"EOF"\nhi\nEOF', 'Dockerfile:2: the here-document RUN <<"EOF"'),
        ("RUN python3 2<<EOF\nprint(1)\nEOF", "Dockerfile:2: the here-document RUN 2<<EOF"),
        ("RUN apt-get update \\\n && cat > /etc/x <<EOF\nhi\nEOF", "Dockerfile:3: the here-document RUN <<EOF"),
        ("COPY <<EOF /etc/x\nhi\nEOF", "Dockerfile:2: the here-document COPY <<EOF"),
        # a source outside the build context (Docker refuses it; %files would copy this machine's)
        ("COPY /etc/hostname /x", "Dockerfile:2: COPY source '/etc/hostname' is outside the build context"),
        ("COPY ../outside /x", "Dockerfile:2: COPY source '../outside' is outside the build context"),
        ("COPY sub/../../outside /x", "Dockerfile:2: COPY source 'sub/../../outside' is outside"),
        # JSON nested deeper than Python's json recurses
        ("SHELL " + "[" * 100_000, "Dockerfile:2: only SHELL"),
    ],
)
def test_what_spython_cannot_translate_is_a_named_error(tmp_path, line, match):
    context = tmp_path / "context"
    (context / "sub").mkdir(parents=True)
    (tmp_path / "outside").write_text("not in the context\n")
    dockerfile = context / "Dockerfile"
    dockerfile.write_text(f"FROM debian:trixie\n{line}\nRUN true\n")
    with pytest.raises(RecipeError, match=re.escape(match)) as err:
        translate(dockerfile, context, {})
    assert err.value.exit_code == 29 and err.value.hint and "\n" not in err.value.hint


def test_what_looks_like_a_here_document_but_is_none_is_translated(tmp_path):
    """`<<<` (a here-string), a shift in $(( )) and `<<` inside quotes are shell, not
    here-documents: translated, and %post does what the RUNs do."""
    script = post_script(
        tmp_path,
        "FROM x\nRUN echo $((1<<3)) > out\nRUN cat <<< here-string >> out\nRUN echo '<<EOF' \"<<EOT\" >> out\n",
    )
    proc = run_bash(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out").read_text() == "8\nhere-string\n<<EOF <<EOT\n"


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"FROM x\nRUN echo caf\xe9 > /x\n", r"Dockerfile:2: not UTF-8 text \(byte 0xe9"),
        (b"\xff\xfeF\x00R\x00O\x00M\x00", r"Dockerfile:1: not UTF-8 text \(byte 0xff"),
        (b"FROM x\n" + b"# padding\n" * 250_000, r"Dockerfile is 2.4 MiB, more than the 1 MiB"),
        (None, "not a regular file"),
    ],
    ids=["latin-1", "utf-16", "over-1-MiB", "fifo"],
)
def test_a_recipe_that_cannot_be_read_as_text_is_a_recipe_error(tmp_path, content, match):
    dockerfile = tmp_path / "Dockerfile"
    if content is None:
        os.mkfifo(dockerfile)  # spython's own read would wait for a writer
    else:
        dockerfile.write_bytes(content)
    with pytest.raises(RecipeError, match=match) as err:
        translate(dockerfile, tmp_path, {})
    assert err.value.exit_code == 29 and "the toolchain recipe" in err.value.message


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("FROM a AS one\nRUN true\nFROM b AS two\nRUN true\n", 3),
        # spython renames an unnamed first stage to the second's name and merges their RUNs
        ("FROM a\nRUN echo one\nFROM b AS x\nRUN echo two\n", 3),
        # without AS, spython keeps one stage and the second FROM replaces the first
        ("FROM a\nRUN echo one\nfrom b\nRUN echo two\n", 3),
        ("FROM a AS builder\nRUN make\n\nFROM b\nCOPY --from=builder /out /out\n", 4),
    ],
)
def test_a_multistage_recipe_is_refused_at_its_second_from(tmp_path, text, line):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(text)
    with pytest.raises(RecipeError, match=rf"Dockerfile:{line}: a second FROM: a multi-stage recipe") as err:
        translate(dockerfile, tmp_path, {})
    assert err.value.exit_code == 29


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ([], Bootstrap("docker", "ubuntu:24.04")),
        (
            ["sif_bootstrap=debootstrap"],
            Bootstrap("debootstrap", "noble", "http://archive.ubuntu.com/ubuntu", ("main", "universe")),
        ),
        (
            ["sif_bootstrap=debootstrap", "base_image=debian:13"],
            Bootstrap("debootstrap", "trixie", "http://deb.debian.org/debian", ("main", "contrib", "non-free")),
        ),
        (
            ["sif_bootstrap=debootstrap", "base_image=torchbuild/base:sid-x86_64", "sif_components=[main]"],
            Bootstrap("debootstrap", "sid", "http://deb.debian.org/debian", ("main",)),
        ),
        (
            [
                "sif_bootstrap=debootstrap",
                "base_image=nvidia/cuda:12.6.2-devel-ubuntu24.04",
                "sif_suite=noble",
                "sif_mirror=http://mirror.site/ubuntu",
            ],
            Bootstrap("debootstrap", "noble", "http://mirror.site/ubuntu", ("main", "universe")),
        ),
    ],
)
def test_the_bootstrap_follows_the_profile(sets, expected):
    assert bootstrap_for(resolve("cpu", sets, arch="x86_64")) == expected


def test_ubuntu_on_aarch64_debootstraps_from_ports():
    spec = resolve("gh200", ["sif_bootstrap=debootstrap", "base_image=ubuntu:24.04"])
    assert spec.arch == Arch.AARCH64 and bootstrap_for(spec).mirror == "http://ports.ubuntu.com/ubuntu-ports"


@pytest.mark.parametrize(
    ("base_image", "suite"),
    [
        ("localhost:5000/debian:trixie", "trixie"),  # a registry's port is not the tag
        ("registry.site:443/mirror/debian:bookworm-slim", "bookworm"),
        ("debian:trixie@sha256:" + "0" * 64, "trixie"),  # the tag beside a digest still names the suite
    ],
)
def test_the_suite_is_read_from_a_reference_with_a_registry_or_a_digest(base_image, suite):
    spec = resolve("cpu", ["sif_bootstrap=debootstrap", f"base_image={base_image}"], arch="x86_64")
    assert bootstrap_for(spec).source == suite


def test_a_digest_alone_names_no_suite():
    spec = resolve("cpu", ["sif_bootstrap=debootstrap", "base_image=debian@sha256:" + "0" * 64], arch="x86_64")
    with pytest.raises(UsageError, match="cannot tell the suite"):
        bootstrap_for(spec)


def test_a_suite_that_cannot_be_told_is_asked_for():
    spec = resolve("cpu", ["sif_bootstrap=debootstrap", "base_image=nvidia/cuda:12.6.2-devel-ubuntu24.04"])
    with pytest.raises(UsageError, match="cannot tell the suite") as err:
        bootstrap_for(spec)
    assert "--set sif_suite=" in err.value.hint


def subids(tmp_path: Path, entries: str) -> Path:
    etc = tmp_path / "etc"
    etc.mkdir(exist_ok=True)
    for name in ("subuid", "subgid"):
        (etc / name).write_text(entries)
    return etc


def procfs(tmp_path: Path, max_userns: str = "15000") -> Path:
    proc = tmp_path / "proc"
    (proc / "user").mkdir(parents=True, exist_ok=True)
    (proc / "user" / "max_user_namespaces").write_text(max_userns + "\n")
    return proc


DEBOOTSTRAP = Bootstrap("debootstrap", "trixie", "http://deb.debian.org/debian", ("main",))
DOCKER = Bootstrap("docker", "ubuntu:24.04")


def test_root_builds_without_fakeroot(tmp_path):
    assert fakeroot_flags(DEBOOTSTRAP, uid=0, etc=subids(tmp_path, ""), proc=procfs(tmp_path, "0")) == []


def test_a_user_in_subuid_builds_with_fakeroot(tmp_path):
    etc = subids(tmp_path, "other:100000:65536\nalice:165536:65536\n")
    assert fakeroot_flags(DEBOOTSTRAP, uid=1000, user="alice", etc=etc, proc=procfs(tmp_path)) == ["--fakeroot"]
    numeric = subids(tmp_path, "1000:100000:65536\n")
    assert fakeroot_flags(DEBOOTSTRAP, uid=1000, user="alice", etc=numeric, proc=procfs(tmp_path)) == ["--fakeroot"]


def test_debootstrap_without_subuid_names_the_fix(tmp_path):
    etc = subids(tmp_path, "other:100000:65536\n")
    with pytest.raises(RecipeError, match="alice has no entry") as err:
        fakeroot_flags(DEBOOTSTRAP, uid=1000, user="alice", etc=etc, proc=procfs(tmp_path))
    assert "apptainer config fakeroot --add alice" in err.value.hint
    # a docker bootstrap manages with a root-mapped namespace and fakeroot(1)
    assert fakeroot_flags(DOCKER, uid=1000, user="alice", etc=etc, proc=procfs(tmp_path)) == ["--fakeroot"]


def test_no_user_namespaces_names_the_sysctl(tmp_path):
    etc = subids(tmp_path, "alice:100000:65536\n")
    with pytest.raises(RecipeError, match=r"user\.max_user_namespaces = 0") as err:
        fakeroot_flags(DOCKER, uid=1000, user="alice", etc=etc, proc=procfs(tmp_path, "0"))
    assert "sysctl -w user.max_user_namespaces" in err.value.hint


def test_write_definition_lays_out_a_buildable_directory(tmp_path):
    spec = resolve("cpu", ["sif_bootstrap=debootstrap", "base_image=debian:trixie"])
    deffile = write_definition(spec, tmp_path / "def", "zstd")
    text = deffile.read_text()
    for line in sections(text)["files"]:
        assert Path(line.split()[0]).exists(), line
    assert f"{SIF_LABEL}.compression zstd:3" in text
    with pytest.raises(PathError, match="not an empty directory"):
        write_definition(spec, tmp_path / "def")


def test_a_recipe_without_from_is_refused(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("RUN true\n")
    with pytest.raises(RecipeError, match="no FROM"):
        translate(dockerfile, tmp_path, {})


def test_no_apptainer_and_no_docker_is_named_with_the_module_to_load(tmp_path):
    python_only = tmp_path / "bin"
    python_only.mkdir()
    (python_only / "python3").symlink_to(sys.executable)
    env = {"PATH": str(python_only), "DOCKER_HOST": "unix:///nonexistent/docker.sock", "HOME": str(tmp_path)}
    res = run_invoke("sif", "--from-recipe", "--out", str(tmp_path / "out"), env=env)
    assert res.returncode == 5, res.stdout + res.stderr
    assert "ToolMissing: neither apptainer nor singularity is on PATH" in res.stderr
    assert res.stderr.splitlines()[-1].startswith("hint: `module load apptainer`")
    assert "Traceback" not in res.stderr and not (tmp_path / "out").exists()


def test_write_definition_needs_from_recipe(tmp_path):
    res = run_invoke("sif", "--write-definition", str(tmp_path / "def"))
    assert res.returncode == 2 and "add --from-recipe" in res.stderr and not (tmp_path / "def").exists()


def test_the_recipe_hash_is_the_same_for_the_same_inputs_and_differs_otherwise(tmp_path):
    """What says a SIF from the recipe is up to date: two fresh contexts of one profile hash alike."""
    from torchbuild.sif.recipe import recipe_hash

    def digest(sets: list[str], name: str) -> str:
        spec = resolve("cpu", ["sif_bootstrap=debootstrap", "base_image=debian:trixie", *sets], arch="x86_64")
        context = tmp_path / name
        context.mkdir()
        image_context(spec, context)
        return recipe_hash(context, build_args(spec), bootstrap_for(spec), spec.arch)

    first = digest([], "a")
    assert digest([], "b") == first
    assert digest(["apt_packages=[vim]"], "c") != first  # the package list in the context
    assert digest(["sif_mirror=http://mirror.site/debian"], "d") != first  # the bootstrap
    assert digest(["python_system_site_packages=true"], "e") != first  # a build argument


def test_a_profile_value_cannot_open_a_section_of_the_definition(tmp_path):
    """A line break in base_image (FROM, a label) or runtime_env would put `%post` on a line of
    its own, where Apptainer runs it: refused, whichever route."""
    context = tmp_path / "context"
    context.mkdir()
    evil = "debian:trixie\n%post\ntouch /pwned"  # as a profile file's YAML string can hold it
    spec = dataclasses.replace(resolve("cpu", arch="x86_64"), base_image=evil)
    image_context(spec, context)
    with pytest.raises(RecipeError, match="ARG BASE_IMAGE has a line break"):
        translate(context / "Dockerfile", context, build_args(spec))
    with pytest.raises(ProfileError, match="control character"):  # refused as the profile resolves
        resolve("cpu", ['runtime_env={X: "a\\n%runscript\\nrm -rf ~"}'], arch="x86_64")
    # and the definition's own check stays, for a spec no profile made
    spec = dataclasses.replace(resolve("cpu", arch="x86_64"), runtime_env={"X": "a\n%runscript\nrm -rf ~"})
    with pytest.raises(SifError, match="line break"):
        definition(spec, archive=tmp_path / "layout", profile_file=tmp_path / "p.yaml", image_id="x")


@pytest.mark.parametrize("name", ["my defs", "tab\there", "line\nbreak"])
def test_write_definition_into_a_path_with_whitespace_names_it_not_cache_dir(tmp_path, name):
    spec = resolve("cpu", ["sif_bootstrap=debootstrap", "base_image=debian:trixie"])
    with pytest.raises(PathError, match=r"--write-definition: .* has whitespace") as err:
        write_definition(spec, tmp_path / name / "def")
    assert "cache_dir" not in err.value.hint and err.value.exit_code == 15
    assert list(tmp_path.iterdir()) == []


def test_write_definition_with_a_space_exits_15_with_its_hint(tmp_path):
    res = run_invoke("sif", "--from-recipe", "--write-definition", str(tmp_path / "my defs"))
    assert res.returncode == 15, res.stdout + res.stderr
    assert "error: PathError: --write-definition:" in res.stderr and "Traceback" not in res.stderr
    assert res.stderr.splitlines()[-1] == "hint: choose a directory whose path has no spaces, tabs or line breaks"
    assert list(tmp_path.iterdir()) == []


def test_write_definition_that_fails_leaves_nothing(tmp_path):
    spec = resolve(
        "cpu", ["sif_bootstrap=debootstrap", "base_image=debian:trixie", f"ca_certificates=[{tmp_path}/no.crt]"]
    )
    with pytest.raises(TorchbuildError, match=r"no\.crt"):
        write_definition(spec, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(TorchbuildError, match=r"no\.crt"):
        write_definition(spec, tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_comms_profile_gets_the_comms_tools_and_finds_its_nccl_and_plugin_bound_in(tmp_path):
    """Derecho has no Docker: its SIF comes from the recipe, site-independent. It gets make,
    autotools and hwloc for `invoke comms --engine apptainer` at the site, no libfabric-dev (the
    site's libfabric_prefix is bound in), and an %environment that loads what is bound at
    /opt/torchbuild/comms."""
    spec = resolve("derecho", ["sif_bootstrap=debootstrap", "base_image=debian:bullseye"], arch="x86_64")
    text = write_definition(spec, tmp_path / "def").read_text()
    packages = json.loads(re.search(r"org\.torchbuild\.apt-packages (.*)", text)[1])  # type: ignore[index]
    assert {"make", "autoconf", "automake", "libtool", "libhwloc-dev"} <= set(packages)
    assert "libfabric-dev" not in packages
    env = sections(text)["environment"]
    assert any("/opt/torchbuild/comms/torchbuild-comms.json" in line for line in env)
    assert any("NCCL_NET_PLUGIN=" in line for line in env)
    own = resolve(
        "cpu",
        [
            TEST_TORCH,
            "aws_ofi_nccl_version=1.17.1",
            "cuda_version=12.4",
            'cuda_arch_list=["9.0"]',
            "distributed=[gloo, nccl]",
        ],
    )
    assert "libfabric-dev" in apt_packages(own)  # no site libfabric: the image's own


def test_a_hash_inside_a_run_line_does_not_end_the_run(tmp_path):
    """`${v#prefix}` and `$#` are shell, not comments (Docker takes `#` as a comment only where it
    starts a line): the RUN stays one subshell, and %post does what the RUN does."""
    script = post_script(
        tmp_path,
        "FROM x\n# a comment\n"
        'RUN for v in gcc-toolset-13 gcc-toolset-14; do \\\n      n="${v#gcc-toolset-}"; \\\n'
        '      set -- a b; echo "$n $#" >> out; \\\n    done\nRUN echo end >> out\n',
    )
    proc = run_bash(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out").read_text() == "13 2\n14 2\nend\n"
    assert script.count("( ") == 2
