"""The known-bad NCCL / aws-ofi-nccl / libfabric table (comms/table.py) and what refuses it:
`invoke config` and `invoke comms` stop on a combination the table names, with its reason and
its source, before anything is fetched; the plugin's own build floors (libfabric, C++); the
docs' copy of the table; every shipped profile still resolves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from helpers import REPO, invoke_here

from torchbuild.comms import table as comms_table
from torchbuild.comms.step import check_libfabric
from torchbuild.comms.table import KNOWN_BAD, KnownBad, Range, Stack, excludes_ll128, known_bad
from torchbuild.core.errors import ProfileError
from torchbuild.profile.config import resolve

# a CUDA profile building NCCL from source (the cpu profile's base, Ubuntu 24.04: GCC 13)
NCCL = ["cuda_version=12.6", "distributed=[gloo, nccl]", "nccl=source"]
SHIPPED = sorted(p.stem for p in (REPO / "configs" / "profiles").glob("*.yaml"))


def _release(span: Range | None, fallback: str) -> str:
    """A release inside span: its low end, else the fallback."""
    return span.low if span is not None and span.low else fallback


def _hitting(entry: KnownBad) -> list[str]:
    """--set values of a profile that is exactly the entry's combination."""
    sets = [*NCCL, f"nccl_version={_release(entry.nccl, '2.21.5')}-1"]
    if entry.plugin is not None:
        sets.append(f"aws_ofi_nccl_version={_release(entry.plugin, '1.21.1')}")
    sets.append(f"arch={entry.arch or 'x86_64'}")
    gpu = f"{entry.gpus[0]}.0" if entry.gpus else "8.0"
    return [*sets, f'cuda_arch_list=["{gpu}"]']


def _refusal(sets: list[str]) -> ProfileError:
    with pytest.raises(ProfileError) as exc:
        resolve("cpu", sets)
    return exc.value


@pytest.mark.parametrize("entry", KNOWN_BAD, ids=[e.name for e in KNOWN_BAD])
def test_each_known_bad_combination_is_refused_naming_its_reason_source_and_fix(entry):
    error = _refusal(_hitting(entry))
    assert f"key {entry.key!r}" in error.message, error.message
    assert entry.name in error.message and entry.source in error.message and entry.reason in error.message
    assert error.hint == entry.instead


@pytest.mark.parametrize("entry", KNOWN_BAD, ids=[e.name for e in KNOWN_BAD])
def test_each_entry_cites_a_public_issue_and_says_what_to_do_instead(entry):
    assert re.fullmatch(r"https://github\.com/(NVIDIA/nccl|aws/aws-ofi-nccl)/issues/\d+", entry.source)
    assert entry.instead.startswith("set ") and entry.reason and "\n" not in entry.reason
    assert entry.key in ("nccl_version", "aws_ofi_nccl_version", "libfabric_prefix")
    assert [e.name for e in KNOWN_BAD].count(entry.name) == 1


@pytest.mark.parametrize(
    "sets",
    [
        ["nccl_version=2.29.3-1", "arch=aarch64"],  # the fix of the aarch64 hang
        ["nccl_version=2.28.7-1", "arch=aarch64"],  # the release before it
        ["nccl_version=2.29.2-1", "arch=x86_64"],  # the hang is aarch64's
        ["nccl_version=2.28.9-1", "aws_ofi_nccl_version=1.20.0", "arch=x86_64"],  # tested together
        ["nccl_version=2.27.7-1", "aws_ofi_nccl_version=1.17.1", "arch=x86_64"],  # the report's working NCCL
        ["nccl_version=2.28.9-1", "aws_ofi_nccl_version=1.16.3", "arch=x86_64"],  # before the reported plugin
        ["nccl_version=2.26.6-1", "aws_ofi_nccl_version=1.21.1", "arch=aarch64"],  # before LL128 over C2C
        ["nccl_version=2.30.7-1", "aws_ofi_nccl_version=1.21.1", "arch=x86_64"],  # no C2C
        ["nccl_version=2.30.7-1", "arch=aarch64"],  # GH200 without the plugin (no Slingshot)
    ],
)
def test_a_neighbouring_good_combination_resolves(sets):
    spec = resolve("cpu", [*NCCL, 'cuda_arch_list=["9.0"]', *sets])
    assert spec.nccl_version == next(s.split("=")[1] for s in sets if s.startswith("nccl_version="))


def test_nccl_not_built_from_source_is_not_checked_against_the_table():
    # torch's bundled NCCL or the site's: its release is not the profile's nccl_version
    spec = resolve(
        "cpu", [*NCCL[:2], "nccl=bundled", "nccl_version=2.29.2-1", 'cuda_arch_list=["9.0"]'], arch="aarch64"
    )
    assert spec.nccl == "bundled"


