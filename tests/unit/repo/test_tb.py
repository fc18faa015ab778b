"""./tb, the bootstrap script: its refusals, its stamp (a second call installs nothing) and its
dispatch to invoke and nox. A copy of tb runs in a temporary checkout whose .venv holds stand-ins:
bin/python runs this interpreter but logs `-m pip ...` instead of installing (making a real venv
and installing into it is tests/integration/test_stock_distros.py's, on stock distributions)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

PIP_LOG = "pip.log"


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    shutil.copy(REPO / "tb", root / "tb")
    (root / "pyproject.toml").write_text('[project]\nname = "torchbuild"\n')
    return root


@pytest.fixture
def stub_venv(checkout: Path) -> Path:
    """.venv with a python that logs pip installs, and an invoke and a nox that print their
    arguments and working directory."""
    bin_dir = checkout / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    log = checkout / PIP_LOG
    _script(
        bin_dir / "python",
        f'#!/bin/sh\nif [ "$1 $2" = "-m pip" ]; then [ "$3" != install ] || echo "$*" >>"{log}"; exit 0; fi\nexec "{sys.executable}" "$@"\n',
    )
    for tool in ("invoke", "nox"):
        _script(bin_dir / tool, f'#!/bin/sh\necho "{tool} $* in $(pwd)"\n')
    return bin_dir


def tb(root: Path, *args: str, cwd: Path | None = None, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {**os.environ, "TB_PYTHON": python}
    return subprocess.run(
        [str(root / "tb"), *args], cwd=cwd or root, env=env, capture_output=True, text=True, check=False
    )


def pip_calls(root: Path) -> list[str]:
    log = root / PIP_LOG
    return log.read_text().splitlines() if log.exists() else []


def test_a_second_call_installs_nothing(checkout: Path, stub_venv: Path) -> None:
    first = tb(checkout, "image", "--help")
    assert first.returncode == 0, first.stderr
    assert pip_calls(checkout) == [
        f"-m pip install -q --disable-pip-version-check -e {checkout}[test,report] nox>=2024.4"
    ]
    assert first.stdout == f"invoke --search-root {checkout} image --help in {checkout}\n"
    again = tb(checkout, "build", "--in-container")
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == f"invoke --search-root {checkout} build --in-container in {checkout}\n"
    assert len(pip_calls(checkout)) == 1


def test_a_changed_pyproject_reinstalls(checkout: Path, stub_venv: Path) -> None:
    assert tb(checkout, "--version").returncode == 0
    with (checkout / "pyproject.toml").open("a") as f:
        f.write('dependencies = ["rich"]\n')
    assert tb(checkout, "--version").returncode == 0
    assert len(pip_calls(checkout)) == 2


def test_nox_runs_from_the_checkout(checkout: Path, stub_venv: Path, tmp_path: Path) -> None:
    res = tb(checkout, "nox", "-s", "lint", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"nox -s lint in {checkout}\n"


def test_no_arguments_list_the_tasks(checkout: Path, stub_venv: Path) -> None:
    res = tb(checkout)
    assert res.stdout == f"invoke --search-root {checkout} --list in {checkout}\n"
    assert "tb: usage: ./tb TASK [ARGS] (invoke; ./tb TASK --help), ./tb nox [ARGS]" in res.stderr


def test_an_old_python_is_refused_in_one_line(checkout: Path, tmp_path: Path) -> None:
    """A stand-in python3 3.8 (what RHEL 8 and Ubuntu 20.04 have): one line, exit 1, no .venv."""
    old = tmp_path / "python3"
    _script(old, "#!/bin/sh\necho 3.8.18\n")
    res = tb(checkout, "--list", python=str(old))
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == f"tb: torchbuild needs Python >= 3.9; {old} is 3.8.18 (set TB_PYTHON to a newer one)\n"
    assert not (checkout / ".venv").exists()


def test_a_missing_python_is_named(checkout: Path) -> None:
    res = tb(checkout, "--list", python="python3-not-here")
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr.count("\n") == 1
    assert res.stderr.startswith("tb: no python3-not-here on PATH: install Python >= 3.9")
