"""The one way torchbuild writes a file atomically.

A reader sees the old file or the new one, never a part: the data goes to a temporary file in
the target's directory, made by tempfile.mkstemp (O_CREAT|O_EXCL under a random name, so a
symlink planted beside the target is never written through), is flushed and fsync'd, and is
renamed onto the target with os.replace. On any failure, a KeyboardInterrupt included, the
temporary file is removed and the target is untouched.

The new file's mode is what a plain open() would give a new file (0o666 less the umask) unless
`mode` names one: mkstemp's 0600 would hide a manifest from a shared install's users.

With `what`, an OSError becomes the named error for the target (errors.os_fault), as
`named_os_errors(path, what)` does (naming the target, never the temporary file); without it the OSError is raised as it is.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from torchbuild.core.errors import StrPath, TorchbuildError, os_fault


def umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def _named(path: Path, what: str | None) -> Iterator[None]:
    """An OSError as the named error for the target (never the temporary file's name)."""
    if what is None:
        yield
        return
    try:
        yield
    except TorchbuildError:
        raise
    except OSError as exc:
        raise os_fault(exc, path, what) from exc


@contextlib.contextmanager
def atomic_writer(
    path: StrPath, *, mode: int | None = None, what: str | None = None, fsync: bool = True
) -> Iterator[BinaryIO]:
    """A binary file to write path's new content to; on a clean exit of the block it replaces
    path, on an exception (the block's or the write's) path is left as it was and nothing of
    the temporary file remains. fsync=False: not flushed to the disk before the rename (a file
    that is made again when lost, among thousands: a build tree's generated sources)."""
    target = Path(path)
    with _named(target, what):
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), (0o666 & ~umask()) if mode is None else mode)
                yield f
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            os.replace(name, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise


def atomic_write_bytes(
    path: StrPath,
    data: bytes | Iterable[bytes],
    *,
    mode: int | None = None,
    what: str | None = None,
    fsync: bool = True,
) -> None:
    """path holds data (bytes, or chunks of it) or what it held before, never a part."""
    with atomic_writer(path, mode=mode, what=what, fsync=fsync) as f:
        if isinstance(data, (bytes, bytearray, memoryview)):
            f.write(data)
        else:
            for chunk in data:
                f.write(chunk)


def atomic_write_text(path: StrPath, text: str, *, mode: int | None = None, what: str | None = None) -> None:
    """path holds text (UTF-8) or what it held before, never a part."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode, what=what)


# the name prefix of what a run makes before it is complete (a wheel's directory, a staged
# wheelhouse, a comms prefix): removed on every way out, renamed into place on success
PARTIAL_PREFIX = ".partial-"
EXCHANGE = ".torchbuild"  # directory in the output bind that carries request files
