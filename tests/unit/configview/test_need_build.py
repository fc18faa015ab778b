"""When not to build (issue 45 item 5): which of a profile's choices need a source build, the
official-wheel route where none does, and `invoke doctor --profile P` / `invoke config` saying so."""

from __future__ import annotations

import dataclasses
import importlib
import json

import pytest
from helpers import TEST_TORCH, invoke_here

from torchbuild.configview.need_build import Reason, arch_runs, assess, choose_wheel, reasons
from torchbuild.profile import official_wheels as ow
from torchbuild.profile.config import resolve
from torchbuild.source.patches import load_series


def keys(spec) -> dict[str, str]:
    return {r.key: r.value for r in reasons(spec)}


# --------------------------------------------------------------------------- the shipped profiles


@pytest.mark.parametrize(
    ("profile", "wanted"),
    [
        ("derecho", {"distributed": "includes mpi", "nccl": "source", "patches": "auto"}),
        # 2.9.1, EPCC's: the shipped MPI series stops at 2.6
        ("archer2", {"distributed": "includes mpi"}),
        # the current release: its official wheels are CUDA 13 builds, the profiles' CUDA is 12.6
        ("alliance", {"cuda_version": "12.6", "distributed": "includes mpi"}),
        ("bede", {"cuda_version": "12.6", "distributed": "includes mpi"}),
        ("gh200", {"cuda_version": "12.6", "nccl": "system"}),
        ("cuda", {"cuda_version": "12.6", "nccl": "system"}),
        ("cuda13", {"nccl": "system"}),
    ],
)
def test_a_shipped_profile_that_needs_a_build_says_which_choices_do(profile, wanted):
    verdict = assess(resolve(profile))
    assert {r.key: r.value for r in verdict.reasons} == wanted
    assert verdict.route == () and verdict.summary.startswith("yes: ")


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_default_cpu_profile_needs_no_build_and_gets_the_official_route(arch):
    spec = resolve("cpu", arch=arch)
    version = spec.torch_version  # the current release
    verdict = assess(spec)
    assert verdict.reasons == ()
    assert verdict.summary == "no: the official wheel would do (https://download.pytorch.org/whl/cpu)"
    assert verdict.route[0].startswith(
        f"pip download torch=={version} --no-deps --index-url https://download.pytorch.org/whl/cpu"
    )
    assert verdict.route[1].startswith(
        f"invoke install --profile cpu --prefix PREFIX --wheel WHEELS/torch-{version}+cpu-"
    )
    assert not any("invoke comms" in step for step in verdict.route)  # no plugin in the profile


def test_gh200_with_torchs_own_nccl_is_the_official_aarch64_cuda_wheel():
    verdict = assess(resolve("gh200", [TEST_TORCH, "nccl=bundled"]))
    assert verdict.reasons == () and verdict.index == "https://download.pytorch.org/whl/cu126"
    assert "(run with Python 3.12 on aarch64)" in verdict.route[0]


# --------------------------------------------------------------------------- each reason and its neighbour


def test_mpi_in_distributed_needs_a_build_and_mpi_for_mpi4py_alone_does_not():
    spec = resolve("cpu", [TEST_TORCH, "distributed=[gloo,mpi]", "mpi=openmpi"], arch="x86_64")
    assert keys(spec) == {"distributed": "includes mpi", "patches": "auto"}  # the MPI patch counts with MPI
    alone = assess(resolve("cpu", ["mpi=openmpi"], arch="x86_64"))
    assert alone.reasons == ()
    assert any("serves mpi4py only" in n for n in alone.notes)
    assert keys(resolve("cpu", ["switches.USE_MPI=1"], arch="x86_64"))["distributed"] == "includes mpi"


def test_ucc_needs_a_build_and_gloo_does_not():
    assert keys(resolve("cpu", ["distributed=[gloo,ucc]"], arch="x86_64")) == {"distributed": "includes ucc"}
    assert keys(resolve("cpu", ["distributed=[gloo]"], arch="x86_64")) == {}


