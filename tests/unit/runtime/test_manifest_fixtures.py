"""Manifests written by earlier torchbuilds (tests/fixtures/manifests, written by the hand-written
converter before the manifest moved onto core.records' cattrs converter) still read, and write
back byte for byte: a user's `<wheel>.manifest.json` and torchbuild-install.json keep their format."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchbuild.runtime import manifest as mf

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "manifests"
BUILD = sorted(FIXTURES.glob("*.manifest.json"))
INSTALL = sorted(FIXTURES.glob("install-*.json"))


def test_there_are_fixtures_of_both_kinds():
    assert len(BUILD) >= 4 and len(INSTALL) >= 2


@pytest.mark.parametrize("path", BUILD, ids=[p.name for p in BUILD])
def test_a_build_manifest_reads_and_writes_back_the_same_bytes(tmp_path, path):
    m = mf.read(path)
    assert m.run_id and (m.wheel is not None) != (m.preflight is not None)
    assert mf.write(m, tmp_path / path.name).read_bytes() == path.read_bytes()
    assert mf.read(tmp_path / path.name) == m


@pytest.mark.parametrize("path", INSTALL, ids=[p.name for p in INSTALL])
def test_an_install_manifest_reads_and_writes_back_the_same_bytes(tmp_path, path):
    m = mf.read_install(path)
    assert m.kind == "install" and m.wheels
    assert mf.write_install(m, tmp_path / path.name).read_bytes() == path.read_bytes()
    assert mf.read_install(tmp_path / path.name) == m


def test_the_fixtures_cover_every_optional_record():
    seen = {key for path in BUILD for key in mf.read(path).to_dict()}
    assert {"image", "comms", "companion", "reproducibility", "packages", "preflight", "wheel"} <= seen
    full = mf.read(FIXTURES / "wheel-docker-schema5.manifest.json")
    assert full.comms and full.comms.nccl and full.comms.plugin and full.image and full.image.inputs
    assert {m.mpi is None for m in map(mf.read_install, INSTALL)} == {True, False}
