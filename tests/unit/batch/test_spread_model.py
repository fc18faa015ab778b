"""The on-paper model benchmarks/spread_nodes.py prints and the docs show (generated from it): a build's time
on N nodes of M cores from its per-unit times, Amdahl's serial part and the build node's own
preprocessing."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("spread_nodes_bench", ROOT / "benchmarks" / "spread_nodes.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["spread_nodes_bench"] = bench
_spec.loader.exec_module(bench)

UnitClass, BuildModel = bench.UnitClass, bench.BuildModel


def test_one_node_is_the_serial_part_plus_every_unit_over_its_cores() -> None:
    model = BuildModel(units=(UnitClass(100, 1.0, 8.0),), serial_s=60.0)
    # each unit: ccache's preprocessing, the compiler's own, the compile
    assert bench.build_seconds(model, 1, 10) == pytest.approx(60.0 + 100 * 10.0 / 10)


def test_more_nodes_divide_the_compiles_until_the_build_node_preprocessing_everything_binds() -> None:
    model = BuildModel(units=(UnitClass(1000, 1.0, 18.0),), serial_s=0.0)
    assert bench.build_seconds(model, 2, 10) == pytest.approx(20_000 / 20)
    # node1 preprocesses all 1000 units twice: 2000 s of its 10 cores, whatever N
    assert bench.build_seconds(model, 16, 10) == pytest.approx(2000 / 10)
    assert bench.build_seconds(model, 64, 10) == bench.build_seconds(model, 16, 10)


def test_heavy_units_stay_on_the_build_node_and_overhead_is_paid_per_shipped_unit() -> None:
    model = BuildModel(units=(UnitClass(100, 0.0, 10.0),), serial_s=0.0, heavy=40)
    assert bench.build_seconds(model, 8, 1) == pytest.approx(400.0)  # the 40 heavy ones on node1
    light = BuildModel(units=(UnitClass(100, 0.0, 10.0),), serial_s=0.0)
    assert bench.build_seconds(light, 2, 10, overhead_s=2.0) == pytest.approx((1000 + 100 * 2.0) / 20)
    assert bench.build_seconds(light, 1, 10, overhead_s=2.0) == pytest.approx(100.0)  # no distcc on one node


def test_no_build_is_shorter_than_its_longest_unit_or_its_serial_part() -> None:
    model = BuildModel(units=(UnitClass(2, 0.0, 100.0), UnitClass(10, 0.0, 1.0)), serial_s=30.0)
    assert bench.build_seconds(model, 4, 64) == pytest.approx(130.0)
    with pytest.raises(ValueError):
        bench.build_seconds(model, 0, 64)


def test_the_paper_table_for_pytorch() -> None:
    rows = bench.paper_table(bench.PYTORCH_26, overhead_s=bench.MEASURED_OVERHEAD_S)
    assert [(n, m) for n, m, _, _ in rows] == [(n, m) for m in (32, 64) for n in (1, 2, 4, 8)]
    for m in (32, 64):
        times = [t for n, mm, t, _ in rows if mm == m]
        assert times == sorted(times, reverse=True)  # more nodes never slower on paper
    assert all(speedup == 1.0 for n, _, _, speedup in rows if n == 1)
    once = bench.paper_table(
        dataclasses.replace(bench.PYTORCH_26, preprocess_passes=1), overhead_s=bench.MEASURED_OVERHEAD_S
    )
    # preprocessing once per unit never makes a build slower (the docs' second table)
    assert all(t1 <= t2 for (_, _, t1, _), (_, _, t2, _) in zip(once, rows))
