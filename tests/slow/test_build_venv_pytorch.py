"""The preflight of real PyTorch on a bare node through the build venv (issue 30).

The bare node (tests/bare_node.py: gcc, g++ and Python only, no cmake, ninja or ccache) with,
on top, the system libraries Debian's de-vendored PyTorch 2.6.0+dfsg source is configured
against (the apt_packages of tests/fixtures/profiles/debian-pytorch-2.6.yaml, standing in for a
site's modules, less its python3-* packages: the venv brings the Python side) and dpkg-dev to
unpack the .dsc. `invoke build --preflight` natively there makes the build venv from PyPI with
cmake, ninja and the tree's own requirements.txt (numpy, pyyaml, sympy...), configures with
that venv's cmake and python and builds c10 with its ninja, without ccache.

Slow. Measured on 2 cores shared with other builds (load 6-8): 17.4 minutes in all, of which
the venv with PyTorch's requirements 84 s, the configure 93 s and c10 574 s (no ccache: every
object compiled), the rest the images' libraries and the source.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from bare_node import build_bare_image, run_bare
from helpers import FIXTURES, REPO, SUITE

from torchbuild.sif.host import remove_tree

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PROFILE = FIXTURES / "profiles" / "debian-pytorch-2.6.yaml"
LIBS_TAG = "torchbuild-test/bare:{suite}-pytorch-libs"


def _libraries() -> list[str]:
    """The profile's apt packages that are libraries and tools, not Python packages."""
    packages = yaml.safe_load(PROFILE.read_text())["apt_packages"]
    return [p for p in packages if not p.startswith("python3-")]


@pytest.fixture(scope="module")
def node(engine, local_base):
    work = Path(tempfile.mkdtemp(prefix="torchbuild-bare-pytorch-"))
    work.chmod(0o777)
    tags = []
    try:
        bare = build_bare_image(engine, local_base, SUITE, work)
        tags.append(bare)
        context = work / "libs-context"
        context.mkdir()
        (context / "Dockerfile").write_text(
            f"FROM {bare}\n"
            "RUN apt-get -o Acquire::Check-Valid-Until=false update \\\n"
            " && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\\n"
            f"    dpkg-dev xz-utils {' '.join(_libraries())} \\\n"
            " && rm -rf /var/lib/apt/lists/*\n"
        )
        tag = LIBS_TAG.format(suite=SUITE)
        engine.build(context, tag=tag, log=work / "libs-image.log", out=io.StringIO())
        tags.append(tag)
        yield engine, tag, work
    finally:
        for t in reversed(tags):
            if engine.client.images.list(t):
                engine.client.images.remove(t, force=True)
        remove_tree(work)


def test_real_pytorch_preflight_configures_on_a_bare_node_through_the_build_venv(node, debian_dsc):
    engine, tag, work = node
    src = work / "src"
    shutil.copytree(Path(debian_dsc).parent, src)
    profile = PROFILE.relative_to(REPO)  # the checkout is the node's working directory
    script = (
        "for t in cmake ninja ccache; do command -v $t && exit 3; done; "
        f"$TB build --preflight --profile {profile} --source /work/src/{Path(debian_dsc).name} --out /work/out "
        "--set cache_dir=/work/cache --set patches=none"
    )
    rc, out = run_bare(engine, tag, script, {str(work): "/work"}, "0:0")
    assert rc == 0, out[-5000:]
    cold = re.search(r"^build venv: created in (\d+) s \((\S+): cmake 3\.\d+\.\d+, ninja [\d.]+\)$", out, re.M)
    assert cold, out[-3000:]
    assert "-- Build files have been written to:" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("manifest: "))
    m = json.loads((work / Path(line.split(": ", 1)[1]).relative_to("/work")).read_text())
    assert m["preflight"]["targets"] == ["c10"] and m["toolchain"]["cmake"].startswith("cmake version 3.")
    # the configure ran with the venv's python and cmake
    tree = re.search(r"^torchbuild \S+: preflight of (\S+)$", out, re.M)
    assert tree, out[:3000]
    cache = (work / Path(tree.group(1)).relative_to("/work") / "build" / "CMakeCache.txt").read_text(errors="replace")
    command = next(ln for ln in cache.splitlines() if ln.startswith("CMAKE_COMMAND:INTERNAL="))
    assert command.startswith("CMAKE_COMMAND:INTERNAL=/work/cache/buildenv/"), command
    print(
        f"\nreal PyTorch preflight on the bare node: venv {m['build_venv']['seconds']:.0f} s, "
        f"configure {m['preflight']['configure_s']:.0f} s, c10 {m['preflight']['targets_s']:.0f} s"
    )
