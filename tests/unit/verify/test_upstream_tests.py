"""verify/upstream_tests.py: the profile's subset of the source's test/ run with pytest against
an interpreter, its counts from pytest's JUnit XML, the failure budget, the whole-run time bound
(pytest stopped with SIGINT reports what ran), the per-arch skip list; and verify's check of it."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import FIXTURES

from torchbuild.verify import upstream_tests
from torchbuild.verify.step import _upstream

TESTS = {
    "test_torch.py": "def test_a():\n    pass\n\ndef test_b():\n    pass\n\ndef test_known_bad():\n    assert False\n",
    "test_nn.py": "import pytest\n\ndef test_c():\n    pass\n\n@pytest.mark.skip(reason='no')\ndef test_d():\n    pass\n",
    "test_slow.py": "import time\n\ndef test_1():\n    pass\n\ndef test_2():\n    time.sleep(60)\n",
}


def _spec(**kw):
    fields = {"verify_tests": ("test_torch.py", "test_nn.py"), "verify_tests_timeout_s": 120}
    fields |= {"verify_tests_max_failures": 0, "verify_tests_skip": {}}
    return SimpleNamespace(**{**fields, **kw})


@pytest.fixture
def tests_dir(tmp_path: Path) -> Path:
    d = tmp_path / "src" / "test"
    d.mkdir(parents=True)
    for name, text in TESTS.items():
        (d / name).write_text(text)
    (tmp_path / "src" / "pytest.ini").write_text("[pytest]\naddopts = --this-option-does-not-exist\n")
    return d


def test_counts_come_from_pytests_own_report(tests_dir: Path):
    out = upstream_tests.run(sys.executable, tests_dir, _spec(), "x86_64")
    assert out is not None and not out.note
    assert (out.passed, out.failed, out.skipped, out.timed_out) == (3, 1, 1, False)
    assert out.failures == ("test_torch::test_known_bad",)  # as pytest names it, test/ its root
    assert not out.ok(budget=0) and out.ok(budget=1)
    assert not list(tests_dir.rglob("__pycache__")) and not (tests_dir / ".pytest_cache").exists()


def test_the_arch_skip_list_deselects_and_is_recorded(tests_dir: Path):
    spec = _spec(verify_tests_skip={"x86_64": "test_torch.py::test_known_bad", "aarch64": "test_nn.py::test_c"})
    out = upstream_tests.run(sys.executable, tests_dir, spec, "x86_64")
    assert out is not None and (out.passed, out.failed) == (3, 0) and out.ok(0)
    assert out.deselected == ("test_torch.py::test_known_bad",)


def test_the_time_bound_stops_pytest_which_reports_what_ran(tests_dir: Path, monkeypatch):
    monkeypatch.setattr(upstream_tests, "GRACE_S", 20)
    t0 = time.monotonic()
    out = upstream_tests.run(
        sys.executable, tests_dir, _spec(verify_tests=("test_slow.py",), verify_tests_timeout_s=5), "x86_64"
    )
    assert time.monotonic() - t0 < 40
    assert out is not None and out.timed_out and out.passed >= 1 and not out.ok(budget=10)
    assert "stopped at the time bound" in out.detail(0)


def test_no_such_tests_in_the_source_is_a_note_and_an_empty_list_runs_nothing(tests_dir: Path):
    out = upstream_tests.run(sys.executable, tests_dir, _spec(verify_tests=("test_linalg.py",)), "x86_64")
    assert out is not None and out.note.startswith("none of test_linalg.py is in")
    assert upstream_tests.run(sys.executable, tests_dir, _spec(verify_tests=()), "x86_64") is None


def test_verify_adds_one_check_and_the_counts_for_its_report(tests_dir: Path):
    results: dict = {}
    (check,) = _upstream(sys.executable, tests_dir, _spec(verify_tests_max_failures=1), results)
    assert check.name == "PyTorch's own tests" and check.status == "pass"
    assert check.detail.startswith("3 passed, 1 failed, 1 skipped in ")
    assert results["tests"]["passed"] == 3 and list(results["tests"]["failures"]) == ["test_torch::test_known_bad"]
    (missing,) = _upstream(sys.executable, tests_dir, _spec(verify_tests=("test_linalg.py",)), {})
    assert missing.status == "skip"
    assert _upstream(sys.executable, tests_dir.parent / "no-test-dir", _spec(), {}) == []  # not PyTorch's tree


def test_verify_on_its_own_finds_the_tree_its_wheels_manifest_names(tmp_path: Path):
    """`invoke verify --wheel W` after the build (issue 42): PyTorch's own tests come from the
    tree W's manifest names, as they do in the verify the build runs; not without verify_tests,
    a manifest, or the tree."""
    from torchbuild.profile.config import resolve
    from torchbuild.verify.host import tests_tree

    tree = tmp_path / "pytorch"
    (tree / "test").mkdir(parents=True)
    wheel = tmp_path / "out" / "torch-2.6.0+debian-cp313-cp313-linux_x86_64.whl"
    wheel.parent.mkdir()
    data = json.loads((FIXTURES / "manifests" / "wheel-docker-schema5.manifest.json").read_text())
    data["source"]["path"] = str(tree)
    Path(f"{wheel}.manifest.json").write_text(json.dumps(data))
    wants = resolve("cpu", ["verify_tests=[test_torch.py]"])
    assert tests_tree(wants, wheel) == tree
    assert tests_tree(resolve("cpu", ["verify_tests=[]"]), wheel) is None  # the profile asks for none
    assert tests_tree(wants, tmp_path / "elsewhere.whl") is None  # no manifest beside it
    shutil.rmtree(tree)
    assert tests_tree(wants, wheel) is None  # the tree is gone
