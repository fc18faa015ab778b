"""atomic: the one atomic write (issue 28), and the writers that go through it."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchbuild.builder import resume
from torchbuild.core.atomic import atomic_write_bytes, atomic_write_text, atomic_writer, umask
from torchbuild.core.errors import InsufficientSpace, PathError
from torchbuild.image import lock
from torchbuild.runtime import jobs, scheduler
from torchbuild.runtime.manifest import write_json

LOCK = lock.Lock(
    profile="p",
    arch="x86_64",
    inputs={},
    apt=(),
    pip={},
    base_image_id="sha256:" + "d" * 64,
    torchbuild_version="0.1.0",
    created="2026-11-23T06:03:24Z",
)


def _only(path: Path) -> list[str]:
    """The names in path's directory: the target alone means no temporary file was left."""
    return sorted(p.name for p in path.parent.iterdir())


def _refuse_replace(monkeypatch, name: str | None = None) -> None:
    """os.replace fails with a full disk (for a target called name, or for any target)."""
    real = os.replace

    def refuse(src, dst, *a, **kw):
        if name is None or Path(dst).name == name:
            raise OSError(errno.ENOSPC, "No space left on device", str(src), None, str(dst))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", refuse)


# --------------------------------------------------------------------------- the helper


def test_the_content_is_replaced_whole(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old\n")
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n" and _only(path) == ["f.json"]
    atomic_write_bytes(path, [b"a", b"b", b"c"])
    assert path.read_bytes() == b"abc" and _only(path) == ["f.json"]


def test_a_new_file_gets_the_umasks_mode_not_mkstemps_0600(tmp_path):
    path = tmp_path / "f"
    atomic_write_bytes(path, b"x")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask()
    atomic_write_bytes(path, b"x", mode=0o755)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755


def test_a_failure_in_the_data_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"old content")

    def chunks() -> Iterator[bytes]:
        yield b"half of the new"
        raise RuntimeError("the producer failed")

    with pytest.raises(RuntimeError, match="the producer failed"):
        atomic_write_bytes(path, chunks())
    assert path.read_bytes() == b"old content" and _only(path) == ["f"]


def test_ctrl_c_inside_the_block_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"old content")
    with pytest.raises(KeyboardInterrupt), atomic_writer(path) as f:
        f.write(b"part")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"old content" and _only(path) == ["f"]


def test_a_failed_rename_is_the_named_error_for_the_target(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_bytes(b"old content")
    _refuse_replace(monkeypatch)
    with pytest.raises(InsufficientSpace, match="writing the thing") as exc:
        atomic_write_text(path, "new", what="writing the thing")
    assert str(path) in exc.value.message and ".tmp" not in exc.value.message
    assert path.read_bytes() == b"old content" and _only(path) == ["f"]
    with pytest.raises(OSError):  # without `what`, the OSError as it is
        atomic_write_text(path, "new")
    assert _only(path) == ["f"]


def test_a_directory_that_is_not_there_is_a_path_error(tmp_path):
    with pytest.raises(PathError, match="does not exist"):
        atomic_write_text(tmp_path / "no" / "f", "x", what="writing it")


# --------------------------------------------------------------------------- the call sites


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_text("not yours\n")
    return victim


@pytest.mark.parametrize(
    "write, planted",
    [
        (lambda d: lock.write(LOCK, d / "torch.lock"), ".torch.lock.tmp"),
        (lambda d: atomic_write_text(d / "state.json", "{}\n"), ".partial-state.json"),  # build's state files
        (lambda d: jobs.record_measured(d / "measured.json", [{"file": "a.cu", "peak_rss_bytes": 5}]), "measured.tmp"),
        # {pid}: the running process's id, filled in at run time (the test's id stays the same in
        # every pytest-xdist worker, which must collect the same tests)
        (lambda d: resume.Record(d / "resume.json", "k").done("image"), ".resume.json.{pid}"),
    ],
)
def test_a_symlink_planted_at_a_predictable_temporary_name_is_never_written_through(tmp_path, write, planted):
    planted = planted.format(pid=os.getpid())
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / planted).symlink_to(victim)
    write(out)
    assert victim.read_text() == "not yours\n"
    written = [p for p in out.iterdir() if p.name != planted]
    assert written and all(not p.is_symlink() for p in written)


def test_the_batch_script_is_written_atomically_and_executable(tmp_path, monkeypatch):
    """write_job's two files: the profile its owner's alone (0600: it may carry a URL's
    credentials, issue 41 item 5), the script 0755; a planted link is not followed."""
    victim = _victim(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()

    class Sched:
        def script_path(self, job):
            return logs / "job.sh"

        def render(self, job):
            return "#!/bin/sh\n"

    class Job:
        spec = None
        rounds = None

    monkeypatch.setattr(scheduler, "profile_text", lambda spec: "profile\n")
    Job.logs = logs  # type: ignore[attr-defined]
    (logs / ".job.sh.partial").symlink_to(victim)
    script = scheduler.write_job(Sched(), Job(), logs / "profile.yaml")  # type: ignore[arg-type]
    assert stat.S_IMODE((logs / "profile.yaml").stat().st_mode) == 0o600
    assert stat.S_IMODE(script.stat().st_mode) == 0o755 and script.read_text() == "#!/bin/sh\n"
    assert victim.read_text() == "not yours\n"


# --------------------------------------------------------------------------- the JSON records


def test_write_json_keeps_the_old_record_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "x.verify.json"
    path.write_text('{"ok": true}\n')
    _refuse_replace(monkeypatch)
    with pytest.raises(InsufficientSpace, match="verify report"):
        write_json(path, {"ok": False}, "verify report")
    assert path.read_text() == '{"ok": true}\n' and _only(path) == ["x.verify.json"]
    monkeypatch.undo()
    write_json(path, {"ok": False}, "verify report")
    assert json.loads(path.read_text()) == {"ok": False}


def test_without_fsync_the_file_is_replaced_all_the_same(tmp_path, monkeypatch):
    """codegen's restore writes thousands of generated files through the same writer without
    waiting for the disk each time (fsync=False); the other writers wait."""
    target = tmp_path / "generated.cpp"
    target.write_text("old")
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    atomic_write_bytes(target, b"new", fsync=False)
    assert target.read_bytes() == b"new" and synced == []
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask()
    atomic_write_bytes(target, b"newer")
    assert target.read_bytes() == b"newer" and len(synced) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["generated.cpp"]
