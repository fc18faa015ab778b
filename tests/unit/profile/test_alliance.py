"""The Alliance's paths without a cluster: `invoke wheelhouse --list` as avail_wheels prints it,
the run job's script (`invoke submit --run --dry-run`) and its refusals, and which mpi4py wheel
an install takes from a wheelhouse."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import make_wheel, run_invoke, set_args

from torchbuild.install.step import site_mpi4py_wheel
from torchbuild.install.wheelhouse import ListFilter, listing

NAMES = (
    "torch-2.6.0+computecanada-cp311-cp311-linux_x86_64.whl",
    "torch-2.5.1+computecanada-cp311-cp311-linux_x86_64.whl",
    "torch-2.6.0+computecanada-cp312-cp312-linux_x86_64.whl",
    "numpy-2.1.0-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
    "six-1.17.0-py2.py3-none-any.whl",
    "mpi4py-4.0.3-cp311-cp311-linux_x86_64.whl",
    "mpi4py-4.0.3-cp312-cp312-linux_x86_64.whl",
)


def house(tmp_path: Path, *extra: str) -> Path:
    d = tmp_path / "wh"
    d.mkdir()
    for name in (*NAMES, *extra):
        (d / name).touch()  # a listing reads names only
    return d


def test_list_prints_avail_wheels_columns_newest_per_name_when_piped(tmp_path):
    d = house(tmp_path, "not-a-wheel.whl", "README.txt")
    res = run_invoke("wheelhouse", "--dest", str(d), "--list")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "name    version              python   arch",
        "mpi4py  4.0.3                cp311    x86_64",
        "mpi4py  4.0.3                cp312    x86_64",
        "numpy   2.1.0                cp311    aarch64",
        "six     1.17.0               py2,py3  generic",
        "torch   2.6.0+computecanada  cp311    x86_64",
        "torch   2.6.0+computecanada  cp312    x86_64",
    ]
    assert "not-a-wheel.whl: not a wheel name" in res.stderr and "README" not in res.stderr


def test_list_filters(tmp_path):
    d = house(tmp_path)
    rows = [w.row() for w in listing(d, ListFilter(names=("TORCH",), python="3.11", all_versions=True))]
    assert rows == [
        ("torch", "2.6.0+computecanada", "cp311", "x86_64"),
        ("torch", "2.5.1+computecanada", "cp311", "x86_64"),
    ]
    rows = [w.row() for w in listing(d, ListFilter(names=("torch",), versions=("2.5*",)))]
    assert rows == [("torch", "2.5.1+computecanada", "cp311", "x86_64")]
    assert {w.name for w in listing(d, ListFilter(arch="aarch64"))} == {"numpy", "six"}
    res = run_invoke("wheelhouse", "--dest", str(d), "--list", "--python", "three")
    assert res.returncode != 0 and "--python 'three' is no Python version" in res.stderr
    assert "Traceback" not in res.stderr


def test_filters_without_list_and_a_missing_dest_are_usage_errors(tmp_path):
    res = run_invoke("wheelhouse", "--dest", str(tmp_path), "--name", "torch")
    assert res.returncode != 0 and "add --list" in res.stderr
    res = run_invoke("wheelhouse", "--dest", str(tmp_path / "none"), "--list")
    assert res.returncode != 0 and "is no directory" in res.stderr and "Traceback" not in res.stderr


RUN_SETS = set_args(["gpus=0", "gpu_type="])


def test_run_dry_run_renders_the_seeds_job(tmp_path):
    d = house(tmp_path)
    script = tmp_path / "my test.py"
    script.write_text("print(1)\n")
    res = run_invoke(
        "submit", "--profile", "alliance", "--run", str(script), "--wheelhouse", str(d), "--dry-run",
        "--out", str(tmp_path / "run out"),  # a run job's --out too: where its log goes
        "--arg", "a b", *set_args(["runtime_env={\"X\": \"1 $(y)\"}"]), "--", "--epochs", "3",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    body = res.stdout.split("# dry run:")[0]
    assert f"{tmp_path / 'run out'}/logs/torchbuild-run-alliance-my_test" in body
    for line in (  # pytorch-test.sh's own shape, not the compile job's 12 cores, 48G and a100
        "#SBATCH --cpus-per-task=6",
        "#SBATCH --mem=32000M",
        "#SBATCH --time=0-03:00",
        "#SBATCH --gres=gpu:1",
        "module load StdEnv/2023 gcc/12.3 openmpi/4.1.5 cuda/12.6 cudnn cusparselt python/3.12",
        'torchbuild_tmp=$(mktemp -d "$SLURM_TMPDIR/torchbuild-run.XXXXXX")',
        'python3.12 -m venv -- "$torchbuild_tmp/env"',
        "export X='1 $(y)'",
    ):
        assert line.strip() in [x.strip() for x in body.splitlines()], (line, body)
    assert f"--find-links {d} \\\n" in body and "--no-index" in body and "-- torch" in body and "mpi4py" in body
    assert f"python '{script}' 'a b'" in body and "--epochs 3" in body
    assert subprocess.run(["bash", "-n"], input=body, text=True, check=False).returncode == 0
    assert not list((Path.cwd() / "out" / "logs").glob("torchbuild-run-alliance-my_test*"))  # a dry run writes nothing


def test_run_refusals_name_the_fix(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    script = tmp_path / "s.py"
    script.write_text("")
    base = ("submit", "--profile", "alliance", "--dry-run")
    cases = [
        ((*base, "--run", str(tmp_path / "missing.py"), "--wheelhouse", str(d)), "is no file"),
        ((*base, "--run", str(script)), "--run needs --wheelhouse DIR"),
        ((*base, "--run", str(script), "--wheelhouse", str(d)), "holds no torch wheel"),
        ((*base, "--wheelhouse", str(d)), "add --run SCRIPT"),
        ((*base, "--run", str(script), "--wheelhouse", str(d), "--preflight"), "--preflight choose how a build runs"),
    ]
    for args, said in cases:
        res = run_invoke(*args)
        assert res.returncode != 0 and said in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr
    (d / "torch-2.6.0-cp311-cp311-linux_x86_64.whl").touch()
    res = run_invoke(*base, "--run", str(script), "--wheelhouse", str(d))
    assert res.returncode != 0 and "holds no mpi4py wheel" in res.stderr and "--add-mpi4py" in res.stderr


def test_install_takes_the_site_built_mpi4py_wheel_only(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_wheel(a, "mpi4py", "4.0.3", "cp311-cp311-manylinux_2_17_x86_64")  # from PyPI: not the site's MPI
    assert site_mpi4py_wheel([a], "mpi4py", "cp311") is None
    built = make_wheel(b, "mpi4py", "4.0.3", "cp311-cp311-linux_x86_64")
    newer = make_wheel(b, "mpi4py", "4.1.0", "cp311-cp311-linux_x86_64")
    make_wheel(b, "mpi4py", "4.1.1", "cp312-cp312-linux_x86_64")
    assert site_mpi4py_wheel([a, b, tmp_path / "none"], "mpi4py", "cp311") == newer
    assert site_mpi4py_wheel([a, b], "mpi4py==4.0.3", "cp311") == built
    assert site_mpi4py_wheel([b], "mpi4py", "cp313") is None


def test_run_module_replaces_the_runtime_modules(tmp_path):
    d = house(tmp_path)
    script = tmp_path / "s.py"
    script.write_text("")
    res = run_invoke(
        "submit", "--profile", "alliance", "--run", str(script), "--wheelhouse", str(d), "--dry-run",
        "--module", "StdEnv/2023", "--module", "python/3.12.4",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "\nmodule load StdEnv/2023 python/3.12.4\n" in res.stdout


def test_no_mpi_wrapper_is_needed_where_the_sites_mpi4py_wheel_is_offered(tmp_path, monkeypatch):
    """A login node or job without the MPI module loaded installs the wheel built once; without
    that wheel the missing wrapper is named, as before."""
    import types

    import pytest

    from torchbuild.core.errors import ToolMissing
    from torchbuild.install.step import _Step
    from torchbuild.profile.config import resolve

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no mpicc anywhere
    spec = resolve("alliance")
    house = tmp_path / "wh"
    step = types.SimpleNamespace(spec=spec, req=types.SimpleNamespace(python_version="3.11", find_links=(str(house),)))
    assert not _Step._site_wheel_offered(step)
    with pytest.raises(ToolMissing, match=r"the MPI compiler wrapper 'mpicc' \(mpicc\) is not on PATH"):
        _Step._mpicc(step)
    make_wheel(house, "mpi4py", "4.0.3", "cp311-cp311-linux_x86_64")
    assert _Step._site_wheel_offered(step)
    assert _Step._mpicc(step, required=False) == ""
    step.req.python_version = "3.12"  # the wheel is for another Python: compiled, so the wrapper is needed
    assert not _Step._site_wheel_offered(step)


def test_an_unbalanced_quote_after_the_double_dash_is_a_usage_error(tmp_path):
    """Issue 41 item 10: shlex's ValueError ("No closing quotation") was a traceback."""
    d = house(tmp_path)
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    for words in (["a'b"], ["--lr", '"0.1']):
        res = run_invoke(
            "submit", "--profile", "alliance", "--run", str(script), "--wheelhouse", str(d), "--dry-run", "--", *words
        )
        assert res.returncode == 2, res.stdout + res.stderr
        first = res.stderr.splitlines()[0]
        assert first.startswith("error: UsageError: the words after `--` cannot be split"), res.stderr
        assert "No closing quotation" in first and "Traceback" not in res.stderr
        assert "--arg" in res.stderr.splitlines()[1]


