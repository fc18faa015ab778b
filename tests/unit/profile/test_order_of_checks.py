"""Everything local and cheap is checked before anything slow (a clone, a download, a compile),
and every problem found is named at once: `bench`, `companions`, `comms` and `develop`."""

from __future__ import annotations

import importlib
import io

import pytest
from helpers import TEST_TORCH, invoke_here, make_wheel

from torchbuild.builder import companions
from torchbuild.comms.host import comms as launch_comms
from torchbuild.comms.step import Part, _Step
from torchbuild.comms.step import Request as CommsRequest
from torchbuild.core.errors import PathError, ProfileError
from torchbuild.core.problems import Problems
from torchbuild.profile.config import resolve
from torchbuild.runtime.backends import Options, choose
from torchbuild.source import fetch as sourcemod

bench_task = importlib.import_module("torchbuild.bench.task")  # the module, not the task it exports
CUDA = [TEST_TORCH, "cuda_version=12.4", 'cuda_arch_list=["9.0"]', "distributed=[gloo, nccl]"]


@pytest.fixture
def no_network(monkeypatch):
    """Every way these tasks reach the network, recorded instead of taken."""
    calls: list[str] = []

    def record(name):
        def fake(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} was called before the local checks failed")

        return fake

    monkeypatch.setattr(bench_task, "fetch_git", record("clone"))
    monkeypatch.setattr(sourcemod, "download", record("download"))  # comms' sources: source/fetch.py's fetch
    monkeypatch.setattr(sourcemod, "fetch_git", record("clone"))
    monkeypatch.setattr(companions, "fetch", record("companions fetch"))
    return calls


def _error(capsys) -> str:
    return capsys.readouterr().err


def test_one_problem_is_raised_as_it_is_and_several_as_one_error_of_the_first_kind():
    problems = Problems()
    assert problems.check(lambda: 3) == 3
    problems.raise_any()  # nothing found: nothing raised
    first = PathError("--venv /x does not exist", hint="give a venv")
    problems.add(first)
    with pytest.raises(PathError) as one:
        problems.raise_any()
    assert one.value is first
    problems.check(lambda: resolve("no-such-profile"))
    with pytest.raises(PathError) as both:
        problems.raise_any()
    assert both.value.message.startswith("2 problems") and both.value.status == 15
    assert "--venv /x does not exist (hint: give a venv)" in both.value.message
    assert "ProfileError" in both.value.message


# --------------------------------------------------------------------------- bench


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_text("x"), "is a file, not a venv directory"),
        (lambda p: p.mkdir(), "is not a venv (no pyvenv.cfg, no bin/python)"),
    ],
    ids=["missing", "a file", "a directory"],
)
def test_bench_names_a_bad_venv_and_bad_args_before_cloning_torchbench(tmp_path, capsys, no_network, make, says):
    venv = tmp_path / "venv"
    make(venv)
    code = invoke_here("bench", "--venv", str(venv), "--args", "'unclosed", "--set", f"cache_dir={tmp_path / 'c'}")
    err = _error(capsys)
    assert code == 15, err
    assert "error: PathError: 2 problems" in err and says in err and "--args" in err
    assert no_network == [] and not (tmp_path / "c" / "src").exists()


def test_bench_names_a_local_tree_without_the_script(tmp_path, capsys, no_network):
    tree = tmp_path / "bench"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    code = invoke_here("bench", "--venv", str(tmp_path / "nope"), "--benchmark", str(tree), "--args", "resnet50")
    err = _error(capsys)
    assert code == 15 and "does not exist" in err and "has no run.py" in err, err


# --------------------------------------------------------------------------- companions


def test_companions_refuses_a_torchvision_wheel_and_bad_jobs_before_fetching(tmp_path, capsys, no_network):
    wheel = make_wheel(tmp_path / "out", "torchvision", "0.21.0", "cp311-cp311-linux_x86_64")
    sets = ["--set", "companions=[torchvision]", "--set", f"cache_dir={tmp_path / 'c'}"]
    code = invoke_here("companions", "--wheel", str(wheel), "--jobs", "0", *sets)
    err = _error(capsys)
    assert code == 18, err
    assert "is a torchvision wheel, not a torch wheel" in err and "--jobs '0'" in err
    assert no_network == []


