"""`invoke sif --compression zstd` of the cpu image (moved from tests/integration/test_sif.py: a
second conversion of the 1.8 GB image, about a minute): the label and the squashfs say zstd
level 3, Apptainer 1.4 runs it, the same compression again is up to date."""

from __future__ import annotations

import re

import pytest
from helpers import run_invoke, set_args
from integration.test_sif import call, first_output_line, squashfs_compression

pytestmark = [pytest.mark.docker, pytest.mark.apptainer, pytest.mark.slow]


def test_sif_with_zstd_runs_on_apptainer_1_4(cpu_sif, tmp_path):
    """--compression zstd: the label and the squashfs say zstd level 3, and Apptainer 1.4
    (squashfuse, as unprivileged Apptainer mounts it) runs it."""
    _spec, _sif, _, apptainer, sets = cpu_sif
    args = ["sif", "--profile", "cpu", "--arch", "x86_64", "--apptainer", "docker", "--out", str(tmp_path)]
    res = run_invoke(*args, "--compression", "zstd", *set_args(sets))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert "(zstd:3)" in first_output_line(res.stdout, "written in")
    sif = tmp_path / "torch-build-cpu-x86_64.sif"
    assert apptainer.labels(sif)["org.torchbuild.sif.compression"] == "zstd:3"
    assert squashfs_compression(apptainer, sif) == ["Compression zstd", "compression-level 3"]
    rc, text = call(apptainer, ["exec", "--userns", str(sif), "python3", "--version"], [sif.parent])
    assert rc == 0 and re.search(r"^Python 3\.\d+\.\d+$", text, re.M), text
    # the same compression again: up to date; another one: converted again
    res = run_invoke(*args, "--compression", "zstd:3", *set_args(sets))
    assert res.returncode == 0 and "up to date" in res.stdout, res.stdout[-3000:] + res.stderr
