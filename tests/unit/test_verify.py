"""Wheel-name checks of `invoke verify`, without an engine."""

from __future__ import annotations

import sys

import pytest

from torchbuild.verify import Check, parse_wheel_name, render, report, tag_checks

PY = f"cp{sys.version_info.major}{sys.version_info.minor}"


def statuses(checks: list[Check]) -> dict[str, str]:
    return {c.name: c.status for c in checks}


def test_a_matching_wheel_passes():
    name = f"torch-2.6.0+gh200-{PY}-{PY}-linux_aarch64.whl"
    got = statuses(tag_checks(name, "2.6.0+gh200", machine="aarch64"))
    assert got == {"version": "pass", "python tag": "pass", "abi tag": "pass", "platform tag": "pass"}
    assert (
        statuses(tag_checks(f"torch-2.6.0-{PY}-{PY}-manylinux_2_28_x86_64.whl", "2.6.0", "x86_64"))["platform tag"]
        == "pass"
    )


@pytest.mark.parametrize(
    ("name", "failed"),
    [
        (f"torch-2.6.0+cpu-{PY}-{PY}-linux_x86_64.whl", "version"),
        (f"torch-2.6.0+gh200-{PY}-{PY}-linux_x86_64.whl", "platform tag"),
        ("torch-2.6.0+gh200-cp27-cp27mu-linux_aarch64.whl", "python tag"),
    ],
)
def test_a_wrong_version_platform_or_python_fails(name, failed):
    got = statuses(tag_checks(name, "2.6.0+gh200", machine="aarch64"))
    assert got[failed] == "fail"


def test_wheel_names_are_parsed_and_bad_ones_refused():
    assert parse_wheel_name("minitorch-2.6.0+tbtest-1-cp313-cp313-linux_x86_64.whl")["build"] == "1"
    with pytest.raises(ValueError, match="not a wheel file name"):
        parse_wheel_name("torch.tar.gz")


def test_render_and_report_count_failures():
    checks = [Check("a", "pass"), Check("b", "fail", "why"), Check("c", "skip", "no GPU visible")]
    assert render(checks).endswith("1 passed, 1 failed, 1 skipped")
    assert report(checks, "x")["ok"] is False
    assert report(checks[:1], "x")["ok"] is True
