"""Files a wheel task reads (issue 41 items 12, 20 and 24): a FIFO named *.whl (given with
--wheel, found in --out, or already in the wheelhouse) is refused at once instead of holding the
task for good; a name that is no project's (`..-1.0-py3-none-any.whl`) is refused; a damaged file
already in the wheelhouse is named as the wheelhouse's, not as a --wheel the user never gave.
A file that is no regular file is a PathError (exit 15, as a directory named *.whl was), a file
that is no wheel a WheelError (18). The tasks run as the user runs them (the `torchbuild`
program), each bounded in time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TORCH_TAG, make_wheel

from torchbuild.core.errors import WheelError
from torchbuild.install.wheelhouse import add_wheels

TORCHBUILD = Path(sys.executable).with_name("torchbuild")
FIFO_NAME = f"torch-2.6.0+cpu-{TORCH_TAG}.whl"
BOUND_S = 30  # far more than a refusal takes; the hang it replaces never ended


def _torchbuild(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TORCHBUILD), *args], cwd=cwd, capture_output=True, text=True, timeout=BOUND_S, check=False
    )


def _fifo(directory: Path, name: str = FIFO_NAME) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    os.mkfifo(path)
    return path


def _refused(res: subprocess.CompletedProcess[str], first: str, code: int = 15) -> None:
    assert res.returncode == code, res.stdout + res.stderr
    lines = res.stderr.splitlines()
    assert lines[0] == first, res.stderr
    assert len(lines) == 2 and lines[1].startswith("hint: ") and "Traceback" not in res.stderr


def test_a_fifo_given_with_wheel_is_refused_by_wheelhouse_and_install(tmp_path):
    fifo = _fifo(tmp_path / "out")
    said = f"error: PathError: --wheel {fifo} is not a regular file (a device, FIFO or socket)"
    _refused(_torchbuild("wheelhouse", "--dest", "house", "--wheel", str(fifo), cwd=tmp_path), said)
    _refused(_torchbuild("install", "--wheel", str(fifo), "--prefix", str(tmp_path / "env"), cwd=tmp_path), said)
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_a_fifo_among_the_wheels_in_out_is_named_as_a_file_there(tmp_path):
    make_wheel(tmp_path / "out", "numpy", "2.0.0")
    fifo = _fifo(tmp_path / "out")
    said = f"error: PathError: the file {fifo} is not a regular file (a device, FIFO or socket)"
    _refused(_torchbuild("wheelhouse", "--dest", "house", cwd=tmp_path), said)
    _refused(_torchbuild("install", "--prefix", str(tmp_path / "env"), cwd=tmp_path), said)


def test_a_fifo_already_in_the_wheelhouse_is_named_as_the_wheelhouses(tmp_path):
    good = make_wheel(tmp_path / "out", "numpy", "2.0.0")
    fifo = _fifo(tmp_path / "house")
    res = _torchbuild("wheelhouse", "--dest", "house", "--wheel", str(good), cwd=tmp_path)
    _refused(res, f"error: PathError: the wheelhouse's file {fifo} is not a regular file (a device, FIFO or socket)")
    assert f"remove or replace it: {tmp_path / 'house'}" in res.stderr
    assert sorted(os.listdir(tmp_path / "house")) == [FIFO_NAME]


def test_a_damaged_file_already_in_the_wheelhouse_is_not_called_a_wheel_option(tmp_path):
    """Item 24: it was reported as `--wheel <that file>`, an option the user never gave."""
    good = make_wheel(tmp_path / "out", "numpy", "2.0.0")
    damaged = tmp_path / "house" / FIFO_NAME
    damaged.parent.mkdir()
    damaged.write_bytes(b"not a zip")
    res = _torchbuild("wheelhouse", "--dest", "house", "--wheel", str(good), cwd=tmp_path)
    _refused(res, f"error: WheelError: the wheelhouse's file {damaged} is named like a wheel but is not a zip archive "
             "(File is not a zip file)", code=18)  # fmt: skip
    assert "--wheel" not in res.stderr.splitlines()[0]
    assert not (tmp_path / "house" / good.name).exists()


@pytest.mark.parametrize(
    "name", ["..-1.0-py3-none-any.whl", ".-1.0-py3-none-any.whl", "_x-1.0-py3-none-any.whl", "x_-1.0-py3-none-any.whl"]
)
def test_a_wheel_whose_name_is_no_project_is_refused(tmp_path, name):
    """Item 20: `..-1.0-py3-none-any.whl` was "added", yet the result said 0 wheels and the index
    never showed it (packaging's parse_wheel_filename takes `..` as a name)."""
    wheel = make_wheel(tmp_path / "src", "dots", "1.0").rename(tmp_path / "src" / name)
    with pytest.raises(WheelError) as info:
        add_wheels(tmp_path / "house", [wheel])
    assert info.value.message.startswith(f"--wheel {wheel} is not a wheel file name"), info.value.message
    assert "is not a project name" in info.value.message
    assert not (tmp_path / "house").exists()
    res = _torchbuild("wheelhouse", "--dest", "house", "--wheel", str(wheel), cwd=tmp_path)
    assert res.returncode == 18 and "is not a project name" in res.stderr, res.stderr


def test_project_names_with_dots_dashes_and_underscores_inside_are_wheels(tmp_path):
    wheels = [make_wheel(tmp_path / "src", name, "1.0") for name in ("zope.interface", "a_b", "x")]
    added = add_wheels(tmp_path / "house", wheels)
    assert len(added) == 3
