"""The one bounded reader and the one argv guard.

Every read of a file the user named (a profile, a manifest, a state file, a recipe, a wheel's
member) goes through `read_bytes`/`read_text`/`read_json` with a limit (a wheel's archive through
`open_regular`), so `/dev/zero`, a FIFO or
a 20 GB file is a named error instead of the kernel's OOM killer. Every value a user gave that
ends up in an argv of git, tar, pip or apptainer is checked by `not_an_option` (a value that
starts with `-` would be read as an option) and placed after `--` / `--end-of-options`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from torchbuild.core.errors import PathError, StrPath, TorchbuildError, UsageError, os_fault
from torchbuild.core.errors import TooLarge as TooLarge  # defined in errors.py (its registry); importable here too

KiB = 1024
MiB = 1024 * KiB

# limits per kind of file; each is far above what torchbuild writes or a person types
PROFILE_LIMIT = 1 * MiB
MANIFEST_LIMIT = 64 * MiB
STATE_LIMIT = 4 * MiB
RECIPE_LIMIT = 1 * MiB
MEMBER_LIMIT = 4 * 1024 * MiB  # a wheel member compared by manifest.diff (libtorch_cpu.so is ~500 MiB)
# JSON nesting and number length: Python's json has neither limit
JSON_DEPTH = 64
JSON_NUMBER_DIGITS = 64


def _size_label(n: int) -> str:
    """1.2 MiB, 3 KiB, 17 bytes: one decimal where it is not whole, so 'is 1.2 MiB, more than 1 MiB'."""
    for unit, size in (("GiB", 1024 * MiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def _open_regular(p: Path, what: str, error: type[TorchbuildError]) -> tuple[int, os.stat_result]:
    """An open descriptor of the regular file p (non-blocking, so a FIFO never waits for a
    writer) and its stat; `error` for a directory, device, FIFO or socket (the descriptor is
    closed then), the OS fault's named error when it cannot be opened."""
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise os_fault(exc, p, what) from exc
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise error(f"{what}: {p} is a directory, a file was expected", hint="name a file")
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what}: {p} is not a regular file (a device, FIFO or socket)", hint="name a regular file")
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError):
            raise os_fault(exc, p, what) from exc
        raise
    return fd, st


