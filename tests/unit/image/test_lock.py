"""Toolchain locks (torchbuild.image.lock): the file format and its checks, the pins taken from what an
image build recorded, the installed list and its digest, and its record in the build manifest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchbuild.core.errors import PathError
from torchbuild.image import lock as lk
from torchbuild.runtime import manifest as mf
from torchbuild.runtime.installed import canonical_list, installed_digest

H1, H2, H3 = "a" * 64, "b" * 64, "c" * 64

LOCK = lk.Lock(
    profile="sid-pythons",
    arch="x86_64",
    inputs={"python_version": "3.13", "python_versions": ["3.14"], "apt_packages": ["gcc", "g++"]},
    apt=("binutils-common:amd64=2.47.50.20261021-1", "g++=4:16.1.0-3", "libstdc++-16-dev=16.2.0-4~exp1+b1"),
    pip={
        "3.13": (lk.PipPin("pip", "26.3", (H1,)), lk.PipPin("PyYAML", "6.0.3", (H2,))),
        "3.14": (
            lk.PipPin("pip", "26.3", (H1,)),
            lk.PipPin("mypkg", "", (H3,), "https://example.org/mypkg-1.0.tar.gz"),
        ),
    },
    base_image_id="sha256:" + "d" * 64,
    torchbuild_version="0.1.0",
    created="2026-11-23T06:03:24Z",
)


def test_a_lock_reads_back_as_written(tmp_path):
    path = tmp_path / "sid-pythons.x86_64.lock"
    sha, size = lk.write(LOCK, path)
    text = path.read_text()
    assert text.startswith("# torchbuild toolchain lock: profile sid-pythons, x86_64")
    assert size == len(text.encode()) and not list(tmp_path.glob(".*.tmp"))
    again, sha_again = lk.read(path)
    assert again == LOCK and sha_again == sha
    assert lk.loads(again.dump()) == LOCK
    assert again.counts() == (3, 4)
    # pip's own syntax, one entry a line: a refresh reads as a diff
    assert "  - PyYAML==6.0.3 --hash=sha256:" + H2 in text.splitlines()
    assert "  - mypkg @ https://example.org/mypkg-1.0.tar.gz --hash=sha256:" + H3 in text.splitlines()
    assert "- g++=4:16.1.0-3" in text.splitlines()


def _bash_reads(path: Path) -> list[str]:
    """The words `mapfile -t` + quoted "${a[@]}" hand to apt, as the Dockerfile reads them."""
    script = 'mapfile -t a < "$1"; printf "%s\\0" "${a[@]}"'
    out = subprocess.run(["bash", "-c", script, "bash", str(path)], capture_output=True, text=True, check=True).stdout
    return [w for w in out.split("\0") if w]


def test_rendered_pins_reach_apt_and_pip_intact(tmp_path):
    LOCK.render(tmp_path / "lock")
    assert _bash_reads(tmp_path / "lock" / "apt.txt") == list(LOCK.apt)
    assert (tmp_path / "lock" / "pip-3.13.txt").read_text().splitlines() == [
        f"pip==26.3 --hash=sha256:{H1}",
        f"PyYAML==6.0.3 --hash=sha256:{H2}",
    ]
    assert sorted(p.name for p in (tmp_path / "lock").iterdir()) == ["apt.txt", "pip-3.13.txt", "pip-3.14.txt"]


def test_pip_reads_the_rendered_requirements_with_their_hashes(tmp_path):
    """pip's own parser takes each line as one pinned requirement with its hash (no option, no
    second requirement): what `pip install --require-hashes --no-deps -r` will see. (In a child
    process: pip's internals bring in setuptools' distutils shim.)"""
    LOCK.render(tmp_path)
    script = (
        "import json, sys\n"
        "from pip._internal.network.session import PipSession\n"
        "from pip._internal.req.req_file import parse_requirements\n"
        "parsed = parse_requirements(sys.argv[1], session=PipSession())\n"
        "print(json.dumps([[p.requirement, p.options['hashes']] for p in parsed]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "pip-3.14.txt")], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == [
        ["pip==26.3", {"sha256": [H1]}],
        ["mypkg @ https://example.org/mypkg-1.0.tar.gz", {"sha256": [H3]}],
    ]


def _with(**changes) -> str:
    data = {
        "lock_version": 1,
        "profile": "p",
        "arch": "x86_64",
        "inputs": {},
        "apt": ["gcc=4:14.2.0-1"],
        "pip": {"3.13": [f"pip==26.3 --hash=sha256:{H1}"]},
    }
    data.update(changes)
    return json.dumps(data)  # JSON is YAML


BAD_LOCKS = {
    "not yaml": ("apt: [unclosed", "not YAML"),
    "a list": ("- a\n- b\n", "not a torchbuild lock"),
    "newer": (_with(lock_version=2), "lock_version 2"),
    "no arch": (_with(arch=None), "arch: missing"),
    "apt option": (_with(apt=["-o", "APT::Get::AllowUnauthenticated=true"]), "'-o' is not an apt pin"),
    "apt command": (_with(apt=["gcc=1;reboot"]), "is not an apt pin"),
    "apt substitution": (_with(apt=["gcc=$(reboot)"]), "is not an apt pin"),
    "apt unpinned": (_with(apt=["gcc"]), "'gcc' is not an apt pin"),
    "apt not a list": (_with(apt="gcc=1"), "apt: missing or not a list"),
    "pip index": (_with(pip={"3.13": ["--index-url http://evil.example/simple"]}), "not a pinned pip requirement"),
    "pip range": (_with(pip={"3.13": [f"numpy>=1 --hash=sha256:{H1}"]}), "not a pinned pip requirement"),
    "pip no hash": (_with(pip={"3.13": ["numpy==2.0"]}), "not a pinned pip requirement"),
    "pip short hash": (_with(pip={"3.13": ["numpy==2.0 --hash=sha256:abc"]}), "not a pinned pip requirement"),
    "pip two lines": (_with(pip={"3.13": [f"numpy==2.0 --hash=sha256:{H1}\nsix==1 --hash=sha256:{H1}"]}), "pinned"),
    "pip bad version": (_with(pip={"3.13": [f"numpy==2.0+- --hash=sha256:{H1}"]}), "is not a version"),
    "pip url with a space": (_with(pip={"3.13": [f"x @ http://a/b c --hash=sha256:{H1}"]}), "not a pinned pip"),
    "pip bad url": (_with(pip={"3.13": [f"x @ ftp://a/x.whl --hash=sha256:{H1}"]}), "is not a URL"),
    "python as a number": (
        "lock_version: 1\nprofile: p\narch: x86_64\ninputs: {}\napt: []\npip:\n  3.13: []\n",
        "quote",
    ),
    "no pip": (_with(pip={}), "pip: missing"),
}


@pytest.mark.parametrize("name", BAD_LOCKS)
def test_a_bad_lock_is_a_named_error(tmp_path, name):
    text, message = BAD_LOCKS[name]
    path = tmp_path / "x.lock"
    path.write_text(text)
    with pytest.raises(lk.LockError) as err:
        lk.read(path)
    assert message in err.value.message and str(path) in err.value.message
    assert "invoke image --lock" in err.value.hint
    assert err.value.exit_code == 28


def test_an_unreadable_lock_is_a_path_error(tmp_path):
    with pytest.raises(PathError):
        lk.read(tmp_path / "absent.lock")
    (tmp_path / "bin.lock").write_bytes(b"\xff\xfe")
    with pytest.raises(lk.LockError, match="not UTF-8"):
        lk.read(tmp_path / "bin.lock")


# --------------------------------------------------------------------------- pins from a build's records


def _report(*items: tuple[str, str, dict]) -> bytes:
    return json.dumps(
        {
            "version": "1",
            "install": [
                {"metadata": {"name": n, "version": v}, "download_info": info, "is_direct": "dir_info" in info}
                for n, v, info in items
            ],
        }
    ).encode()


def _archive(sha: str, url: str = "https://files.example/x.whl") -> dict:
    return {"url": url, "archive_info": {"hash": f"sha256={sha}", "hashes": {"sha256": sha}}}


BASE = b"apt=3.3.5\nbash=5.3-4\nlibc6:amd64=2.41-1\n"
INSTALLED = [
    "dpkg apt=3.3.5",
    "dpkg bash=5.3-4",
    "dpkg libc6:amd64=2.42-1",  # upgraded by a dependency: pinned too
    "dpkg gcc=4:16.1.0-3",
    "pip /opt/venv pip==26.3",
    "pip /opt/venv pyyaml==6.0.3",
    "pip /opt/venv setuptools==84.2.1",
    "pip /opt/venv torchbuild==0.1.0",
    "pip /opt/venv-3.14 pip==26.3",
    "pip /opt/venv-3.14 setuptools==84.2.1",
]
RECORDS = {
    "dpkg-base.txt": BASE,
    "pip-3.13.sha256": f"{H1}  /tmp/pip/pip-26.3-py3-none-any.whl\n".encode(),
    "pip-3.14.sha256": f"{H1}  /tmp/pip/pip-26.3-py3-none-any.whl\n".encode(),
    "pip-3.13.json": _report(("setuptools", "84.2.1", _archive(H2))),
    "pip-3.14.json": _report(("setuptools", "84.2.1", _archive(H2))),
    "torchbuild.json": _report(
        ("torchbuild", "0.1.0", {"url": "file:///opt/torchbuild-src", "dir_info": {}}),
        ("PyYAML", "6.0.3", {"url": "https://files.example/p.whl", "archive_info": {"hash": f"sha256={H3}"}}),
    ),
}


def _lock(records=RECORDS, installed=INSTALLED) -> lk.Lock:
    return lk.from_records(
        records, installed, profile="p", arch="x86_64", pythons=("3.13", "3.14"), inputs={"python_version": "3.13"}
    )


def test_pins_come_from_the_records_and_match_the_installed_list():
    lock = _lock()
    assert lock.apt == ("gcc=4:16.1.0-3", "libc6:amd64=2.42-1")  # beyond the base, upgrades included
    assert [p.line() for p in lock.pip["3.13"]] == [
        f"pip==26.3 --hash=sha256:{H1}",
        f"PyYAML==6.0.3 --hash=sha256:{H3}",  # torchbuild's own requirement; torchbuild itself is not pinned
        f"setuptools==84.2.1 --hash=sha256:{H2}",
    ]
    assert [p.name for p in lock.pip["3.14"]] == ["pip", "setuptools"]
    assert lk.loads(lock.dump()).apt == lock.apt


def test_a_package_installed_from_a_directory_cannot_be_locked():
    records = {**RECORDS, "pip-3.14.json": _report(("mine", "1.0", {"url": "file:///src/mine", "dir_info": {}}))}
    installed = [*INSTALLED, "pip /opt/venv-3.14 mine==1.0"]
    with pytest.raises(lk.LockError, match=r"mine 1\.0 was installed from a directory .* cannot pin it by hash"):
        _lock(records, installed)


def test_pins_that_the_image_does_not_have_are_refused():
    changed = [line.replace("pyyaml==6.0.3", "pyyaml==6.0.2") for line in INSTALLED]
    with pytest.raises(lk.LockError, match=r"the report says PyYAML 6\.0\.3, /opt/venv has 6\.0\.2"):
        _lock(installed=changed)
    with pytest.raises(lk.LockError, match=r"/opt/venv-3\.14 has stray, which no recorded pip install put there"):
        _lock(installed=[*INSTALLED, "pip /opt/venv-3.14 stray==1"])
    with pytest.raises(lk.LockError, match=r"no dpkg-base\.txt"):
        _lock({k: v for k, v in RECORDS.items() if k != "dpkg-base.txt"})
    with pytest.raises(lk.LockError, match="not a sha256sum line"):
        _lock({**RECORDS, "pip-3.14.sha256": b"garbage"})


def test_the_failed_locked_step_is_found_in_the_build_log_not_in_its_echo():
    log = (
        "Step 9/36 : RUN ... || { printf 'torchbuild-lock: the locked %s packages did not install\\n' apt; exit 1; }\n"
        "Package cmake is not available, but is referred to by another package.\n"
        "\x1b[91mE:\x1b[0m\x1b[91m \x1b[0m\x1b[91mVersion '9.9.9-1' for 'cmake' was not found\x1b[0m\x1b[91m\n"
        "\x1b[0mtorchbuild-lock: the locked apt packages did not install\n"
        "ERROR: The command '/bin/bash -o pipefail -c mapfile ... printf 'torchbuild-lock: the locked %s' returned 1\n"
    )
    assert lk.install_failures(log) == (["apt"], ["E: Version '9.9.9-1' for 'cmake' was not found"])
    assert lk.install_failures(log.split("\n", 1)[0]) == ([], [])


# --------------------------------------------------------------------------- the installed list


def test_the_installed_digest_is_over_the_canonical_list():
    lines = ["pip /opt/venv wheel==0.48.0", "dpkg gcc=4:16.1.0-3", "", "dpkg gcc=4:16.1.0-3 "]
    assert canonical_list(lines) == ["dpkg gcc=4:16.1.0-3", "pip /opt/venv wheel==0.48.0"]
    assert installed_digest(lines) == installed_digest(reversed(canonical_list(lines)))
    assert installed_digest(lines) != installed_digest([*lines, "pip /opt/venv-3.14 wheel==0.48.0"])
    assert lk.list_differences(["a", "b"], ["b", "c"]) == ["- a", "+ c"]


def test_installed_lines_list_each_venv_own_packages(tmp_path, monkeypatch):
    for venv, name, version in (("venv", "PyYAML", "6.0.3"), ("venv-3.14", "wheel", "0.48.0")):
        info = tmp_path / venv / "lib" / "python3.14" / "site-packages" / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    monkeypatch.setattr(lk, "dpkg_installed", lambda: ["gcc=4:16.1.0-3"])
    assert lk.installed_lines(tmp_path) == [
        "dpkg gcc=4:16.1.0-3",
        f"pip {tmp_path}/venv pyyaml==6.0.3",
        f"pip {tmp_path}/venv-3.14 wheel==0.48.0",
    ]


def test_requires_names_what_a_no_deps_install_left_missing():
    assert lk.unmet_requirements("torchbuild") == []  # this environment has all of torchbuild's
    ok = subprocess.run([sys.executable, "-m", "torchbuild.image.lock", "requires", "torchbuild"], capture_output=True)
    assert ok.returncode == 0
    usage = subprocess.run([sys.executable, "-m", "torchbuild.image.lock", "nonsense"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage:" in usage.stderr


# what a locked image has when it runs `python -m torchbuild.image.lock requires torchbuild`:
# torchbuild installed with --no-deps, so none of its other dependencies may be needed yet
WITHOUT_DEPENDENCIES = """
import runpy, sys
for name in ("cattrs", "docker", "invoke", "spython", "requests", "attrs"):
    sys.modules[name] = None  # `import NAME` fails
