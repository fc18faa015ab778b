"""batch/rounds.py: a build carried across allocations. The supervisor runs a stand-in build
(a script that prints ninja's status lines and stops on SIGTERM as torchbuild does), stops it
before the walltime (its own timer, or SIGUSR1 from the script's trap), records the round and
submits the next one; no progress, too many rounds and a refused submission are named errors.
And the Slurm and PBS scripts that run it: directives, bash -n, shellcheck."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_scheduler import _job, _lint, _spec

from torchbuild.runtime import manifest as mf
from torchbuild.runtime.scheduler import Pbs, Slurm, new_state, write_job

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "manifests"
# a build: ninja's "[k/N]" line every `pace` seconds for `steps` steps; SIGTERM ends it with 130
# (BuildInterrupted); at the end the manifest line `invoke build` prints, when given one
BUILD = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
steps, pace, code, manifest = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for k in range(1, steps + 1):
    time.sleep(pace)
    print(f"  [{k}/{steps}] step {k}", flush=True)
if manifest:
    print(f"manifest: {manifest}", flush=True)
sys.exit(code)
"""


def _state(tmp_path: Path, *, max_rounds: int = 3, walltime: int = 3, warning: int = 1, submit=None) -> Path:
    path = tmp_path / "rounds.json"
    submit = submit if submit is not None else [sys.executable, "-c", "print('next-{job}')"]
    state = new_state(max_rounds=max_rounds, warning_s=warning, walltime_s=walltime, scheduler="slurm", submit=submit)
    path.write_text(json.dumps(state))
    return path


def _round(state: Path, steps: int, pace: float, code: int = 0, manifest: str = "", **kw) -> subprocess.Popen[str]:
    build = [sys.executable, "-c", BUILD, str(steps), str(pace), str(code), manifest]
    return subprocess.Popen(
        [sys.executable, "-m", "torchbuild.batch.rounds", str(state), "--", *build],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "77", **kw},
    )


def _done(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_a_round_stops_before_the_walltime_records_itself_and_submits_the_next(tmp_path):
    state = _state(tmp_path)  # 3 s walltime, 1 s warning: the build is stopped after 2 s
    t0 = time.monotonic()
    code, out, err = _done(_round(state, steps=50, pace=0.25))
    assert code == 0, out + err
    assert time.monotonic() - t0 < 10
    assert "round 1 of at most 3 (job 77)" in out
    (r,) = json.loads(state.read_text())["rounds"]
    assert r["ended"] == "limit" and r["job"] == "77" and 3 <= r["ninja_steps"] < 50
    assert f"round 1 limit after 2 s: {r['ninja_steps']} ninja steps finished" in out
    assert "round 2 is submitted" in out and "next round's job: next-77" in out  # {job} is the job's id


def test_the_warning_signal_stops_the_round_early(tmp_path):
    state = _state(tmp_path, walltime=3600, warning=60)
    proc = _round(state, steps=200, pace=0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGUSR1)  # what the script's trap hands on from Slurm's --signal=B:USR1
    code, out, err = _done(proc)
    assert code == 0, out + err
    assert json.loads(state.read_text())["rounds"][0]["ended"] == "limit"


def test_the_last_round_finishes_and_the_manifest_gets_every_round(tmp_path):
    manifest = tmp_path / "w.manifest.json"
    shutil.copy(FIXTURES / "wheel-docker-schema5.manifest.json", manifest)
    state = _state(tmp_path)
    assert _done(_round(state, steps=50, pace=0.25))[0] == 0  # round 1: stopped at the limit
    code, out, err = _done(_round(state, steps=3, pace=0.1, manifest=str(manifest), SLURM_JOB_ID="77"))
    assert code == 0, out + err
    rounds = mf.read(manifest).rounds
    assert rounds is not None and [(r.round, r.ended) for r in rounds] == [(1, "limit"), (2, "finished")]
    assert "job rounds" in mf.show(mf.read(manifest))


def test_a_round_that_finishes_no_step_stops_with_no_progress(tmp_path):
    state = _state(tmp_path)
    code, out, err = _done(_round(state, steps=5, pace=30))
    assert code == 30 and "NoProgress: round 1 finished no ninja step before the limit" in err, err
    assert "submitted" not in out


def test_the_last_allowed_round_at_the_limit_is_rounds_exhausted_and_a_later_one_refused(tmp_path):
    state = _state(tmp_path, max_rounds=1)
    code, _, err = _done(_round(state, steps=50, pace=0.25))
    assert code == 31 and "RoundsExhausted: the build did not finish in 1 rounds" in err
    code, out, err = _done(_round(state, steps=1, pace=0.1))
    assert code == 31 and "round 1" not in out  # refused before running anything


def test_a_refused_submission_is_named_in_the_job_log(tmp_path):
    state = _state(
        tmp_path,
        submit=[sys.executable, "-c", "import sys; print('sbatch: error: QOS limit', file=sys.stderr); sys.exit(1)"],
    )
    code, _, err = _done(_round(state, steps=50, pace=0.25))
    assert code == 20 and "SubmissionRefused:" in err and "QOS limit" in err, err


def test_a_build_that_fails_ends_the_job_with_its_code_and_no_new_round(tmp_path):
    state = _state(tmp_path, walltime=3600, warning=60)
    code, out, _ = _done(_round(state, steps=2, pace=0.1, code=10))
    assert code == 10 and "submitted" not in out
    assert json.loads(state.read_text())["rounds"][0]["ended"] == "failed"


# -------------------------------------------------------------------- the scripts


@pytest.mark.parametrize("scheduler", [Slurm(), Pbs()])
def test_a_rounds_job_script_runs_the_supervisor_in_the_background_and_lints(tmp_path, scheduler):
    spec = _spec("cpu", f"scheduler={scheduler.name}", "job_rounds=4", "job_round_warning_s=120", "walltime=00:30:00")
    job = _job(tmp_path, spec, rounds=tmp_path / "out" / ".torchbuild" / "jobs" / "k" / "rounds.json")
    script = write_job(scheduler, job, tmp_path / "out" / ".torchbuild" / "jobs" / "k" / "cpu.yaml")
    text = script.read_text()
    assert "-m torchbuild.batch.rounds" in text and "trap 'kill -USR1 \"$tb_pid\" 2>/dev/null' USR1" in text
    assert "exec " not in text.split("set -eo pipefail")[1]
    _lint(script)
    state = json.loads(job.rounds.read_text())  # type: ignore[union-attr]
    assert (state["max_rounds"], state["warning_s"], state["walltime_s"], state["rounds"]) == (4, 120, 1800, [])
    if scheduler.name == "slurm":
        assert {"--signal=B:USR1@120", "--requeue", "--open-mode=append"} <= {
            ln[8:] for ln in text.splitlines() if ln.startswith("#SBATCH ")
        }
        assert state["submit"] == ["scontrol", "requeue", "{job}"]
    else:
        assert state["submit"] == ["qsub", str(script)]


def test_a_warning_as_long_as_the_walltime_is_refused():
    from torchbuild.core.errors import UsageError
    from torchbuild.runtime.scheduler import check_job_keys

    with pytest.raises(UsageError, match="leaves no time of the walltime"):
        check_job_keys(_spec("cpu", "job_rounds=2", "job_round_warning_s=600", "walltime=00:10:00"))
