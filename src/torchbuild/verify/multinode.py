"""What the ranks of `invoke verify --nodes N` found (rankcheck.py, one JSON file per rank),
told as checks, a table per rank, a summary and the JSON report.

Each check over the job: pass when every rank passed it, fail when any rank failed it, skip
(with why) when every rank skipped it; plus whether every rank reported, and on how many nodes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torchbuild.core import console
from torchbuild.verify import rankcheck
from torchbuild.verify.step import Check

RANK_PROGRAM = Path(rankcheck.__file__)
# the checks every rank runs, in its order (rankcheck.main)
# rankcheck.py's checks, in its order (it imports nothing of torchbuild: the names are written twice)
CHECKS = ("gloo all_reduce", "nccl all_reduce", "mpi all_reduce", "mpi all_reduce (CUDA tensor)", "mpi4py allreduce")


@dataclasses.dataclass(frozen=True)
class Shape:
    """The job asked for: nodes x tasks_per_node ranks."""

    nodes: int
    tasks_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node


def read_ranks(run_dir: Path) -> list[dict[str, Any]]:
    """The ranks' results, by rank; a file that is not a rank's JSON is left out."""
    found = []
    for path in sorted((run_dir / "ranks").glob("rank-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("checks"), list):
            found.append(data)
    return sorted(found, key=lambda r: (r.get("rank", -1), r.get("hostname", "")))


def _over_ranks(name: str, ranks: Sequence[dict[str, Any]]) -> Check:
    """One check over every rank that reported it."""
    rows = [(r, c) for r in ranks for c in r["checks"] if c.get("name") == name]
    failed = [(r, c) for r, c in rows if c.get("status") == "fail"]
    if failed:
        r, c = failed[0]
        more = f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""
        return Check(name, "fail", f"rank {r.get('rank')} on {r.get('hostname')}: {c.get('detail', '')}{more}")
    if not rows:
        return Check(name, "fail", "no rank got to it")
    if all(c.get("status") == "skip" for _, c in rows):
        return Check(name, "skip", str(rows[0][1].get("detail", "")))
    passed = [c for _, c in rows if c.get("status") == "pass"]
    return Check(name, "pass", f"{len(passed)} ranks: {passed[0].get('detail', '')}")


def checks_of(ranks: Sequence[dict[str, Any]], shape: Shape) -> list[Check]:
    """Every rank reported, on the nodes asked for; a rank's failure before the checks (no
    launcher's rank, torch does not import, no rendezvous); then each check over the ranks,
    skipped where such a failure kept every rank from it."""
    seen = sorted({r.get("rank", -1) for r in ranks})
    missing = [str(r) for r in range(shape.world_size) if r not in seen]
    hosts = sorted({str(r.get("hostname", "")) for r in ranks})
    checks = [
        Check("ranks reported", "fail" if missing or len(seen) != shape.world_size else "pass",
              f"{len(ranks)} of {shape.world_size}" + (f"; no result from rank {', '.join(missing)}" if missing else "")),
        Check("nodes", "pass" if len(hosts) == shape.nodes else "fail",
              f"{len(hosts)} of {shape.nodes}: {', '.join(hosts) or '-'}"),
    ]  # fmt: skip
    before = list(dict.fromkeys(c.get("name") for r in ranks for c in r["checks"] if c.get("name") not in CHECKS))
    early = [_over_ranks(str(name), ranks) for name in before]
    checks += early
    for name in CHECKS:
        check = _over_ranks(name, ranks)
        if check.detail == "no rank got to it" and early:
            check = Check(name, "skip", f"not run: {early[0].name} failed")
        checks.append(check)
    return checks


def rank_table(ranks: Sequence[dict[str, Any]]) -> str:
    """One row per rank: where it ran and each check's status (the sum where it has one)."""
    rows = []
    for r in ranks:
        by_name = {c.get("name"): c for c in r["checks"]}
        cells = []
        for name in CHECKS:
            c = by_name.get(name)
            cells.append("-" if c is None else str(c.get("status")) + (f" {c['sum']}" if "sum" in c else ""))
        rows.append((str(r.get("rank")), str(r.get("hostname")), str(r.get("local_rank")), *cells))
    return console.table(["rank", "host", "local", *CHECKS], rows)


def summary(ranks: Sequence[dict[str, Any]], shape: Shape, checks: Sequence[Check]) -> dict[str, Any]:
    """World size, nodes and the gloo all_reduce sum against what it must be."""
    hosts = sorted({str(r.get("hostname", "")) for r in ranks})
    gloo = [c for r in ranks for c in r["checks"] if c.get("name") == "gloo all_reduce" and "sum" in c]
    expected = shape.world_size * (shape.world_size + 1) // 2
    sums = sorted({c["sum"] for c in gloo})
    return {
        "world_size": shape.world_size,
        "nodes": shape.nodes,
        "tasks_per_node": shape.tasks_per_node,
        "hosts": hosts,
        "all_reduce_sum": sums[0] if len(sums) == 1 else sums,
        "all_reduce_expected": expected,
        "all_reduce_correct": sums == [expected] and len(gloo) == shape.world_size,
        "ok": not any(c.status == "fail" for c in checks),
    }


def summary_line(s: dict[str, Any]) -> str:
    right = "correct" if s["all_reduce_correct"] else "WRONG"
    return (
        f"world size {s['world_size']} on {len(s['hosts'])} of {s['nodes']} nodes ({', '.join(s['hosts']) or '-'}); "
        f"gloo all_reduce sum {s['all_reduce_sum']} (expected {s['all_reduce_expected']}): {right}"
    )