sys.argv = ["lock", *sys.argv[1:]]
runpy.run_module("torchbuild.image.lock", run_name="__main__")
"""


@pytest.mark.parametrize("args", [["installed"], ["requires", "torchbuild"]])
def test_the_image_lists_and_checks_its_packages_with_the_standard_library_pyyaml_and_packaging(args):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_DEPENDENCIES, *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_build_manifest_records_the_list_beside_the_log(tmp_path):
    listed = tmp_path / "installed.txt"
    listed.write_text("pip /opt/venv wheel==0.48.0\ndpkg gcc=4:16.1.0-3\ndpkg cmake=4.3.4-1\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    record = mf.installed_packages(logs, "installed-p-run1.txt", listed)
    copy = logs / "installed-p-run1.txt"
    assert copy.read_text().splitlines() == ["dpkg cmake=4.3.4-1", "dpkg gcc=4:16.1.0-3", "pip /opt/venv wheel==0.48.0"]
    assert record == {
        "packages": {
            "sha256": installed_digest(copy.read_text().splitlines()),
            "file": copy.name,
            "dpkg": 2,
            "pip": 1,
        }
    }
    assert mf.installed_packages(logs, "x.txt", tmp_path / "absent") == {}  # a native build: no record
    assert not (logs / "x.txt").exists()


def test_a_manifest_with_the_packages_record_reads_back_and_older_ones_still_read(tmp_path):
    from torchbuild.profile.config import resolve

    spec = resolve("cpu")
    common = {
        "run_id": "r1",
        "provenance": {"engine": "docker", "image": {"tag": "t", "id": "sha256:i", "inputs": {"locked": "true"}}},
        "toolchain": {},
        "environment": {},
        "jobs": {"max_jobs": 2, "final_jobs": 2, "reason": "test"},
        "started": "s",
        "finished": "f",
        "seconds": 1.0,
        "ccache": (0, 0, 0.0),
        "log": "l.log",
        "report": None,
        "preflight": {"targets": ["c10"]},
    }
    packages = {"sha256": "e" * 64, "file": "installed-cpu-r1.txt", "dpkg": 2, "pip": 1}
    m = mf.for_build(spec, **{**common, "provenance": {**common["provenance"], "packages": packages}})
    path = mf.write(m, tmp_path / "a.manifest.json")
    back = mf.read(path)
    assert back.packages == mf.PackagesRecord(**packages) and back.schema_version == mf.SCHEMA_VERSION
    assert "installed packages" in mf.show(back) and "e" * 64 in mf.show(back)
    old = {k: v for k, v in json.loads(path.read_text()).items() if k != "packages"}
    for version in (0, 4):
        path.write_text(json.dumps({**old, "schema_version": version}))
        assert mf.read(path).packages is None
    # the list's file name carries the run id: not a difference between two builds
    other = mf.for_build(
        spec, **{**common, "provenance": {**common["provenance"], "packages": {**packages, "file": "x"}}}
    )
    assert mf.diff(back, other) == []