GH200_SLINGSHOT = [*NCCL, "nccl_version=2.30.7-1", "aws_ofi_nccl_version=1.21.1", 'cuda_arch_list=["9.0"]']


def test_gh200_with_the_plugin_and_ll128_is_refused_with_the_runtime_fix_in_the_hint():
    error = _refusal([*GH200_SLINGSHOT, "arch=aarch64"])
    assert "nccl-2.27-gh200-ll128" in error.message and "https://github.com/NVIDIA/nccl/issues/2001" in error.message
    assert "runtime_env sets neither NCCL_PROTO without LL128" in error.message
    assert "--set runtime_env.NCCL_PROTO=^LL128" in (error.hint or "") and "NCCL_LL128_C2C" in (error.hint or "")


@pytest.mark.parametrize("setting", ["NCCL_PROTO=^LL128", "NCCL_PROTO=Simple,LL", "NCCL_LL128_C2C=0"])
def test_gh200_with_a_runtime_env_that_leaves_out_ll128_resolves(setting):
    spec = resolve("cpu", [*GH200_SLINGSHOT, "arch=aarch64", f"runtime_env.{setting}"])
    assert excludes_ll128(spec.runtime_env)


@pytest.mark.parametrize(
    ("proto", "excluded"),
    [
        ("^LL128", True),
        ("^ll128", True),  # NCCL compares with strcasecmp
        ("^LL,LL128", True),
        ("LL,Simple", True),
        ("Simple", True),
        ("^LL128;allreduce:^LL,LL128", True),
        ("^LL128;allreduce:Simple", True),
        ("", False),
        ("^LL", False),
        ("LL128", False),
        ("Simple,LL128", False),
        ("allreduce:^LL128", False),  # the other functions keep LL128
        ("^LL128;allreduce:LL128", False),  # allreduce gets it back
        ("^LL128 ", False),  # NCCL does not know "LL128 " and stops
    ],
)
def test_nccl_proto_is_read_as_nccl_parses_it(proto, excluded):
    assert excludes_ll128({"NCCL_PROTO": proto}) is excluded


def test_nccl_ll128_c2c_other_than_0_keeps_ll128():
    assert not excludes_ll128({"NCCL_LL128_C2C": "1"})
    assert excludes_ll128({"NCCL_LL128_C2C": "0"})


def test_a_stack_without_the_part_an_entry_looks_at_does_not_match_it():
    # no NCCL built (nccl: bundled) and no plugin: nothing in the table can be said of it
    assert known_bad(Stack(arch="aarch64", cuda_arch_list=("9.0",))) is None
    assert known_bad(Stack(nccl="2.28.9-1", arch="aarch64")).name == "nccl-2.28.9-aarch64-hang"
    assert known_bad(Stack(nccl="2.28.9-1", plugin="1.19.2", arch="x86_64")).name == "ofi-1.17-nccl-2.28.9-deadlock"


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_still_resolves(name):
    assert resolve(name).profile == name