@pytest.mark.parametrize(("nccl", "needs"), [("source", True), ("system", True), ("bundled", False)])
def test_an_nccl_linked_at_build_time_needs_a_build_and_torchs_own_does_not(nccl, needs):
    found = [r for r in reasons(resolve("cuda", [f"nccl={nccl}"])) if r.key == "nccl"]
    assert bool(found) is needs
    if needs:
        assert "linked at build time" in found[0].why and "LD_PRELOAD" in found[0].why
    # without nccl among the backends (config refuses the pair; the function holds alone), nothing links NCCL
    spec = dataclasses.replace(resolve("cuda", [f"nccl={nccl}"]), distributed=("gloo",))
    assert not [r for r in reasons(spec) if r.key == "nccl"]


def _patch(directory, name: str, path: str):
    directory.mkdir(exist_ok=True)
    text = f"what it does\n\ndiff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n"
    (directory / name).write_text(text)


def test_a_patch_needs_a_build_and_an_mpi_only_patch_without_mpi_does_not(tmp_path):
    series = tmp_path / "series"
    _patch(series, "01-mpi.patch", "torch/csrc/distributed/c10d/ProcessGroupMPI.cpp")
    spec = resolve("cpu", [f"patches={series}"], arch="x86_64")
    assert keys(spec) == {}
    with_mpi = resolve("cpu", [f"patches={series}", "distributed=[gloo,mpi]", "mpi=mpich"], arch="x86_64")
    assert "patches" in keys(with_mpi)
    _patch(series, "02-aten.patch", "aten/src/ATen/native/Linear.cpp")
    found = [r for r in reasons(spec) if r.key == "patches"]
    assert found and found[0].why == f"a series of 1 patch ({series}: 02-aten.patch)"
    assert keys(resolve("cpu", ["patches=none"], arch="x86_64")) == {}


def test_the_shipped_series_is_named_by_its_directory_and_counts_only_with_mpi():
    spec = resolve("archer2")
    (found,) = [r for r in reasons(spec, load_series("auto", "2.6.0")) if r.key == "patches"]
    assert found.why == "a series of 1 patch (patches/pytorch/2.4: 01-cuda-aware-mpi-fallback.patch)"


def test_an_arch_no_official_code_runs_on_needs_a_build_and_a_newer_minor_of_a_listed_major_does_not():
    # Blackwell (10.0) with CUDA 12.8 on torch 2.6, whose official wheels end at CUDA 12.6 and sm_90
    # (3.5 was the example until config refused it with CUDA 12.6, which cannot compile sm_35)
    spec = resolve("cuda128", ["torch_version=2.6.0", "nccl=bundled", "cuda_arch_list=[10.0,8.9,9.0a,9.0+PTX]"])
    verdict = assess(spec)
    assert [(r.key, r.value) for r in verdict.reasons] == [("cuda_arch_list", "10.0")]
    assert "its list: 5.0;6.0;7.0;7.5;8.0;8.6;9.0" in verdict.reasons[0].why
    assert "cuda_arch_list 8.9 runs the official wheel's 8.6 code (binary compatible within a major)" in verdict.notes
    assert any(n.startswith("cuda_arch_list 9.0a: the official wheel's 9.0 code runs there") for n in verdict.notes)


def test_arch_runs_follows_binary_compatibility_within_a_major():
    assert arch_runs("8.9", ow.CU126) == "8.6"
    assert arch_runs("12.1", ow.CU130) == "12.0"  # 12.0+PTX listed
    assert arch_runs("7.0", ow.CU130) is None  # CUDA 13 wheels start at 7.5
    assert arch_runs("8.6", ow.ARM_CU126) == "8.0"
    assert arch_runs("10.0", ow.ARM_CU126) is None


def test_a_cuda_major_the_line_has_no_wheel_of_needs_a_build_and_another_minor_does_not():
    spec = resolve("cuda", ["torch_version=2.15.0", "nccl=bundled"])  # CUDA 12.6: 2.15 ships 13.0 and 13.2
    (found,) = reasons(spec)
    assert (found.key, found.value) == ("cuda_version", "12.6")
    assert "no CUDA 12 build (CUDA: 13.0, 13.2)" in found.why and "r580" in found.why
    older = dataclasses.replace(resolve("cuda", [TEST_TORCH, "nccl=bundled"]), cuda_version="12.2")
    assert reasons(older) == []  # the 12.4 or 12.6 wheel brings its own runtime
    wheel = choose_wheel(older, ow.line_of("2.6.0"))
    assert wheel == ow.CU124 and "a driver for CUDA 12 runs it" in " ".join(assess(older).notes)


