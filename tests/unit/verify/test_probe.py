"""probe.py, the program verify runs in the interpreter under test: by file path, with only the
standard library (torch is not installed here: its checks run against a stand-in object)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from torchbuild.verify import probe

PROBE = Path(probe.__file__)
EXPECT = {
    "version": "2.6.0+tb",
    "distributed": True,
    "gloo": True,
    "mpi": False,
    "nccl": False,
    "cuda_version": "12.4",
    "cuda_arch_list": ["9.0"],
    "blas": "OpenBLAS",
}


def run_probe(*args: str) -> subprocess.CompletedProcess[str]:
    """probe.py by path with no site-packages (-S): only the standard library is importable."""
    return subprocess.run(
        [sys.executable, "-S", str(PROBE), *args], capture_output=True, text=True, check=False, cwd=PROBE.parent
    )


def last_json(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in json.loads(proc.stdout.strip().splitlines()[-1])}


def fake_torch(
    version: str = "2.6.0+tb",
    dist: bool = True,
    gloo: bool = True,
    mpi: bool = False,
    cuda: str | None = "12.4",
    arch_flags: str = "sm_80 sm_90",
    config: str = "BLAS_INFO=open, USE_OPENMP=ON, OpenBLAS",
    gpus: int = 0,
) -> Any:
    """What build_config and the other checks read from torch, nothing more."""
    return SimpleNamespace(
        __version__=version,
        distributed=SimpleNamespace(
            is_available=lambda: dist, is_gloo_available=lambda: gloo, is_mpi_available=lambda: mpi
        ),
        version=SimpleNamespace(cuda=cuda),
        _C=SimpleNamespace(_cuda_getArchFlags=lambda: arch_flags),
        __config__=SimpleNamespace(show=lambda: config),
        backends=SimpleNamespace(openmp=SimpleNamespace(is_available=lambda: True)),
        cuda=SimpleNamespace(is_available=lambda: gpus > 0),
        utils=SimpleNamespace(cmake_prefix_path="/nonexistent/torch/share/cmake"),
    )


def statuses(checks: list[dict[str, str]]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in checks}


# --- records --------------------------------------------------------------------------------


def test_records_are_what_verify_reads_back():
    from torchbuild.verify.step import Check

    assert probe.record("a", True, 3) == {"name": "a", "status": "pass", "detail": "3"}
    assert probe.record("a", False)["status"] == "fail"
    assert probe.skipped("a", "no GPU") == {"name": "a", "status": "skip", "detail": "no GPU"}
    assert probe.expected("v", "1.0", "1.1") == {"name": "v", "status": "fail", "detail": "1.0 (expected 1.1)"}
    assert Check(**probe.record("a", True, "x")).status == "pass"


# --- the build configuration ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "arch_list", "ok"),
    [
        pytest.param("sm_80 sm_90", ["9.0"], True, id="9.0-built"),
        pytest.param("sm_80 sm_90", ["8.0", "9.0"], True, id="two-built"),
        pytest.param("sm_90 compute_90", ["9.0+PTX"], True, id="9.0+PTX-built"),
        pytest.param("sm_90a", ["9.0a"], True, id="9.0a-built"),
        pytest.param("sm_80", ["9.0"], False, id="9.0-missing"),
        pytest.param("sm_80 compute_90", ["9.0"], False, id="only-ptx-for-9.0"),
        pytest.param("sm_90a", ["9.0"], False, id="9.0a-is-not-9.0"),
        pytest.param("sm_90", ["9.0a"], False, id="9.0-is-not-9.0a"),
        pytest.param("sm_100", ["10.0", "9.0"], False, id="one-of-two-missing"),
        pytest.param("", ["9.0"], False, id="no-flags"),
    ],
)
def test_arch_flags_cover_the_profiles_arch_list(flags, arch_list, ok):
    assert probe.arch_flags_cover(flags, arch_list)[0] is ok


def test_arch_flags_name_what_was_wanted():
    assert probe.arch_flags_cover("sm_90", ["8.0", "9.0a", "9.0+PTX"]) == (False, ["80", "90a", "90"])


def test_a_torch_built_as_the_profile_asks_passes_every_config_row():
    got = statuses(probe.build_config(fake_torch(), EXPECT))
    assert got == dict.fromkeys(
        [
            "torch.__version__",
            "distributed",
            "gloo backend",
            "mpi backend",
            "CUDA built",
            "CUDA arch list",
            "BLAS",
            "OpenMP",
        ],
        "pass",
    )


@pytest.mark.parametrize(
    ("torch", "expect", "failed"),
    [
        pytest.param(fake_torch(version="2.6.0"), {}, "torch.__version__", id="version"),
        pytest.param(fake_torch(dist=False), {}, "distributed", id="no-distributed"),
        pytest.param(fake_torch(gloo=False), {}, "gloo backend", id="no-gloo"),
        pytest.param(fake_torch(mpi=True), {}, "mpi backend", id="unexpected-mpi"),
        pytest.param(fake_torch(mpi=False), {"mpi": True}, "mpi backend", id="missing-mpi"),
        pytest.param(fake_torch(cuda=None), {}, "CUDA built", id="cpu-only-but-cuda-asked"),
        pytest.param(fake_torch(), {"cuda_version": "", "cuda_arch_list": []}, "CUDA built", id="cuda-not-asked"),
        pytest.param(fake_torch(arch_flags="sm_80"), {}, "CUDA arch list", id="arch-missing"),
        pytest.param(fake_torch(config="MKL"), {}, "BLAS", id="other-blas"),
    ],
)
def test_a_build_config_unlike_the_profile_fails_its_row(torch, expect, failed):
    got = statuses(probe.build_config(torch, {**EXPECT, **expect}))
    assert [n for n, s in got.items() if s == "fail"] == [failed], got


def test_rows_the_profile_does_not_ask_for_are_left_out():
    got = statuses(probe.build_config(fake_torch(dist=False, cuda=None), {**EXPECT, "version": "", "blas": ""}))
    assert set(got) == {"distributed", "CUDA built", "OpenMP"}


# --- collectives --------------------------------------------------------------------------


def test_results_are_collected_in_rank_order(tmp_path):
    for rank in (10, 2, 0):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps([float(rank), 42.0]))
    (tmp_path / "store").write_text("")
    assert probe.collect_results(str(tmp_path)) == [[0.0, 42.0], [2.0, 42.0], [10.0, 42.0]]


def test_a_half_written_result_is_kept_as_text_and_fails_the_check(tmp_path):
    (tmp_path / "rank0.json").write_text("[3.0, 42.0]")
    (tmp_path / "rank1.json").write_text("[3.0, 4")
    assert probe.collect_results(str(tmp_path)) == [[3.0, 42.0], "[3.0, 4"]
    check = probe.collective_check("c", True, str(tmp_path), probe.expected_results(2), "worker 1 died")
    assert check == {"name": "c", "status": "fail", "detail": "worker 1 died"}


@pytest.mark.parametrize(("size", "want"), [(1, [[1.0, 42.0]]), (2, [[3.0, 42.0]] * 2)])
def test_each_rank_sees_the_sum_and_rank_zeros_broadcast(size, want):
    assert probe.expected_results(size) == want


def test_a_collective_passes_when_every_rank_reported_and_every_process_exited_0(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json").write_text("[3.0, 42.0]")
    ok = probe.collective_check("c", True, str(tmp_path), [[3.0, 42.0]] * 2, "")
    assert ok == {"name": "c", "status": "pass", "detail": "[[3.0, 42.0], [3.0, 42.0]]"}
    assert probe.collective_check("c", False, str(tmp_path), [[3.0, 42.0]] * 2, "x" * 1000)["detail"] == "x" * 400


def test_workers_are_this_file_run_by_path_and_their_failure_is_reported():
    """Without torch here, both gloo workers fail: the check says why, from their output."""
    check = probe.spawned_collective("gloo all_reduce + broadcast (2 processes)", "gloo", 2)
    assert check["status"] == "fail" and "No module named 'torch'" in check["detail"]
    assert probe.worker_command("gloo", 1, 2, "file:///s", "/d")[1:] == [
        str(PROBE),
        "worker",
        "gloo",
        "1",
        "2",
        "file:///s",
        "/d",
    ]


def test_mpi_without_mpirun_fails_and_without_mpi_is_left_out(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert probe.mpi(fake_torch(mpi=True), {**EXPECT, "mpi": True}) == [
        probe.record("mpi all_reduce (mpirun -n 2)", False, "mpirun not found")
    ]
    assert probe.mpi(fake_torch(mpi=False), {**EXPECT, "mpi": True}) == []
    assert probe.gloo(fake_torch(dist=False), EXPECT) == []


# --- LibTorch and CUDA ----------------------------------------------------------------------


def test_libtorch_without_torchconfig_fails_naming_where_it_looked():
    (check,) = probe.libtorch_cpp(fake_torch())
    assert check["status"] == "fail" and "/nonexistent/torch/share/cmake" in check["detail"]


def test_libtorch_without_cmake_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "Torch").mkdir()
    (tmp_path / "Torch" / "TorchConfig.cmake").write_text("")
    torch = fake_torch()
    torch.utils.cmake_prefix_path = str(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert probe.libtorch_cpp(torch) == [
        probe.skipped("LibTorch C++ (find_package(Torch))", "cmake not installed here")
    ]


def test_no_gpu_is_one_skipped_row():
    assert probe.cuda_nccl(fake_torch(gpus=0), {**EXPECT, "nccl": True}) == [
        probe.skipped("CUDA devices", "no GPU visible")
    ]


# --- as a script, by path, with only the standard library -----------------------------------


def test_the_package_probe_runs_by_path_with_the_standard_library_only():
    proc = run_probe("package", "json", "2.0.9")
    assert proc.returncode == 0, proc.stderr
    got = last_json(proc)
    assert got["import json"]["status"] == "pass"
    assert got["json.__version__"] == {"name": "json.__version__", "status": "pass", "detail": "2.0.9 (expected 2.0.9)"}


@pytest.mark.parametrize(
    ("name", "version", "failed"),
    [
        pytest.param("json", "9.9", "json.__version__", id="other-version"),
        pytest.param("no_such_module_tb", "", "import no_such_module_tb", id="not-installed"),
        pytest.param("errors", "", "import errors", id="torchbuild-module-not-visible"),
        pytest.param("torchbuild", "", "import torchbuild", id="torchbuild-not-visible"),
    ],
)
def test_the_package_probe_fails_what_is_missing_or_wrong(name, version, failed):
    """torchbuild's own folder, where probe.py lies, must not shadow the packages under test."""
    got = last_json(run_probe("package", name, version))
    assert got[failed]["status"] == "fail", got


def test_the_torch_probe_without_torch_fails_its_import_and_exits_0():
    proc = run_probe("torch", json.dumps(EXPECT))
    assert proc.returncode == 0, proc.stderr
    assert list(last_json(proc)) == ["import torch"]
    assert last_json(proc)["import torch"]["status"] == "fail"


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="no-mode"),
        pytest.param(["torch"], id="torch-without-expectations"),
        pytest.param(["package", "json"], id="package-without-version"),
        pytest.param(["worker", "gloo", "0"], id="worker-short"),
        pytest.param(["other", "x", "y"], id="unknown-mode"),
    ],
)
def test_a_wrong_command_line_is_a_usage_message(args):
    proc = run_probe(*args)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.startswith("usage: probe.py")
