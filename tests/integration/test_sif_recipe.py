"""The recipe route's translation, built by real Apptainer 1.4 as a non-root user with
--fakeroot in the apptainer-builder container (no Docker engine inside it).

A small recipe with every instruction the toolchain recipe uses (ARG, ENV, SHELL, COPY of a
directory and of a file, multi-line RUN with bash arrays, WORKDIR, CMD) is translated by the
code `invoke sif --from-recipe` uses and built on the local trixie base (as an OCI layout, which
keeps this test at seconds): in the SIF, what Docker would have made of it is there. A RUN
whose && chain fails stops the build. The whole cpu toolchain SIF from the recipe, bootstrapped
by debootstrap from Debian's archive, is tests/slow/test_sif_recipe.py (about 6 minutes)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from helpers import ApptainerNode, shared_dir

from torchbuild.profile.config import resolve
from torchbuild.sif.host import ensure_builder, remove_tree, write_oci_layout
from torchbuild.sif.recipe import translate, write_recipe

pytestmark = [pytest.mark.docker, pytest.mark.apptainer]

RECIPE = """\
ARG BASE=debian:trixie
FROM ${BASE}
ARG GREETING=hello
ARG ODD=replaced-by-the-profile
ENV STAMP=one \\
    TB_PATHS=/opt/tb/bin:${PATH}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY payload/ /opt/payload/
COPY single.txt /opt/single/
# hadolint ignore=SC2034
RUN mapfile -t words < /opt/payload/words.txt \\
 && printf '%s|' "${words[@]}" > /opt/words.out \\
 && echo "$GREETING $ODD $STAMP" > /opt/args.out \\
 && LOCAL=set
RUN echo "${LOCAL:-unset}" > /opt/local.out \\
 && if false | true; then echo no-pipefail; else echo pipefail; fi > /opt/pipe.out
WORKDIR /work
RUN pwd > /opt/workdir.out
CMD ["bash"]
"""

FAILING = """\
FROM base
RUN echo first-run-ran \\
 && false \\
 && echo chain-went-on
RUN echo second-run-ran
"""


@pytest.fixture(scope="module")
def node(engine, local_base, sid_base, site_certs):
    """The builder as a node, and the local trixie base as an OCI layout the node can read."""
    tag = ensure_builder(resolve("cpu", [f"sif_builder_base={sid_base}", *site_certs]), engine)
    root = shared_dir(Path(tempfile.mkdtemp(prefix="torchbuild-node-")))
    write_oci_layout(engine.client.api.get_image(local_base), root / "base")
    for p in [root / "base", *(root / "base").rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    try:
        yield ApptainerNode(engine, tag, shared_dir(root / "home"), [root]), root
    finally:
        remove_tree(root)


def definition_for(root, name: str, text: str, args: dict[str, str]) -> str:
    context = shared_dir(root / name)
    (context / "Dockerfile").write_text(text)
    shared_dir(context / "payload")
    (context / "payload" / "words.txt").write_text("a b\nc\n")
    (context / "single.txt").write_text("single\n")
    for p in context.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    translation = translate(context / "Dockerfile", context, args)
    deffile = context / "built.def"
    deffile.write_text(write_recipe(translation, header=["Bootstrap: oci", f"From: {root / 'base'}"]))
    deffile.chmod(0o644)
    return str(deffile)


def test_the_translated_recipe_builds_what_docker_would(node):
    apptainer, root = node
    deffile = definition_for(root, "recipe", RECIPE, {"ODD": "a b; $(id)"})
    sif = str(root / "recipe.sif")
    rc, text = apptainer.run("apptainer", "build", "--fakeroot", sif, deffile)
    assert rc == 0, text[-4000:]
    script = (
        "cat /opt/words.out; echo; cat /opt/args.out /opt/local.out /opt/pipe.out /opt/workdir.out"
        " /opt/payload/words.txt /opt/single/single.txt; echo STAMP=$STAMP; echo TB_PATHS=$TB_PATHS"
    )
    rc, text = apptainer.run("apptainer", "exec", "--userns", sif, "bash", "-c", script)
    assert rc == 0, text
    lines = [line for line in text.splitlines() if "gocryptfs" not in line]
    assert lines == [
        "a b|c|",  # bash arrays: %post ran under SHELL's bash
        "hello a b; $(id) one",  # ARG from the profile, literal; its default; ENV during RUN
        "unset",  # a shell variable ends with its RUN
        "pipefail",  # SHELL's -o pipefail
        "/work",  # WORKDIR applies to the RUNs after it
        "a b",  # COPY payload/ /opt/payload/: the directory's content, not /opt/payload/payload
        "c",
        "single",  # COPY single.txt /opt/single/: into the directory
        "STAMP=one",  # ENV at run time
        "TB_PATHS=/opt/tb/bin:" + text.split("TB_PATHS=/opt/tb/bin:", 1)[1].splitlines()[0],
    ], text
    assert "/usr/bin" in lines[-1]  # ${PATH} expanded where the SIF runs
    rc, text = apptainer.run("apptainer", "inspect", "--json", "--runscript", sif)
    assert rc == 0 and 'exec /opt/venv/bin/torchbuild \\"$@\\"' in json.dumps(json.loads(text[text.index("{") :]))


def test_a_failing_run_fails_the_build(node):
    apptainer, root = node
    deffile = definition_for(root, "failing", FAILING, {})
    sif = root / "failing.sif"
    rc, text = apptainer.run("apptainer", "build", "--fakeroot", str(sif), deffile)
    assert rc != 0 and not sif.exists()
    assert "first-run-ran" in text and "chain-went-on" not in text and "second-run-ran" not in text, text[-3000:]
