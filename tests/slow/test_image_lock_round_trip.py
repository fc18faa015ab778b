"""`invoke image --lock` on a real engine (moved from tests/integration/test_image_lock.py: about
2 minutes, the sid-pythons image built again from its lock with no cache): the lock's rebuild
installs the very same packages as the unlocked image, a present lock is a cache hit, a pinned
version the archive no longer has is a LockError (exit 28) naming the refresh command, and a
lock made for other inputs is refused before anything is built."""

from __future__ import annotations

import pytest
from helpers import TEST_TORCH, run_invoke, set_args
from integration.test_image_lock import LOCKED_NAME, SID_PYTHONS, _cached_step, installed, run_in

from torchbuild.image import lock as lk

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def test_lock_round_trip_installs_the_same_packages(engine, sid_pythons_image, tmp_path):
    spec, sets = sid_pythons_image
    lock_file = tmp_path / "sid-pythons.x86_64.lock"
    args = [
        "image",
        "--profile",
        SID_PYTHONS,
        "--arch",
        "x86_64",
        *set_args([TEST_TORCH, *sets, f"image_name={LOCKED_NAME}"]),
    ]
    locked_tag = spec.image_tag.replace(spec.image_name, LOCKED_NAME)
    try:
        res = run_invoke(*args, "--lock", "--lock-file", str(lock_file))
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr
        assert "both images list the same packages" in res.stdout
        lock, sha256 = lk.read(lock_file)
        apt, pip = lock.counts()
        assert apt > 50 and list(lock.pip) == ["3.13", "3.14"] and pip > 10
        assert any(p.startswith("python3.14-venv=") for p in lock.apt)
        labels = engine.image_attrs(locked_tag)["Config"]["Labels"]
        assert labels["org.torchbuild.locked"] == "true" and labels["org.torchbuild.lock-sha256"] == sha256
        # what the lock installed is what the unlocked image has, to the version
        assert installed(engine, locked_tag) == installed(engine, spec.image_tag)
        # the lock travels into the image: the lists it installed and which file they came from
        shown = run_in(engine, locked_tag, "cat", "/opt/torchbuild/inputs/lock/lock.sha256")
        assert shown == f"{sha256}  {lock_file.name}"
        # present, the lock is used: a cache hit (or, where torchbuild's source changed meanwhile,
        # the apt and pip layers from Docker's cache: the lock is the same input)
        again = run_invoke(*args, "--lock-file", str(lock_file))
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr
        assert "up to date (cache hit)" in again.stdout or _cached_step(again.stdout, "RUN mapfile -t pythons")

        # a pinned version the archive does not have: the named error, with the refresh command
        stale = tmp_path / "stale.lock"
        text = lock_file.read_text()
        cmake = next(line for line in text.splitlines() if line.startswith("- cmake="))
        stale.write_text(text.replace(cmake, "- cmake=9.9.9-1"))
        res = run_invoke(*args, "--lock-file", str(stale))
        assert res.returncode == 28, res.stdout[-3000:] + res.stderr
        assert "LockError" in res.stderr and "no longer installs: the locked apt packages did not install" in res.stderr
        assert "Version '9.9.9-1' for 'cmake' was not found" in res.stderr
        assert f"--lock --rebuild --lock-file {stale}" in res.stderr
        assert engine.image_attrs(locked_tag)["Config"]["Labels"]["org.torchbuild.lock-sha256"] == sha256

        # a lock made for other inputs is refused before anything is built
        other = run_invoke(*args, "--set", "python_versions=3.13", "--lock-file", str(lock_file))
        assert other.returncode == 28 and "python_versions: lock has 3.14 the profile does not" in other.stderr
    finally:
        if engine.image_attrs(locked_tag):
            engine.client.images.remove(locked_tag, force=True)