def test_the_run_jobs_options_set_its_own_shape_and_the_build_job_keeps_the_profiles(tmp_path):
    d = house(tmp_path)
    script = tmp_path / "s.py"
    script.write_text("")
    base = ("submit", "--profile", "alliance", "--dry-run")
    res = run_invoke(*base, "--run", str(script), "--wheelhouse", str(d), "--cpus", "8", "--walltime", "90")
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --cpus-per-task=8\n" in res.stdout and "#SBATCH --time=90\n" in res.stdout
    assert "#SBATCH --mem=32000M\n" in res.stdout  # run_job's, the rest kept
    tree = tmp_path / "pytorch"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    res = run_invoke(*base, "--engine", "native", "--source", str(tree), "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    for line in ("--cpus-per-task=12", "--mem=48G", "--time=03:00:00", "--gres=gpu:a100:1"):
        assert f"#SBATCH {line}\n" in res.stdout, line
    res = run_invoke("config", "--profile", "alliance", *set_args(["run_job={cpus: six}"]))
    assert res.returncode != 0 and "run_job.cpus" in res.stderr and "Traceback" not in res.stderr


def test_the_alliance_profile_builds_what_its_image_and_modules_provide():
    """Python from Ubuntu 24.04's apt (python3.12, its python3: 3.11 is not there), the CUDA of
    the base (nvidia/cuda 12.6.3) and of the module loaded natively, NCCL where nothing provides
    a system one, and the seed's cudnn and cusparselt modules for the libraries torch links."""
    from torchbuild.profile.config import resolve
    from torchbuild.runtime.environment import build_env

    spec = resolve("alliance")
    assert spec.base_image.endswith("-ubuntu24.04") and spec.python_version == "3.12"
    assert spec.base_image.startswith(f"nvidia/cuda:{spec.cuda_version}.")
    assert f"cuda/{spec.cuda_version}" in spec.modules and f"python/{spec.python_version}" in spec.modules
    for name in ("cudnn", "cusparselt"):
        assert name in spec.modules and name in spec.runtime_modules
    env = build_env(spec, cache_root="/c", jobs=1)
    assert (env["USE_CUDNN"], env["USE_SYSTEM_NCCL"], env["USE_NCCL"]) == ("1", "0", "1")