def read_bytes(path: StrPath, limit: int, what: str, error: type[TorchbuildError] = PathError) -> bytes:
    """At most `limit` bytes of the regular file `path`; a larger file, a device, a FIFO or a
    directory is `error` (PathError by default) naming it, an OS fault its named error."""
    p = Path(path)
    fd, st = _open_regular(p, what, error)
    try:
        if st.st_size > limit:
            raise (TooLarge if error is PathError else error)(
                f"{what}: {p} is {_size_label(st.st_size)}, more than the {_size_label(limit)} torchbuild reads",
                hint="name the right file; this one is far larger than any torchbuild writes",
            )
        chunks: list[bytes] = []
        total = 0
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            while total <= limit:
                chunk = f.read(min(1 * MiB, limit + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        if total > limit:  # grew while read
            raise (TooLarge if error is PathError else error)(
                f"{what}: {p} is more than the {_size_label(limit)} torchbuild reads",
                hint="name the right file; this one is far larger than any torchbuild writes",
            )
        return b"".join(chunks)
    except OSError as exc:
        raise os_fault(exc, p, what) from exc
    finally:
        if fd >= 0:
            os.close(fd)


def sha256_file(path: StrPath) -> str:
    """The sha256 of a file's content, read in blocks (a wheel is gigabytes). The one file digest
    of torchbuild (hashlib.file_digest from Python 3.11 only); OSError as open() raises it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_text(path: StrPath, limit: int, what: str, error: type[TorchbuildError] = PathError) -> str:
    """`read_bytes` decoded as UTF-8; text that is not UTF-8 is `error` naming the line."""
    raw = read_bytes(path, limit, what, error)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(
            f"{what}: {path}:{line}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})",
            hint="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
        ) from None


def _number(text: str) -> Any:
    if len(text.lstrip("-").replace(".", "").split("e")[0].split("E")[0]) > JSON_NUMBER_DIGITS:
        raise ValueError(f"a number of more than {JSON_NUMBER_DIGITS} digits")
    value = float(text) if any(c in text for c in ".eE") else int(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} is out of range")
    return value


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(text: str) -> int:
    """The deepest nesting of [ and { outside strings (a cheap scan before json.loads recurses)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def loads_json(text: str, where: str = "") -> Any:
    """json.loads that refuses what Python's json takes but no other reader does, or that
    crashes it: nesting deeper than JSON_DEPTH, numbers of more than JSON_NUMBER_DIGITS digits,
    NaN and Infinity. ValueError (json.JSONDecodeError for bad syntax) says which."""
    if _depth(text) > JSON_DEPTH:
        raise ValueError(f"nested more than {JSON_DEPTH} levels deep")
    return json.loads(text, parse_int=_number, parse_float=_number, parse_constant=_constant)


def read_json(path: StrPath, limit: int, what: str, error: type[TorchbuildError] = PathError) -> Any:
    """A bounded, strict JSON file: `read_text` then `loads_json`; bad JSON is `error`."""
    text = read_text(path, limit, what, error)
    try:
        return loads_json(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{what}: {path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); truncated?"
        ) from None
    except ValueError as exc:
        raise error(f"{what}: {path}: not usable JSON ({exc})") from None


def user_path(value: StrPath, what: str = "the path", error: type[TorchbuildError] = PathError) -> Path:
    """Path(value) with ~ and ~user expanded, as a shell would have: `error` naming `what` where
    ~user names no user of this host (Path.expanduser raises RuntimeError there; a shell leaves
    such a word as it is) or the path holds a NUL byte (every system call would refuse it)."""
    text = os.fspath(value)
    if "\0" in text:
        raise error(f"{what} {text!r} holds a NUL byte", hint="write the path without it")
    expanded = os.path.expanduser(text)
    if expanded.startswith("~"):
        user = expanded[1:].split("/", 1)[0]
        raise error(
            f"{what} {text}: there is no user {user!r} on this host to expand ~{user}",
            hint="write the path out in full, or ~/... for your own home",
        )
    return Path(expanded)


def not_an_option(value: str, what: str, error: type[TorchbuildError] = UsageError) -> str:
    """`value` unchanged, or `error` when it starts with `-` (git, tar, pip and apptainer would
    read it as an option: `--upload-pack=...`, `--orphan`). Callers also put the value after
    `--`/`--end-of-options`; this refusal makes the mistake visible instead of a path named `-x`."""
    if value.startswith("-"):
        raise error(
            f"{what} {value!r} starts with '-', which a command would read as an option",
            hint=f"give a {what} that does not start with '-' (for a path, write ./{value})",
        )
    return value


def open_regular(path: StrPath, what: str, error: type[TorchbuildError] = PathError) -> BinaryIO:
    """The regular file `path`, open for reading in binary (for a reader that takes a file, such
    as zipfile): `error` naming it for a directory, device, FIFO or socket, which is never waited
    on (zipfile.ZipFile(path) of a FIFO named *.whl waited for a writer for good); an OS fault
    its named error. The file checked is the file read: no second open by name."""
    p = Path(path)
    fd, _ = _open_regular(p, what, error)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_head(path: StrPath, size: int, what: str, error: type[TorchbuildError] = PathError) -> bytes:
    """The first `size` bytes (at most) of the regular file `path`, however large it is: to
    check a file's magic bytes. A directory, device or FIFO is `error` naming it, an OS fault
    its named error."""
    p = Path(path)
    fd, _ = _open_regular(p, what, error)
    try:
        return os.read(fd, size)
    except OSError as exc:
        raise os_fault(exc, p, what) from exc
    finally:
        os.close(fd)