def test_companions_names_a_profile_without_companions_with_the_wheel(tmp_path, capsys, no_network):
    code = invoke_here("companions", "--wheel", str(tmp_path / "torch-2.6.0-cp311-cp311-linux_x86_64.whl"))
    err = _error(capsys)
    assert code == 15 and "2 problems" in err and "lists no companions" in err, err
    assert no_network == []


# --------------------------------------------------------------------------- comms


def test_comms_names_libfabric_nvcc_and_autotools_at_once_before_downloading(tmp_path, monkeypatch, no_network):
    """The issue's case: natively, libfabric_prefix=/nope, no nvcc and no autotools here."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "make").symlink_to("/bin/true")
    monkeypatch.setenv("PATH", str(tools))
    spec = resolve(
        "cpu",
        [
            *CUDA,
            "nccl=source",
            "aws_ofi_nccl_version=1.17.1",
            f"libfabric_prefix={tmp_path / 'nope'}",
            f"cuda_home={tmp_path / 'no-cuda'}",
            f"cache_dir={tmp_path / 'cache'}",
        ],
    )
    with pytest.raises(ProfileError) as exc:
        launch_comms(spec, choose(spec, "native", Options()), out_dir=tmp_path / "out", out=io.StringIO())
    message = exc.value.message
    assert message.startswith("3 problems") and str(tmp_path / "nope") in message
    assert "nvcc" in message and "autoreconf, libtoolize not found" in message
    assert no_network == [] and not (tmp_path / "cache" / "downloads").exists()


def test_the_comms_step_names_every_missing_piece_at_once(tmp_path):
    spec = resolve(
        "cpu",
        [*CUDA, "nccl=source", "aws_ofi_nccl_version=1.17.1", f"libfabric_prefix={tmp_path / 'nope'}",
         f"cuda_home={tmp_path / 'no-cuda'}"],
    )  # fmt: skip
    tree = tmp_path / "plugin-tree"  # a release archive: no configure
    tree.mkdir()
    prefix = tmp_path / "cache" / "comms" / "x"
    req = CommsRequest(
        spec=spec, key="k" * 64, prefix=str(prefix), run_id="r1",
        nccl=Part(tree=str(tmp_path / "nccl-tree"), origin="o", sha256="s"),
        plugin=Part(tree=str(tree), origin="o", sha256="s"),
    )  # fmt: skip
    step = _Step(req)
    step.env["PATH"] = str(tmp_path / "empty-bin")
    with pytest.raises(Exception) as exc:
        step._check_before_compiling()
    message = exc.value.message
    assert type(exc.value).__name__ == "ToolMissing" and message.startswith("3 problems")
    assert "nvcc" in message and "make, autoreconf, libtoolize" in message and "libfabric_prefix" in message


# --------------------------------------------------------------------------- develop


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_text("x"), "is a file, not a venv directory"),
        (lambda p: (p.mkdir(), (p / "notes.txt").write_text("mine")), "is a directory but not a venv"),
    ],
    ids=["a file", "a directory of other files"],
)
def test_develop_names_a_venv_that_is_no_venv_with_the_other_problems(tmp_path, capsys, make, says):
    venv = tmp_path / "venv"
    make(venv)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    argv = ["develop", "--source", str(tmp_path / "no-tree"), "--venv", str(venv), "--jobs", "x"]
    code = invoke_here(*argv, "--set", f"cache_dir={tmp_path / 'c'}")
    err = _error(capsys)
    assert code == 2, err  # --jobs's UsageError comes first
    assert "3 problems" in err and says in err and "no-tree" in err and "--jobs 'x'" in err
    assert "BuildFailed" not in err
    assert sorted(p.name for p in tmp_path.rglob("*") if not p.is_relative_to(tmp_path / "c")) == before


def test_a_venv_a_new_path_or_an_empty_directory_is_taken(tmp_path):
    from torchbuild.devloop.host import check_venv_path

    (tmp_path / "empty").mkdir()
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    for name in ("new", "empty", "venv"):
        assert check_venv_path(tmp_path / name) == tmp_path / name


def test_a_venv_made_in_the_container_is_taken_though_its_python_dangles_here(tmp_path):
    """`python3 -m venv` run in the image links bin/python to the image's interpreter, which the
    host may not have: the venv is still one (its pyvenv.cfg says so)."""
    from torchbuild.bench.step import check_venv

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/nonexistent/in-the-image/python3")
    (venv / "pyvenv.cfg").write_text("home = /nonexistent/in-the-image\n")
    assert check_venv(venv) == venv / "bin" / "python"
