"""A failed task leaves no empty directory it made (issue 41 item 18): `invoke submit` refused by
the scheduler left ./out, out/logs and out/.torchbuild/jobs/<key>; a failed install the parents
it had made for --prefix; `host-check --restore` var/lib/torchbuild. core/dirs.py records what
make_dirs creates and handles_errors removes, on a failure, what is still empty then."""

from __future__ import annotations

import os

import pytest
from helpers import fake_sif, make_wheel, run_invoke
from test_hostcheck import FakeSmi, make_host

from torchbuild.core.dirs import make_dirs, removing_made_dirs
from torchbuild.hostcheck import host as hc


def test_a_failure_removes_the_empty_directories_made_inside_and_keeps_the_rest(tmp_path):
    (tmp_path / "there").mkdir()
    with pytest.raises(RuntimeError), removing_made_dirs():
        make_dirs(tmp_path / "there" / "a" / "b" / "c")
        make_dirs(tmp_path / "kept" / "x")
        (tmp_path / "kept" / "x" / "file").write_text("written by the run: stays")
        raise RuntimeError("the task failed")
    assert sorted(os.listdir(tmp_path)) == ["kept", "there"]
    assert os.listdir(tmp_path / "there") == []
    assert (tmp_path / "kept" / "x" / "file").is_file()


def test_a_success_keeps_what_was_made_and_a_nested_block_hands_it_on(tmp_path):
    with removing_made_dirs():
        make_dirs(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    with pytest.raises(KeyboardInterrupt), removing_made_dirs():
        with removing_made_dirs():
            make_dirs(tmp_path / "n" / "m")
        raise KeyboardInterrupt
    assert not (tmp_path / "n").exists()


def test_a_submit_the_scheduler_refuses_leaves_no_out_logs_or_job_directory(tmp_path):
    """A real sbatch stand-in on PATH that refuses the job, as sbatch does (exit 1, its words)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid account' >&2\nexit 1\n"
    )
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    out = tmp_path / "new" / "out"
    res = run_invoke(
        "submit", "-c", "slurm", "--source", str(tree), "--out", str(out), "--sif", str(fake_sif(tmp_path / "t.sif")),
        "--set", "patches=none", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, timeout=300,
    )  # fmt: skip
    assert res.returncode == 20 and "SubmissionRefused" in res.stderr, res.stdout + res.stderr
    assert not (tmp_path / "new").exists(), sorted(str(p) for p in (tmp_path / "new").rglob("*"))


def test_a_failed_install_removes_the_parents_it_made_for_prefix(tmp_path):
    good = make_wheel(tmp_path / "wheels", "tbprobe", "1.0")
    res = run_invoke(
        "install", "--prefix", str(tmp_path / "a" / "b" / "env"), "--out", str(tmp_path / "o" / "out"),
        "--wheel", str(good), "--wheel", str(tmp_path / "missing-1.0-py3-none-any.whl"), timeout=300,
    )  # fmt: skip
    assert res.returncode == 15 and "does not exist" in res.stderr, res.stdout + res.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "o").exists()


def test_restore_removes_the_state_directory_apply_made(tmp_path):
    host = make_host(tmp_path / "host")
    smi = FakeSmi(1)
    hc.apply(host, runner=smi, as_root=True)
    assert (host / "var/lib/torchbuild/host-state.json").is_file()
    hc.restore(host, runner=smi, as_root=True)
    assert not (host / "var/lib/torchbuild").exists()
    assert (host / "var/lib").is_dir()  # not torchbuild's


def test_restore_of_a_state_file_given_with_state_leaves_its_directory(tmp_path):
    host = make_host(tmp_path / "host")
    mine = tmp_path / "mine"
    mine.mkdir()
    smi = FakeSmi(1)
    hc.apply(host, mine / "state.json", runner=smi, as_root=True)
    hc.restore(host, mine / "state.json", runner=smi, as_root=True)
    assert mine.is_dir() and os.listdir(mine) == []
