"""Wheel checks of `invoke verify` (file, name, tags), its table, and a whole verify of a tiny
hand-made wheel in a fresh venv, without an engine."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.tags import Tag

from torchbuild.core.errors import PathError, UsageError, VerifyFailed, WheelError
from torchbuild.profile.config import resolve
from torchbuild.runtime.steps import run_step_file
from torchbuild.verify.step import (
    Check,
    check_wheel_file,
    render,
    report,
    request,
    run_request,
    supported_tags,
    tag_checks,
    verify_wheel,
)

PY = f"cp{sys.version_info.major}{sys.version_info.minor}"
GOOD = f"tiny_pkg-1.2.3+tb-{PY}-{PY}-linux_x86_64.whl"


def statuses(checks: list[Check]) -> dict[str, str]:
    return {c.name: c.status for c in checks}


def make_wheel(path: Path, version: str = "1.2.3+tb", dist_info: bool = True) -> Path:
    """A minimal but complete wheel of the package tiny_pkg, which holds just a __version__."""
    files = {"tiny_pkg/__init__.py": f'__version__ = "{version}"\n'}
    if dist_info:
        di = f"tiny_pkg-{version}.dist-info"
        files[f"{di}/METADATA"] = f"Metadata-Version: 2.1\nName: tiny_pkg\nVersion: {version}\n"
        files[f"{di}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        digest = {
            n: base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=") for n, t in files.items()
        }
        record = "".join(f"{n},sha256={d.decode()},{len(files[n])}\n" for n, d in digest.items())
        files[f"{di}/RECORD"] = record + f"{di}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


# --- tags ---------------------------------------------------------------------------------


def test_a_matching_wheel_passes():
    name = f"torch-2.6.0+gh200-{PY}-{PY}-linux_aarch64.whl"
    got = statuses(tag_checks(name, "2.6.0+gh200", supported_tags(machine="aarch64")))
    assert got == {"version": "pass", "python tag": "pass", "abi tag": "pass", "platform tag": "pass"}
    manylinux = f"torch-2.6.0-{PY}-{PY}-manylinux_2_28_x86_64.whl"
    assert statuses(tag_checks(manylinux, "2.6.0", supported_tags(machine="x86_64")))["platform tag"] == "pass"
    assert statuses(tag_checks("tiny-1.0-py3-none-any.whl", "1.0")) == {
        "version": "pass",
        "python tag": "pass",
        "abi tag": "pass",
        "platform tag": "pass",
    }


@pytest.mark.parametrize(
    ("name", "failed"),
    [
        pytest.param(f"torch-2.6.0+cpu-{PY}-{PY}-linux_aarch64.whl", "version", id="other-local-version"),
        pytest.param(f"torch-2.6.0-{PY}-{PY}-linux_aarch64.whl", "version", id="no-local-version"),
        pytest.param(f"torch-2.6.0+gh200-{PY}-{PY}-linux_x86_64.whl", "platform tag", id="other-machine"),
        pytest.param(f"torch-2.6.0+gh200-{PY}-{PY}-win_amd64.whl", "platform tag", id="other-os"),
        pytest.param("torch-2.6.0+gh200-py2-none-linux_aarch64.whl", "python tag", id="python-2-only"),
        pytest.param(f"torch-2.6.0+gh200-{PY}-cp27mu-linux_aarch64.whl", "abi tag", id="other-abi"),
        pytest.param(f"torch-2.6.0+gh200-py3-{PY}-any.whl", "tag combination", id="parts-fit-combination-does-not"),
    ],
)
def test_a_wrong_version_or_tag_fails_its_row(name, failed):
    checks = tag_checks(name, "2.6.0+gh200", supported_tags(machine="aarch64"))
    got = statuses(checks)
    assert got[failed] == "fail"
    assert [n for n, s in got.items() if s == "fail"] == [failed], got


def test_tag_rows_say_what_this_interpreter_takes():
    here = (Tag(PY, PY, "linux_aarch64"), Tag(PY, "abi3", "linux_aarch64"), Tag("py3", "none", "any"))
    rows = {c.name: c.detail for c in tag_checks(f"torch-2.6.0-{PY}-{PY}-linux_x86_64.whl", "", here)}
    assert "version" not in rows  # no expectation, no row
    assert rows["python tag"] == f"{PY} (this interpreter takes {PY}, py3)"
    assert rows["abi tag"] == f"{PY} (this interpreter takes {PY}, abi3, none)"
    assert rows["platform tag"] == "linux_x86_64 (this interpreter takes linux_aarch64, any)"


def test_supported_tags_are_packagings_for_this_interpreter():
    from packaging.tags import sys_tags

    assert supported_tags() == tuple(sys_tags())
    assert all(not t.platform.endswith("_x86_64") for t in supported_tags(machine="aarch64"))


# --- the wheel file -----------------------------------------------------------------------


def _truncated(path: Path) -> None:
    make_wheel(path)
    path.write_bytes(path.read_bytes()[:40])


BAD_WHEELS = [
    pytest.param("foo.tar.gz", lambda p: p.write_text("x"), "not a wheel file name", id="tarball-name"),
    pytest.param("torch-2.6.0.whl", lambda p: p.write_text("x"), "not a wheel file name", id="too-few-name-parts"),
    pytest.param(f"torch-x.y-{PY}-{PY}-linux_x86_64.whl", make_wheel, "not a wheel file name", id="invalid-version"),
    pytest.param(GOOD, lambda p: p.write_text("not a zip\n"), "not a zip archive", id="text-file"),
    pytest.param(GOOD, lambda p: p.write_bytes(b""), "not a zip archive", id="empty-file"),
    pytest.param(GOOD, _truncated, "not a zip archive", id="truncated-zip"),
    pytest.param(GOOD, lambda p: make_wheel(p, dist_info=False), "without a *.dist-info/WHEEL", id="zip-no-dist-info"),
    pytest.param(
        GOOD,
        lambda p: zipfile.ZipFile(p, "w").writestr("a/b.dist-info/WHEEL", "x"),
        "without a *.dist-info/WHEEL",
        id="dist-info-not-at-top",
    ),
]


@pytest.mark.parametrize(("name", "make", "says"), BAD_WHEELS)
def test_a_file_that_is_not_a_wheel_is_a_wheel_error_naming_it(tmp_path, name, make, says):
    path = tmp_path / name
    make(path)
    with pytest.raises(WheelError, match="not a") as info:
        check_wheel_file(path)
    assert str(path) in info.value.message and says in info.value.message


@pytest.mark.parametrize(("name", "make", "says"), BAD_WHEELS)
def test_verify_refuses_a_non_wheel_before_any_check(tmp_path, name, make, says):
    """What `invoke verify --wheel FILE` does: a named error (exit 18), no table, no report."""
    path = tmp_path / name
    make(path)
    req = request(resolve("cpu"), wheel=path, installed="", expect_version="", report=None)
    with pytest.raises(WheelError) as info:
        run_request(req)
    assert info.value.exit_code == 18 and str(path) in info.value.message
    assert not Path(req.report).exists()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        pytest.param(lambda p: None, "does not exist", id="missing"),
        pytest.param(lambda p: p.mkdir(), "is a directory", id="directory"),
    ],
)
def test_a_wheel_path_that_cannot_be_read_is_a_path_error(tmp_path, make, says):
    path = tmp_path / GOOD
    make(path)
    with pytest.raises(PathError, match=says) as info:
        check_wheel_file(path)
    assert str(path) in info.value.message


def test_a_real_wheel_passes_the_file_check(tmp_path):
    check_wheel_file(make_wheel(tmp_path / GOOD))


# --- a whole verify, in a fresh venv --------------------------------------------------------


def test_verify_installs_a_wheel_into_a_fresh_venv_and_probes_it_there(tmp_path):
    wheel = make_wheel(tmp_path / "tiny_pkg-1.2.3+tb-py3-none-any.whl")
    got = {c.name: c for c in verify_wheel(wheel, resolve("cpu"), "1.2.3+tb")}
    assert [c.status for c in got.values()] == ["pass"] * 8, got
    assert "no ELF file" in got["ELF floor"].detail  # a pure wheel: no glibc floor
    assert "/torchbuild-verify-" in got["import tiny_pkg"].detail  # the fresh venv's copy
    assert got["tiny_pkg.__version__"].detail == "1.2.3+tb (expected 1.2.3+tb)"


@pytest.mark.skipif(not Path("/usr/lib/python3/dist-packages/jwt").is_dir(), reason="needs Debian's python3-jwt")
def test_the_fresh_venv_sees_the_system_packages_a_system_site_base_sees(tmp_path):
    """The real Debian 2.6 build's verify (issue 42): its image's venv takes Debian's packages
    (python_system_site_packages), yet the fresh venv saw only the venv's own, so PyTorch's
    tests found no pytest. Here: a base venv of the system Python with its packages (Debian's
    python3-jwt), and the fresh venv made from it imports jwt from there."""
    import subprocess

    from torchbuild.verify.step import _fresh_venv

    base = tmp_path / "base"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages", str(base)], check=True)
    python = _fresh_venv(tmp_path / "fresh", str(base / "bin" / "python"))
    code = "import jwt, sys; print(jwt.__file__); print(sys.prefix)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0].startswith("/usr/lib/python3/dist-packages/") and out[1] == str(tmp_path / "fresh" / "venv")


def test_run_request_prints_the_table_and_writes_the_report(tmp_path, capsys):
    wheel = make_wheel(tmp_path / "tiny_pkg-1.2.3+tb-py3-none-any.whl")
    req = request(resolve("cpu"), wheel=wheel, installed="", expect_version="9.9", report=None)
    with pytest.raises(VerifyFailed, match=re.escape("version, tiny_pkg.__version__")):
        run_request(req)
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "6 passed, 2 failed, 0 skipped" and out[-1] == f"report: {wheel}.verify.json"
    data = json.loads(Path(f"{wheel}.verify.json").read_text())
    assert data["ok"] is False and data["subject"] == wheel.name


# --- the table ------------------------------------------------------------------------------


def test_render_is_a_table_closed_by_the_counts_alone_on_a_line():
    checks = [Check("a", "pass"), Check("b", "fail", "why"), Check("c", "skip", "no GPU visible")]
    lines = render(checks).splitlines()
    assert lines[0].split() == ["status", "check", "detail"]
    assert lines[-1] == "1 passed, 1 failed, 1 skipped"
    assert any(line.split() == ["FAIL", "b", "why"] for line in lines)
    assert report(checks, "x")["ok"] is False
    assert report(checks[:1], "x")["ok"] is True


# --- verify-inside's request and the report -------------------------------------------------


@pytest.mark.parametrize(
    ("content", "error", "says"),
    [
        pytest.param(None, PathError, "does not exist", id="missing"),
        pytest.param("", UsageError, "is not JSON", id="empty"),
        pytest.param("{spec: 1", UsageError, "is not JSON", id="not-json"),
        pytest.param("[1, 2]", UsageError, "is not a JSON object", id="a-list"),
        pytest.param('{"wheel": "x.whl"}', UsageError, "spec: missing", id="no-spec"),
        pytest.param('{"spec": {}}', UsageError, "keys missing", id="an-empty-spec"),
        pytest.param(
            json.dumps({"spec": resolve("cpu").to_dict()}),
            UsageError,
            "neither a wheel nor a package",
            id="nothing-to-verify",
        ),
    ],
)
def test_verify_inside_refuses_a_bad_request_file_by_name(tmp_path, content, error, says):
    path = tmp_path / "request.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(error, match=says) as info:
        run_step_file("verify", str(path))
    assert str(path) in info.value.message


def test_a_report_that_cannot_be_written_is_a_path_error(tmp_path):
    wheel = make_wheel(tmp_path / "tiny_pkg-1.2.3+tb-py3-none-any.whl")
    report_path = tmp_path / "no-such-dir" / "r.json"
    req = request(resolve("cpu"), wheel=wheel, installed="", expect_version="1.2.3+tb", report=report_path)
    with pytest.raises(PathError, match="verify report") as info:
        run_request(req)
    assert str(report_path) in info.value.message


def test_the_verify_report_is_written_atomically_so_a_failed_write_keeps_the_old_one(tmp_path, monkeypatch, capsys):
    """<wheel>.verify.json is also resume's marker: a failed write must not leave half of one."""
    import errno
    import os

    from torchbuild.core.errors import InsufficientSpace
    from torchbuild.verify import step as vf
    from torchbuild.verify.step import Check

    wheel = make_wheel(tmp_path / "tiny_pkg-1.2.3+tb-py3-none-any.whl")
    report = Path(f"{wheel}.verify.json")
    report.write_text('{"ok": true}\n')
    monkeypatch.setattr(vf, "verify_wheel", lambda *a, **kw: [Check("import tiny_pkg", "pass")])
    real = os.replace

    def full(src, dst, *a, **kw):
        if Path(dst) == report:
            raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", full)
    req = request(resolve("cpu"), wheel=wheel, installed="", expect_version="1.2.3+tb", report=None)
    with pytest.raises(InsufficientSpace, match="verify report"):
        run_request(req)
    assert report.read_text() == '{"ok": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == [wheel.name, report.name]  # no temporary file
    monkeypatch.setattr(os, "replace", real)
    assert run_request(req) == 0 and json.loads(report.read_text())["subject"] == wheel.name