def test_no_aarch64_cuda_wheel_before_2_6():
    spec = dataclasses.replace(resolve("gh200", ["nccl=bundled"]), torch_version="2.5.1", python_version="3.12")
    (found,) = reasons(spec, load_series("none", "2.5.1"))
    assert (
        found.key == "cuda_version" and "2.5's official aarch64 wheels have no CUDA 12 build (CUDA: none)" in found.why
    )


def test_a_python_without_an_official_wheel_needs_a_build_and_one_in_range_does_not():
    spec = resolve("cpu", ["torch_version=2.5.1", "python_version=3.8"], arch="x86_64")
    assert keys(spec) == {"python_version": "3.8"}  # a source build of 2.5 takes 3.8; its wheels start at 3.9
    assert keys(resolve("cpu", ["torch_version=2.5.1", "python_version=3.9"], arch="x86_64")) == {}
    spec = resolve("cpu", ["torch_version=2.13.0", "python_version=3.14", "python_versions=['3.15']"], arch="x86_64")
    assert keys(spec) == {"python_versions": "3.15"}


def test_a_glibc_floor_below_the_official_wheels_needs_a_build_and_one_at_it_does_not():
    spec = resolve("cpu", [TEST_TORCH, "glibc_floor=2.17", "base_image=site/base:1"], arch="x86_64")
    (found,) = reasons(spec)
    assert (
        found.key == "glibc_floor" and "below the official torch 2.6 wheels' glibc 2.28 (manylinux_2_28)" in found.why
    )
    assert reasons(resolve("cpu", [TEST_TORCH, "glibc_floor=2.28", "base_image=site/base:1"], arch="x86_64")) == []
    assert (
        reasons(resolve("cpu", ["glibc_floor=2.17", "base_image=site/base:1", "torch_version=2.5.1"], arch="x86_64"))
        == []
    )


def test_a_switch_the_official_wheel_lacks_needs_a_build_and_one_it_has_or_turns_off_does_not():
    assert keys(resolve("cpu", ["switches.USE_NNPACK=1"], arch="x86_64")) == {"switches.USE_NNPACK": "1"}
    assert keys(resolve("cpu", ["switches.USE_MKL=1", "switches.USE_CUDNN=0"], arch="x86_64")) == {}
    assert keys(resolve("cpu", ["switches.USE_MKL=1"], arch="aarch64")) == {"switches.USE_MKL": "1"}
    assert (
        keys(resolve("gh200", [TEST_TORCH, "nccl=bundled"])) == {}
    )  # USE_PRIORITIZED_TEXT_FOR_LD: the aarch64 wheels' too


def test_a_ref_or_version_other_than_a_release_needs_a_build():
    assert keys(resolve("cpu", ["torch_ref=main"], arch="x86_64")) == {"torch_ref": "main"}
    assert keys(resolve("cpu", [TEST_TORCH, "torch_ref=v2.6.0"], arch="x86_64")) == {}
    assert keys(resolve("cpu", ["torch_version=2.6.0rc1"], arch="x86_64")) == {"torch_version": "2.6.0rc1"}


def test_a_torch_line_the_table_does_not_know_is_cannot_tell_not_no():
    verdict = assess(resolve("cpu", ["torch_version=2.16.0"], arch="x86_64"))
    (found,) = verdict.reasons
    assert isinstance(found, Reason) and not found.known
    assert verdict.summary == "cannot tell: torchbuild's table of official wheels knows 2.3 to 2.15 only"


