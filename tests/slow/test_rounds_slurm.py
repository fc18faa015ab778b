"""A build carried over allocations by itself on the real one-node Slurm (profile key job_rounds):
about 12 minutes, most of it Slurm holding each requeued job about two minutes before it is
eligible again, so it is in the slow session."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from integration.test_slurm import job_id_of, minitorch, submit

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_build_longer_than_the_walltime_goes_on_over_rounds_by_itself(slurm, tmp_path):
    """job_rounds: a one-minute walltime and a build of about 80 s of steps. Each round stops the
    build 20 s before its limit, records itself and requeues the job (the same id, the same log);
    the last one builds and verifies the wheel, whose manifest lists every round. Nothing is
    compiled twice: each slow step's output is made once over all the rounds."""
    tree, out, cache = minitorch(tmp_path), tmp_path / "out", tmp_path / "cache"
    sets = ("env.MINITORCH_SLOW_UNITS=10", "env.MINITORCH_UNIT_SECONDS=8", "job_rounds=6", "job_round_warning_s=20")
    res = submit(
        slurm, tree, out, cache, "--engine", "native", "--walltime", "00:01:00", "--wait", sets=sets, timeout=1200
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    job = job_id_of(res.stdout)
    log = next((out / "logs").glob(f"*-{job}.log")).read_text()
    ran = re.findall(r"^torchbuild: round (\d+) (limit|finished) after (\d+) s: (\d+) ninja steps finished$", log, re.M)
    assert len(ran) >= 3 and ran[-1][1] == "finished" and all(r[1] == "limit" for r in ran[:-1]), log[-4000:]
    assert all(int(r[3]) > 0 for r in ran), ran  # every round made progress
    assert log.count("torchbuild: round 2 is submitted: scontrol requeue " + job) == 1
    (wheel,) = out.glob("minitorch-2.6.0-*.whl")
    m = json.loads((out / f"{wheel.name}.manifest.json").read_text())
    assert [r["ended"] for r in m["rounds"]] == [r[1] for r in ran] and {r["job"] for r in m["rounds"]} == {job}
    assert json.loads(Path(f"{wheel}.verify.json").read_text())["ok"]
    # the report of the round that made the wheel covers the whole build: every round a run
    eff = m["report"]["efficiency"]
    assert eff["runs"] == len(ran) and eff["build_wall_s"] > eff["ninja_wall_s"] >= eff["work_s"] * 0.99, eff
    # each slow step ran to its end once: ninja's log lists each output once over all the rounds
    logged = [ln.split("\t")[3] for ln in (tree / "build" / ".ninja_log").read_text().splitlines()[1:]]
    # CMake's custom command with an absolute OUTPUT is logged under both names: the relative one
    done = [o for o in logged if "slow/unit_" in o and not o.startswith("/")]
    assert len(done) == len(set(done)) == 10, done