def test_invoke_comms_refuses_a_known_bad_profile_before_fetching_anything(tmp_path, capsys):
    cache = tmp_path / "cache"
    sets = [*NCCL, 'cuda_arch_list=["9.0"]', "nccl_version=2.29.2-1", "arch=aarch64", f"cache_dir={cache}"]
    # a source that would be downloaded if comms got that far
    sets.append("nccl_source=http://127.0.0.1:9/nccl-2.29.2-1.tar.gz")
    code = invoke_here("comms", "--profile", "cpu", *[a for s in sets for a in ("--set", s)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "nccl-2.28.9-aarch64-hang" in err and "https://github.com/NVIDIA/nccl/issues/2353" in err
    assert "2.29.3-1" in err and "Traceback" not in err
    assert not cache.exists()  # nothing downloaded, unpacked or built


def test_invoke_config_refuses_it_alike(capsys):
    sets = [*NCCL, 'cuda_arch_list=["9.0"]', "nccl_version=2.28.9-1", "aws_ofi_nccl_version=1.17.1"]
    code = invoke_here("config", "--profile", "cpu", "--arch", "x86_64", *[a for s in sets for a in ("--set", s)])
    err = capsys.readouterr().err
    assert code == 2 and "https://github.com/aws/aws-ofi-nccl/issues/1055" in err and "1.20.0" in err


# --------------------------------------------------------------------------- the plugin's build


@pytest.mark.parametrize(
    ("prefix", "release"),
    [
        ("/opt/cray/libfabric/1.15.2.0", "1.15.2.0"),
        ("/opt/cray/libfabric/1.22.0/", "1.22.0"),
        ("/opt/libfabric-2.1.0", "2.1.0"),
        ("/opt/cray/libfabric/2.2.0rc1", ""),  # not only numbers: not read
        ("/usr", ""),
        ("/opt/site/fabric", ""),
        ("/opt/libfabric/current", ""),
        ("", ""),
    ],
)
def test_libfabric_release_is_read_from_a_prefix_that_names_it(prefix, release):
    assert comms_table.libfabric_of_prefix(prefix) == release


def test_a_libfabric_prefix_older_than_the_plugins_configure_accepts_is_refused():
    error = _refusal(
        [*NCCL, 'cuda_arch_list=["8.0"]', "aws_ofi_nccl_version=1.17.1", "libfabric_prefix=/opt/cray/libfabric/1.9.1"]
    )
    assert "key 'libfabric_prefix'" in error.message and "libfabric >= 1.11" in error.message
    assert "check_pkg_libfabric.m4" in error.message


def test_derechos_libfabric_and_plugin_pass_the_floor():
    spec = resolve("derecho")
    assert spec.libfabric_prefix == "/opt/cray/libfabric/1.15.2.0" and spec.aws_ofi_nccl_version == "1.6.0"


def test_the_plugin_from_1_21_needs_gcc_11_for_cxx20():
    # derecho's base is Ubuntu 20.04, GCC 9.4: 1.21's configure stops at AX_CXX_COMPILE_STDCXX([20])
    error = _refusal_of("derecho", ["aws_ofi_nccl_version=1.21.1"])
    assert "key 'base_image'" in error.message and "GCC 9.4" in error.message and "C++20" in error.message
    assert "1.20.0" in (error.hint or "")
    assert resolve("derecho", ["aws_ofi_nccl_version=1.20.0"]).aws_ofi_nccl_version == "1.20.0"  # C++17
    assert resolve("derecho", ["aws_ofi_nccl_version=1.21.1", "compiler_version=11"]).compiler_version == "11"


def _refusal_of(profile: str, sets: list[str]) -> ProfileError:
    with pytest.raises(ProfileError) as exc:
        resolve(profile, sets)
    return exc.value


def _fabric(root: Path, major: int, minor: int) -> Path:
    (root / "include" / "rdma").mkdir(parents=True)
    (root / "include" / "rdma" / "fabric.h").write_text(
        f"#define FI_MAJOR_VERSION {major}\n#define FI_MINOR_VERSION {minor}\n"
    )
    (root / "lib").mkdir()
    (root / "lib" / "libfabric.so").write_text("")
    return root


def test_comms_reads_libfabrics_release_from_fabric_h_and_refuses_one_below_the_floor(tmp_path):
    # a prefix whose path names no release: the header tells (host side, before any download)
    spec = resolve(
        "cpu",
        [
            *NCCL,
            'cuda_arch_list=["8.0"]',
            "aws_ofi_nccl_version=1.19.2",
            f"libfabric_prefix={_fabric(tmp_path / 'lf', 1, 10)}",
        ],
    )
    with pytest.raises(ProfileError) as exc:
        check_libfabric(spec)
    assert "needs libfabric >= 1.11" in exc.value.message and "is 1.10" in exc.value.message
    ok = resolve(
        "cpu",
        [
            *NCCL,
            'cuda_arch_list=["8.0"]',
            "aws_ofi_nccl_version=1.19.2",
            f"libfabric_prefix={_fabric(tmp_path / 'ok', 1, 11)}",
        ],
    )
    assert check_libfabric(ok)[1] == (1, 11)


# --------------------------------------------------------------------------- the docs and the module


def _docs_rows() -> dict[str, str]:
    """The known-bad table of docs/guide/nccl.md: entry name -> its row."""
    text = (REPO / "docs" / "guide" / "nccl.md").read_text()
    section = text.split("## Known-bad combinations", 1)[1].split("\n## ", 1)[0]
    return {m[1]: line for line in section.splitlines() if (m := re.match(r"\| `([a-z0-9.-]+)` \|", line))}


def test_the_docs_table_lists_every_entry_with_its_source_and_nothing_else():
    rows = _docs_rows()
    assert sorted(rows) == sorted(e.name for e in KNOWN_BAD)
    for entry in KNOWN_BAD:
        assert entry.source in rows[entry.name], entry.name


def test_comms_table_imports_nothing_of_torchbuild_but_core():
    tree = ast.parse((REPO / "src" / "torchbuild" / "comms" / "table.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert [m for m in imported if m.startswith("torchbuild") and not m.startswith("torchbuild.core")] == []
