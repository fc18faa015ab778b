"""A wheel's ELF floor (issue 44 items 1 and 2): measured with auditwheel from real shared objects
this host's g++ builds (Debian 12: glibc 2.36, GCC 12's libstdc++), recorded in the manifest,
tagged manylinux_2_X where the profile names a floor, and checked against the profile's floor
before the build (the toolchain), in verify, in the wheelhouse and before an install."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from helpers import invoke_here

from torchbuild.core import glibc
from torchbuild.core.errors import FloorError, ProfileError
from torchbuild.install.wheelhouse import add_wheels
from torchbuild.profile.config import resolve
from torchbuild.runtime import elffloor
from torchbuild.runtime import manifest as mf
from torchbuild.verify import step as verify

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None or glibc.host_glibc() != "2.36",
    reason="builds shared objects with the host's g++ on glibc 2.36 (Debian 12), as CI's machines are",
)

# arc4random is new in glibc 2.36: the object needs GLIBC_2.36; std::string's C++11 ABI needs
# GLIBCXX_3.4.21; the exception needs CXXABI
SOURCE = r"""
#include <stdlib.h>
#include <string>
#include <stdexcept>
extern "C" unsigned tb_random() { return arc4random(); }
extern "C" long tb_parse(const char* s) {
    std::string t(s);
    if (t.empty()) throw std::runtime_error("empty");
    return std::strtol(t.c_str(), nullptr, 10);
}
"""
TAG = "cp311-cp311-linux_x86_64"


def _so(tmp: Path, name: str, source: str, *link: str) -> Path:
    (tmp / f"{name}.cpp").write_text(source)
    out = tmp / name
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-o", str(out), str(tmp / f"{name}.cpp"), *link], check=True)
    return out


def _site_lib(tmp: Path, soname: str) -> Path:
    """A library named like one the site provides (or not), to link the extension against."""
    lib = tmp / "libs"
    lib.mkdir(parents=True, exist_ok=True)
    base = soname.split(".so")[0]
    (lib / "x.c").write_text("int tb_site_call(void) { return 1; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(lib / soname), str(lib / "x.c")], check=True
    )
    (lib / f"{base}.so").symlink_to(soname)
    return lib


def _wheel(directory: Path, so: Path, name: str = "tbext", tag: str = TAG) -> Path:
    """A platform wheel holding so (as name/_ext.so) with a true RECORD."""
    dist = f"{name}-1.0"
    files = {
        f"{name}/__init__.py": b"",
        f"{name}/_ext.so": so.read_bytes(),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{dist}.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
    }
    record = "".join(f"{p},sha256={_digest(d)},{len(d)}\n" for p, d in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files.items():
            z.writestr(zipfile.ZipInfo(p, date_time=(1980, 1, 1, 0, 0, 0)), d)
        z.writestr(zipfile.ZipInfo(f"{dist}.dist-info/RECORD", date_time=(1980, 1, 1, 0, 0, 0)), record)
    return wheel


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("elf")
    nccl = _site_lib(tmp / "nccl", "libnccl.so.2")
    proto = _site_lib(tmp / "proto", "libprotobuf.so.32")
    call = 'extern "C" int tb_site_call(); extern "C" int tb_use() { return tb_site_call(); }\n'
    return {
        "plain": _so(tmp, "plain.so", SOURCE),
        "nccl": _so(tmp, "nccl.so", SOURCE + call, f"-L{nccl}", "-lnccl", f"-Wl,-rpath,{nccl}"),
        "protobuf": _so(tmp, "proto.so", SOURCE + call, f"-L{proto}", "-lprotobuf", f"-Wl,-rpath,{proto}"),
    }


# --------------------------------------------------------------------------- measuring


def test_floor_of_a_real_shared_object_names_its_glibc_libstdcxx_and_libraries(built, tmp_path):
    floor = elffloor.analyse(_wheel(tmp_path, built["plain"]))
    assert (floor.glibc, floor.glibcxx) == ("2.36", "3.4.21")
    assert floor.cxxabi and glibc.parse(floor.cxxabi) >= (1, 3)
    libs = {r.soname: r for r in floor.libraries}
    assert {"libc.so.6", "libstdc++.so.6"} <= set(libs)
    assert Path(libs["libc.so.6"].path).is_file() and not libs["libc.so.6"].site
    assert floor.policy == "manylinux_2_36_x86_64" and floor.reason == ""
    assert floor.auditwheel.startswith("auditwheel 6.")


def test_a_site_library_keeps_the_tag_another_outside_library_loses_it(built, tmp_path):
    site = elffloor.analyse(_wheel(tmp_path / "a", built["nccl"]))
    nccl = next(r for r in site.libraries if r.soname == "libnccl.so.2")
    assert nccl.site and nccl.path.endswith("libnccl.so.2")
    assert site.policy == "manylinux_2_36_x86_64"
    other = elffloor.analyse(_wheel(tmp_path / "b", built["protobuf"]))
    assert other.policy == ""
    assert "libprotobuf.so.32" in other.reason and "not a site library" in other.reason


def test_a_wheel_whose_tag_names_another_machine_earns_no_tag(built, tmp_path):
    floor = elffloor.analyse(_wheel(tmp_path, built["plain"], tag="cp311-cp311-linux_aarch64"))
    assert floor.policy == "" and "not linux_x86_64" in floor.reason


def test_symbols_newer_than_any_policy_keep_linux_and_say_which(built, tmp_path, monkeypatch):
    import auditwheel.policy

    monkeypatch.setattr(auditwheel.policy.WheelPolicies, "versioned_symbols_policy", lambda self, _: self.linux)
    floor = elffloor.analyse(_wheel(tmp_path, built["plain"]))
    assert floor.policy == "" and "GLIBC_2.36, GLIBCXX_3.4.21" in floor.reason and "auditwheel 6." in floor.reason


def test_a_wheel_without_elf_files_has_no_floor(tmp_path):
    from helpers import make_wheel

    floor = elffloor.analyse(make_wheel(tmp_path, "pure", "1.0", module="pure"))
    assert (floor.glibc, floor.policy) == ("", "") and "no ELF file" in floor.reason


def test_a_wheel_beyond_the_bounds_is_refused_before_auditwheel_unpacks_it(built, tmp_path, monkeypatch):
    from torchbuild.core.errors import WheelError

    monkeypatch.setattr(elffloor, "UNPACKED_LIMIT", 1000)
    with pytest.raises(WheelError, match="unpacked"):
        elffloor.analyse(_wheel(tmp_path, built["plain"]))


# --------------------------------------------------------------------------- tagging


def test_measure_retags_where_the_profile_names_a_floor_and_keeps_wheel_record_and_name_consistent(built, tmp_path):
    lines: list[str] = []
    wheel, floor = elffloor.measure(_wheel(tmp_path, built["plain"]), "2.36", lines.append)
    assert wheel.name == "tbext-1.0-cp311-cp311-manylinux_2_36_x86_64.whl" and wheel.is_file()
    assert not (tmp_path / f"tbext-1.0-{TAG}.whl").exists()
    assert floor.tag == "manylinux_2_36_x86_64" and "glibc 2.36" in lines[0]
    with zipfile.ZipFile(wheel) as z:
        meta = z.read("tbext-1.0.dist-info/WHEEL")
        assert b"Tag: cp311-cp311-manylinux_2_36_x86_64\n" in meta and b"linux_x86_64\n" not in meta.replace(
            b"manylinux_2_36_x86_64", b""
        )
        record = {line.split(",")[0]: line for line in z.read("tbext-1.0.dist-info/RECORD").decode().splitlines()}
        for info in z.infolist():  # every hash in RECORD is true after the rewrite
            if not info.filename.endswith("RECORD"):
                assert record[info.filename].split(",")[1] == f"sha256={_digest(z.read(info))}"


def test_without_a_floor_the_wheel_keeps_linux_and_the_manifest_says_what_it_would_earn(built, tmp_path):
    wheel, floor = elffloor.measure(_wheel(tmp_path, built["plain"]), "", lambda _: None)
    assert wheel.name.endswith("-linux_x86_64.whl")
    assert floor.tag == "linux_x86_64" and floor.policy == "manylinux_2_36_x86_64"
    assert "no glibc_floor" in floor.reason


def test_the_retagged_wheel_installs_with_pip_on_this_host(built, tmp_path):
    wheel, _ = elffloor.measure(_wheel(tmp_path, built["plain"], tag="py3-none-linux_x86_64"), "2.36", print)
    target = tmp_path / "t"
    subprocess.run(
        ["pip", "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        env={"PATH": "/usr/bin:/bin:" + str(Path(shutil.which("pip") or "pip").parent), "PIP_CONFIG_FILE": "/dev/null"},
    )
    assert (target / "tbext" / "_ext.so").is_file()


# --------------------------------------------------------------------------- the manifest


def test_manifest_records_and_shows_the_floor_and_reads_back(built, tmp_path):
    _, floor = elffloor.measure(_wheel(tmp_path, built["nccl"]), "2.36", lambda _: None)
    spec = resolve("cpu")
    wheel = next(tmp_path.glob("*.whl"))
    m = mf.for_build(
        spec,
        run_id="0123456789ab",
        provenance={},
        toolchain={},
        environment={},
        jobs={"max_jobs": 1, "final_jobs": 1, "reason": "test"},
        started="s",
        finished="f",
        seconds=1.0,
        ccache=(0, 0, 0.0),
        log="x.log",
        report=None,
        wheel=wheel,
        floor=floor,
    )
    path = mf.write(m, tmp_path / "w.manifest.json")
    data = json.loads(path.read_text())
    assert data["schema_version"] == 8 and data["floor"]["glibc"] == "2.36"
    nccl = next(r for r in data["floor"]["libraries"] if r["soname"] == "libnccl.so.2")
    assert nccl["site"] is True and nccl["path"].endswith("/nccl/libs/libnccl.so.2")
    assert mf.read(path).floor == floor
    shown = mf.show(mf.read(path))
    assert "ELF floor" in shown and "manylinux_2_36_x86_64" in shown and "the site" in shown
    older = {k: v for k, v in data.items() if k != "floor"}
    assert "not recorded" in mf.show(mf.from_dict({**older, "schema_version": 7}))


def test_manifest_show_task_prints_the_floor(built, tmp_path, capsys):
    test_manifest_records_and_shows_the_floor_and_reads_back(built, tmp_path)
    capsys.readouterr()
    assert invoke_here("manifest.show", "--file", str(tmp_path / "w.manifest.json")) == 0
    assert "GLIBCXX" in capsys.readouterr().out


# --------------------------------------------------------------------------- the profile's floor


# a site base whose glibc torchbuild does not know by name: config leaves the floor to the
# build's check of the real toolchain (this host's, glibc 2.36, in these tests)
SITE_BASE = "base_image=registry.site.example/sles15-toolchain:1"


def test_profile_floor_keys_are_validated(tmp_path):
    assert resolve("cpu", [SITE_BASE, "glibc_floor=2.31", "libstdcxx_floor=3.4.28"]).glibc_floor == "2.31"
    for bad in ("glibc_floor=2.31.x", "glibc_floor=231", "libstdcxx_floor=12", "glibc_floor=2.31;"):
        with pytest.raises(ProfileError, match="floor"):
            resolve("cpu", [SITE_BASE, bad])
    profile = tmp_path / "p.yaml"
    profile.write_text("extends: cpu\nbase_image: site/base:1\nglibc_floor: 2.30\n")  # YAML's number 2.3, not 2.30
    with pytest.raises(ProfileError, match="glibc_floor"):
        resolve(str(profile))


def test_shipped_site_profiles_resolve_with_their_floors():
    assert resolve("derecho").glibc_floor == resolve("archer2").glibc_floor == "2.31"
    assert resolve("alliance").glibc_floor == resolve("cpu").glibc_floor == ""


def test_the_build_refuses_a_toolchain_above_the_floor_and_names_a_base_that_fits():
    spec = resolve("cpu", [SITE_BASE, "glibc_floor=2.31"])
    with pytest.raises(FloorError, match=r"glibc is 2\.36 .*newer than the profile's glibc_floor 2\.31") as err:
        elffloor.check_toolchain(spec, {"PATH": "/usr/bin:/bin"}, "the toolchain image's base ubuntu:24.04")
    assert "debian:bullseye" in err.value.hint and "ubuntu:20.04" in err.value.hint
    assert "2.36" in elffloor.check_toolchain(resolve("cpu", [SITE_BASE, "glibc_floor=2.36"]), {}, "this host")
    assert elffloor.check_toolchain(resolve("cpu"), {}, "this host") == ""


def test_the_build_refuses_a_libstdcxx_above_its_floor():
    env = {"PATH": "/usr/bin:/bin", "CXX": "g++"}
    with pytest.raises(FloorError, match=r"GLIBCXX_3\.4\.30, newer than the profile's libstdcxx_floor 3\.4\.28"):
        elffloor.check_toolchain(resolve("cpu", ["libstdcxx_floor=3.4.28"]), env, "this host")
    assert "GLIBCXX 3.4.30" in elffloor.check_toolchain(resolve("cpu", ["libstdcxx_floor=3.4.30"]), env, "this host")


def test_config_refuses_a_base_above_the_floor_and_names_the_bases_that_meet_it():
    with pytest.raises(
        ProfileError, match=r"'base_image': ubuntu:24\.04 has glibc 2\.39, newer than glibc_floor 2\.31"
    ) as err:
        resolve("archer2", ["base_image=ubuntu:24.04"])
    assert "archer2.yaml" in err.value.message and "debian:bullseye" in err.value.hint
    assert "--set glibc_floor=" in err.value.hint
    with pytest.raises(ProfileError, match=r"trixie-x86_64 has glibc 2\.41"):
        resolve("cpu", ["base_image=torchbuild/base:trixie-x86_64", "glibc_floor=2.36"])
    # a base that meets it, one it does not know (the build checks the real toolchain), no floor
    assert resolve("archer2", ["base_image=torchbuild/base:bullseye-x86_64"]).glibc_floor == "2.31"
    assert resolve("archer2", [SITE_BASE]).glibc_floor == "2.31"
    assert resolve("archer2", ["base_image=ubuntu:24.04", "glibc_floor="]).glibc_floor == ""


def test_bases_meeting_a_floor_are_the_known_ones_at_or_below_it():
    assert glibc.bases_meeting("2.28")[0].startswith(("quay.io/pypa/manylinux_2_28", "rockylinux:8"))
    assert all("2.39" not in b and "2.41" not in b for b in glibc.bases_meeting("2.36"))
    assert glibc.base_glibc("nvidia/cuda:12.6.3-cudnn-devel-ubuntu24.04") == "2.39"
    assert glibc.base_glibc("torchbuild/base:trixie-x86_64") == "2.41"


# --------------------------------------------------------------------------- after the build


def test_verify_fails_a_wheel_above_the_floor_and_passes_one_within(built, tmp_path):
    wheel = _wheel(tmp_path, built["plain"])
    results: dict = {}
    check = verify.floor_check(wheel, resolve("cpu", [SITE_BASE, "glibc_floor=2.31"]), results)
    assert check.status == "fail" and "needs GLIBC_2.36, above the glibc_floor 2.31" in check.detail
    assert results["floor"]["glibc"] == "2.36"
    ok = verify.floor_check(wheel, resolve("cpu", [SITE_BASE, "glibc_floor=2.36"]), {})
    assert ok.status == "pass" and "within glibc_floor 2.36" in ok.detail
    assert verify.floor_check(wheel, resolve("cpu"), {}).status == "pass"


def test_wheelhouse_refuses_a_wheel_above_the_house_floor_and_adds_nothing(built, tmp_path):
    wheel = _wheel(tmp_path / "out", built["plain"])
    house = tmp_path / "house"
    with pytest.raises(FloorError, match=r"floor is glibc 2\.31: tbext-1\.0-.* needs GLIBC_2\.36"):
        add_wheels(house, [wheel], floor=("2.31", ""))
    assert not house.exists()
    assert [p.name for p in add_wheels(house, [wheel], floor=("2.36", ""))] == [wheel.name]


def test_wheelhouse_task_takes_the_floor_from_the_profile(built, tmp_path, capsys):
    wheel = _wheel(tmp_path / "out", built["plain"])
    code = invoke_here(
        "wheelhouse",
        "--dest",
        str(tmp_path / "h"),
        "--wheel",
        str(wheel),
        "--set",
        "glibc_floor=2.31",
        "--set",
        SITE_BASE,
    )
    assert code == FloorError.exit_code and not (tmp_path / "h").exists()
    assert "GLIBC_2.36" in capsys.readouterr().err


def test_install_refuses_a_wheel_above_the_host_glibc_with_the_reason(built, tmp_path):
    wheel = _wheel(tmp_path, built["plain"])
    with pytest.raises(FloorError, match=r"needs GLIBC_2\.36; this host's glibc is 2\.31") as err:
        elffloor.check_host([wheel], host="2.31")
    assert "GLIBC_2.36' not found" in err.value.message and 'glibc_floor: "2.31"' in err.value.hint
    elffloor.check_host([wheel])  # this host's own 2.36: fine


def test_install_task_refuses_before_touching_the_prefix(built, tmp_path, monkeypatch, capsys):
    wheel = _wheel(tmp_path / "out", built["plain"])
    monkeypatch.setattr(glibc, "host_glibc", lambda: "2.31")  # a SLES 15 host
    prefix = tmp_path / "env"
    code = invoke_here(
        "install", "--engine", "native", "--prefix", str(prefix), "--wheel", str(wheel), "--out", str(tmp_path / "out")
    )
    assert code == FloorError.exit_code and not prefix.exists()
    assert "this host's glibc is 2.31" in capsys.readouterr().err


def test_build_and_companions_stop_before_compiling_on_a_toolchain_above_the_floor(tmp_path, monkeypatch):
    import io

    from torchbuild.builder import companions
    from torchbuild.builder import step as build
    from torchbuild.runtime import compile_job

    compiled: list[object] = []
    monkeypatch.setattr(compile_job, "run_compile", lambda *a, **k: compiled.append(a))
    monkeypatch.setattr(companions, "unpack_torch", lambda *a: None)
    spec = resolve("cpu", [f"cache_dir={tmp_path / 'cache'}", "build_venv=false", SITE_BASE, "glibc_floor=2.31"])
    out = tmp_path / "out"
    for d in (out, tmp_path / "pytorch", tmp_path / "vision"):
        d.mkdir()
    (tmp_path / "pytorch" / "setup.py").write_text("")  # a tree of a kind the build knows (runtime/tree.py)
    req = build.BuildRequest(
        spec=spec, source=str(tmp_path / "pytorch"), out_dir=str(out), cache_root=str(tmp_path / "cache")
    )
    with pytest.raises(FloorError, match=r"glibc is 2\.36 \(this host\)"):
        build.run_build(req, out=io.StringIO())
    job = companions.Job(
        name="torchvision", tree=str(tmp_path / "vision"), origin="o", digest="d", version="0.21.0", kind="dir"
    )
    creq = companions.Request(
        spec=spec, torch_wheel=str(out / "torch-2.6.0-cp311-cp311-linux_x86_64.whl"), jobs=(job,),
        out_dir=str(out), cache_root=str(tmp_path / "cache"), run_id="r1",
    )  # fmt: skip
    with pytest.raises(FloorError, match=r"glibc_floor 2\.31"):
        companions.build_all(creq, out=io.StringIO())
    assert compiled == [] and not list(out.glob("*.whl"))


def test_submit_refuses_a_job_in_the_sif_whose_base_is_above_the_floor_before_writing_it(tmp_path, capsys):
    out = tmp_path / "out"
    code = invoke_here(
        "submit", "--profile", "archer2", "--set", "base_image=ubuntu:24.04", "--out", str(out), "--dry-run"
    )
    assert code == ProfileError.exit_code and not out.exists()
    assert "ubuntu:24.04 has glibc 2.39, newer than glibc_floor 2.31" in capsys.readouterr().err


def test_verify_and_install_take_the_manifests_floor_only_for_the_wheel_it_describes(built, tmp_path, monkeypatch):
    test_manifest_records_and_shows_the_floor_and_reads_back(built, tmp_path)  # w.manifest.json of the wheel
    wheel = next(tmp_path.glob("*.whl"))
    (tmp_path / "w.manifest.json").rename(f"{wheel}{mf.SUFFIX}")
    measured = elffloor.analyse

    def no_analysis(_: Path) -> mf.FloorRecord:
        raise AssertionError("measured again although the manifest records this wheel's floor")

    monkeypatch.setattr(elffloor, "analyse", no_analysis)
    assert elffloor.recorded_or_measured(wheel).glibc == "2.36"
    with zipfile.ZipFile(wheel, "a") as z:  # another wheel under the same name: measured again
        z.writestr("tbext/extra.txt", "x")
    calls = []
    monkeypatch.setattr(elffloor, "analyse", lambda w: calls.append(w) or measured(w))
    assert elffloor.recorded_or_measured(wheel).glibc == "2.36" and calls == [wheel]


def test_auditwheel_unpacks_in_the_builds_directory_and_the_default_is_restored(built, tmp_path, monkeypatch):
    import tempfile

    seen: list[str] = []
    real = elffloor._elfdata
    monkeypatch.setattr(elffloor, "_elfdata", lambda w: seen.append(tempfile.gettempdir()) or real(w))
    before = tempfile.tempdir
    work = tmp_path / "run-tmp"
    work.mkdir()
    assert elffloor.analyse(_wheel(tmp_path, built["plain"]), work).glibc == "2.36"
    assert seen == [str(work)] and tempfile.tempdir == before
