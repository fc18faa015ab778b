from __future__ import annotations

import pytest

from torchbuild.doctor.host import Check, Verdict, ca_check, render

PEM = "-----BEGIN CERTIFICATE-----\n"


@pytest.fixture
def ca_dirs(tmp_path):
    """Two CA directories like /usr/local/share/ca-certificates and /etc/pki/ca-trust/source/anchors."""
    local, anchors = tmp_path / "local", tmp_path / "anchors"
    local.mkdir()
    anchors.mkdir()
    return [local, anchors]


def test_no_added_cas_is_fine(ca_dirs):
    check = ca_check(ca_dirs, "cpu", [])
    assert check.ok and check.detail.startswith("none added under")


def test_cas_the_profile_does_not_carry_are_reported_with_the_setting(ca_dirs):
    local, anchors = ca_dirs
    (local / "proxy.crt").write_text(PEM)
    (anchors / "site.pem").write_text(PEM)
    (local / "README").write_text("not a CA")
    check = ca_check(ca_dirs, "cpu", [str(local / "proxy.crt")])
    assert not check.ok
    assert f"profile cpu does not carry {anchors / 'site.pem'} into images" in check.detail
    assert f"--set ca_certificates={local / 'proxy.crt'},{anchors / 'site.pem'}" in check.detail
    assert "README" not in check.detail


def test_cas_the_profile_lists_are_ok(ca_dirs):
    local, _ = ca_dirs
    (local / "proxy.crt").write_text(PEM)
    check = ca_check(ca_dirs, "site", [str(local / "proxy.crt")])
    assert check.ok and "profile site carries them (ca_certificates)" in check.detail


def test_render_is_a_table_per_section():
    text = render(
        [Check("docker engine", True, "20.10"), Check("host CA certificates", False, "profile cpu does not carry x")],
        [Verdict("config", True, "always available"), Verdict("base-image", False, "needs root")],
    )
    rows = {ln.split()[1] if ln.split()[0] in ("ok", "--") else ln.split()[-1]: ln for ln in text.splitlines() if ln}
    assert rows["docker"].split()[:3] == ["ok", "docker", "engine"]
    lines = text.splitlines()
    ready = next(ln for ln in lines if "config" in ln and "always" in ln)
    assert ready.split()[0] == "ready"
    not_ready = next(ln for ln in lines if "base-image" in ln)
    assert not_ready.split()[:3] == ["NOT", "READY", "base-image"]
    # columns line up: every task starts in the same column
    assert ready.index("config") == not_ready.index("base-image")


def node(**facts):
    from torchbuild.core.arch import Arch
    from torchbuild.doctor.host import _Host

    base = dict(arch=Arch.X86_64, machine="x86_64", emulation={Arch.AARCH64: False}, engine_ok=False, debootstrap=None)
    return _Host(
        **{**base, "root": False, "apptainer": "/usr/bin/apptainer", "fuse": False, "native_missing": (), **facts}
    )


def test_recipe_verdict_says_which_bootstraps_a_node_can_build(tmp_path):
    from torchbuild.doctor.host import _recipe_verdict

    etc = tmp_path / "etc"
    etc.mkdir()
    for name in ("subuid", "subgid"):
        (etc / name).write_text("other:100000:65536\n")
    v = _recipe_verdict(node(), etc=etc, uid=1000, user="alice")
    assert v.ok and v.why.startswith("docker bootstrap only") and "apptainer config fakeroot --add alice" in v.why
    for name in ("subuid", "subgid"):
        (etc / name).write_text("alice:100000:65536\n")
    assert "debootstrap or docker" in _recipe_verdict(node(), etc=etc, uid=1000, user="alice").why
    assert "as root" in _recipe_verdict(node(root=True), etc=etc).why
    assert not _recipe_verdict(node(apptainer=None), etc=etc).ok
    assert _recipe_verdict(node(apptainer=None, engine_ok=True, fuse=True), etc=etc).ok


def test_a_bare_node_with_a_compiler_and_venv_is_ready_to_build_natively():
    """cmake and ninja come from the build venv and ccache is optional: only a compiler and
    Python's venv are needed, and the verdict says what the build will do without the others."""
    from torchbuild.doctor.host import _native_verdict

    bare = _native_verdict(node(native_absent=("cmake", "ninja", "ccache")))
    assert bare.ok and "cmake and ninja from PyPI in the build venv" in bare.why and "no compile cache" in bare.why
    full = _native_verdict(node())
    assert full.ok and full.why == "a compiler and Python's venv"
    none = _native_verdict(node(native_missing=("g++ or clang++",)))
    assert not none.ok and none.why == "missing: g++ or clang++"
