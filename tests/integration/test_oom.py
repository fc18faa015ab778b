"""Never babysit a build: a compile killed for memory under a real cgroup cap resumes on its
own with fewer jobs, and nothing that had finished is compiled again."""

from __future__ import annotations

import collections
import json
import os

import pytest
from helpers import manifest_of, run_invoke
from test_build import build_args, workspace  # noqa: F401 - the fixture is used by name

from torchbuild.runtime.report import outputs_of

pytestmark = pytest.mark.docker

# minitorch's heavy units take ~0.8 GB each in cc1plus at -O2: one fits under the cap, two do not
HEAVY_SETS = ["env.MINITORCH_HEAVY=4"]
CAP = "1300m"


def test_oom_kill_resumes_with_fewer_jobs_and_recompiles_nothing(engine, cpu_image, site_overrides, workspace):  # noqa: F811
    tree, out, cache = workspace
    nproc = max(2, os.cpu_count() or 1)
    res = run_invoke(
        *build_args(tree, out, cache, [*site_overrides, *HEAVY_SETS], "--memory", CAP, "--jobs", str(nproc)),
        timeout=1800,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    m = manifest_of(res.stdout)
    jobs = m["jobs"]
    assert jobs["max_jobs"] == nproc and jobs["retries"], jobs
    assert jobs["final_jobs"] < nproc
    assert [r["jobs"] for r in jobs["retries"]] == sorted((r["jobs"] for r in jobs["retries"]), reverse=True)
    assert all(r["evidence"] for r in jobs["retries"])
    assert "out of memory in pip wheel" in res.stdout and "resuming the same build tree" in res.stdout
    assert "OOM retries" in res.stdout
    # every output ninja finished appears once in .ninja_log: no finished unit was compiled again
    outputs = outputs_of(tree / "build" / ".ninja_log")
    twice = [o for o, n in collections.Counter(outputs).items() if n > 1]
    assert not twice, twice
    assert sum(o.endswith(".cpp.o") and "heavy_" in o for o in outputs) == 4
    # the report names the heavy units as the slowest: in its text and in the Chrome trace
    assert "heavy_" in (out / "logs" / m["report"]["text"]).read_text()
    trace = json.loads((out / "logs" / m["report"]["trace"]).read_text())
    slowest = max((e for e in trace["traceEvents"] if e["ph"] == "X"), key=lambda e: e["dur"])
    assert "heavy_" in slowest["name"], slowest


def test_planner_reads_the_cgroup_limit_inside_a_capped_container(engine, cpu_image):
    spec, _ = cpu_image
    raw = engine.client.containers.run(
        spec.image_tag, ["torchbuild", "config", "--format", "json"], mem_limit="1g", remove=True
    )
    data = json.loads(raw.decode())
    assert "1.0 GiB (cgroup memory limit)" in data["jobs_reason"], data["jobs_reason"]
    assert data["env"]["MAX_JOBS"] == "1"  # 1 GiB / 1.5 GiB per job, at least one
