"""A bare login node: a compiler and a Python, nothing else a build needs (no cmake, no ninja, no
ccache, no conda), as a site gives before `module load`. torchbuild's own dependencies live
in their own venv (/opt/torchbuild, as a user's `pipx install torchbuild` would), apart from
the build's; this checkout's source is bound in and put on PYTHONPATH. pip reaches PyPI
through this host's CA bundle (PIP_CERT, as a site's pip configuration would say)."""

from __future__ import annotations

import io
import shutil
import sys
from pathlib import Path

import tomllib
from helpers import REPO

BARE_TAG = "torchbuild-test/bare:{suite}"
PIP_CERT = "/etc/ssl/certs/ca-certificates.crt"

DOCKERFILE = """\
FROM {base}
COPY certs/ /usr/local/share/ca-certificates/
RUN apt-get -o Acquire::Check-Valid-Until=false update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
    gcc g++ libc6-dev python3 python3-venv python3-dev ca-certificates \\
 && rm -rf /var/lib/apt/lists/* \\
 && python3 -m venv /opt/torchbuild \\
 && PIP_CERT={cert} /opt/torchbuild/bin/pip install --no-input {deps}
"""


def torchbuild_dependencies() -> list[str]:
    """torchbuild's runtime requirements, as pyproject.toml lists them."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def build_bare_image(engine, base: str, suite: str, work: Path) -> str:
    """The bare node's image on base (torchbuild/base:<suite>-x86_64); its tag."""
    import shlex

    context = work / "bare-context"
    (context / "certs").mkdir(parents=True, exist_ok=True)
    for cert in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy(cert, context / "certs" / cert.name)
    deps = " ".join(shlex.quote(d) for d in torchbuild_dependencies())
    (context / "Dockerfile").write_text(DOCKERFILE.format(base=base, cert=PIP_CERT, deps=deps))
    tag = BARE_TAG.format(suite=suite)
    engine.build(context, tag=tag, log=work / "bare-image.log", out=io.StringIO())
    return tag


def run_bare(engine, tag: str, script: str, mounts: dict[str, str], user: str) -> tuple[int, str]:
    """bash -c script on the bare node, from the checkout (invoke finds tasks.py there) with
    torchbuild's venv first for `python`, and the default PATH otherwise; (exit, output)."""
    buf = io.StringIO()
    rc = engine.run(
        tag,
        ["bash", "-c", script],
        mounts={str(REPO): "/repo", **mounts},
        user=user,
        environment={
            "HOME": "/tmp",
            "PYTHONPATH": "/repo/src",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PIP_CERT": PIP_CERT,
            "TB": "/opt/torchbuild/bin/python -m invoke",
        },
        workdir="/repo",
        out=buf,
    )
    out = buf.getvalue()
    print(out[-2000:], file=sys.stderr)
    return rc, out