def test_the_plugin_joins_the_route_as_invoke_comms():
    spec = resolve("gh200", [TEST_TORCH, "nccl=bundled", "aws_ofi_nccl_version=1.17.1"])
    verdict = assess(spec, profile="/site/my gh200.yaml")
    comms = [s for s in verdict.route if s.startswith("invoke comms")]
    assert comms and comms[0].startswith(
        "invoke comms --profile '/site/my gh200.yaml': the aws-ofi-nccl 1.17.1 plugin alone"
    )
    assert "NCCL_NET_PLUGIN" in comms[0]


def test_the_table_is_ordered_and_every_cuda_wheel_has_an_arch_list():
    assert [ow.line_of(line.torch) for line in ow.LINES] == list(ow.LINES)
    for line in ow.LINES:
        for wheel in (*line.x86_64, *line.aarch64):
            assert bool(wheel.cuda) == bool(wheel.archs), (line.torch, wheel)
        assert ow.CPU in line.x86_64 and ow.CPU in line.aarch64
    assert ow.CU132.index == "https://download.pytorch.org/whl/cu132"


# --------------------------------------------------------------------------- the tasks


@pytest.fixture
def no_host_checks(monkeypatch):
    """The doctor's host checks (engine, tools) left out: the section under test reads the profile only."""
    task = importlib.import_module("torchbuild.doctor.task")  # the module: the package names the task so

    monkeypatch.setattr(task, "run_checks", lambda *a, **k: ([], []))


def test_doctor_with_a_profile_says_which_choices_need_a_build(no_host_checks, capsys):
    assert invoke_here("doctor", "--profile", "derecho") == 0
    out = capsys.readouterr().out
    section = out[out.index("source build needed? (profile derecho)") :].splitlines()
    assert section[1] == "  yes: official wheels lack what the profile asks:"
    assert "  - distributed: includes mpi: official wheels have no MPI backend (built without USE_MPI)" in section
    assert any(ln.startswith("  - nccl: source: NCCL 2.21.5-1 built for cuda_arch_list") for ln in section)


def test_doctor_with_the_cpu_profile_gives_the_official_route(no_host_checks, capsys):
    assert invoke_here("doctor", "--profile", "cpu") == 0
    out = capsys.readouterr().out
    assert "  no: the official wheel, `invoke comms`' plugin and `invoke install`'s runtime env would do:" in out
    assert (
        f"  1. pip download torch=={resolve('cpu').torch_version} --no-deps --index-url https://download.pytorch.org/whl/cpu"
        in out
    )


def test_doctor_without_a_profile_has_no_section_and_a_bad_profile_is_named(no_host_checks, capsys, tmp_path):
    assert invoke_here("doctor") == 0
    assert "source build needed?" not in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: cpu\nnot_a_key: 1\n")
    assert invoke_here("doctor", "--profile", str(bad)) == 0
    out = capsys.readouterr().out
    assert f"source build needed? (profile {bad})\n  cannot tell: {bad}" in out and "not_a_key" in out


def test_doctor_help_acts_on_nothing(monkeypatch, capsys):
    task = importlib.import_module("torchbuild.doctor.task")  # the module: the package names the task so

    def boom(*a, **k):
        raise AssertionError("--help ran the checks")

    monkeypatch.setattr(task, "run_checks", boom)
    monkeypatch.setattr(task, "need_build_section", boom)
    assert invoke_here("doctor", "--help") == 0
    assert "official wheel would do" in " ".join(capsys.readouterr().out.split())


def test_config_says_in_its_header_whether_a_build_is_needed_and_json_stays_json(capsys):
    assert invoke_here("config", "--profile", "archer2") == 0
    lines = capsys.readouterr().out.splitlines()
    said = [ln for ln in lines if ln.startswith("# source build needed?")]
    assert said == ["# source build needed? yes: distributed includes mpi (`invoke doctor --profile archer2` says why)"]
    assert lines.index(said[0]) < 6  # among the header lines, before the tables
    assert invoke_here("config", "--profile", "cpu", "--arch", "x86_64") == 0
    assert (
        "# source build needed? no: the official wheel would do (https://download.pytorch.org/whl/cpu)"
        in capsys.readouterr().out
    )
    assert invoke_here("config", "--profile", "cpu", "--format", "json") == 0
    assert "source build needed" not in json.dumps(json.loads(capsys.readouterr().out))
