"""Reproducible wheels: the build's clock (SOURCE_DATE_EPOCH), path-independent compiles, a
canonical zip layout, and the comparison of two wheels member by member.

    source_date_epoch(info)   the source's own time: its commit's, or its archive's newest member;
                              a plain tree's is a constant (its mtimes are how it was copied)
    normalize_wheel(w, t)     members sorted (.dist-info last, RECORD last), one timestamp,
                              0644/0755 modes, no extra fields: the same files give the same bytes
    diff_wheels(a, b)         identical, or which members differ and how

The zip is rewritten with the standard library's zipfile: the libraries that fix zip timestamps
(repro-zipfile) leave member order and modes to the caller, and the rest (strip-nondeterminism)
are not Python.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import hashlib
import os
import shutil
import stat
import struct
import subprocess
import tarfile
import time
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from torchbuild.core.atomic import atomic_writer
from torchbuild.core.errors import WheelError, named_os_errors
from torchbuild.core.process import QUERY_TIMEOUT, run_captured
from torchbuild.core.safeio import MEMBER_LIMIT, sha256_file
from torchbuild.source.fetch import SourceInfo

# zip cannot say a date before 1980; ZipInfo stores even seconds
ZIP_EPOCH = 315532800  # 1980-01-01T00:00:00Z
# the deflate level of setuptools' bdist_wheel (zlib's default): a wheel already canonical keeps its bytes
DEFLATE_LEVEL = 6
# A plain tree (no commit, no archive, no changelog) has nothing in it that says when it was made:
# its mtimes say when and how it was copied (`cp -r` gives the copy's time), and the build itself
# writes into it. So its clock is this constant, and the same content gives the same wheel.
PLAIN_TREE_EPOCH = ZIP_EPOCH
PLAIN_TREE = "plain tree: constant 1980-01-01"
# manifest.diff of two wheels compares at most this many members each (a torch wheel has ~15,000)
MEMBERS_LIMIT = 500_000
# ... and inflates the members both hold with the same size and CRC, to compare their bytes: at
# most DIFF_INFLATE_LIMIT of both wheels together, and at most INFLATE_RATIO times each archive's
# own size once past INFLATE_FLOOR. A torch wheel inflates 2 to 4 times (2.14.1 CUDA: 528 MiB to
# 1.1 GiB; 2.13.0 CPU: 182 MiB to 666 MiB); two 4 MB wheels of zeros declared 16 GiB each, and
# took 42 s of CPU to compare. Member sizes are checked from the central directory, before any
# byte is inflated (zipfile stops a member at its declared size).
DIFF_INFLATE_LIMIT = 16 * 2**30
INFLATE_RATIO = 100
INFLATE_FLOOR = 64 * 2**20


@dataclasses.dataclass(frozen=True)
class Epoch:
    """SOURCE_DATE_EPOCH and what it came from (recorded in the manifest)."""

    seconds: int
    origin: str  # "commit 1a2b3c4d", "archive pytorch_2.6.0.orig.tar.xz", "debian/changelog", "env", PLAIN_TREE


def source_date_epoch(info: SourceInfo, environ: dict[str, str] | None = None) -> Epoch:
    """The source's time: SOURCE_DATE_EPOCH from the environment when set (a site's release
    process), else the commit's committer time, else the Debian changelog's date (a .dsc, or a
    tree with debian/changelog),
    else the newest member of the archive, else (a plain tree) PLAIN_TREE_EPOCH: never the
    tree's mtimes, which differ between two copies of the same content."""
    env = os.environ if environ is None else environ
    given = env.get("SOURCE_DATE_EPOCH", "")
    if given.isdigit():
        return Epoch(int(given), "env")
    if info.commit:
        with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
            git = ["git", "-C", str(info.path), "log", "-1", "--format=%ct", "--end-of-options", info.commit]
            out = run_captured(git, timeout=QUERY_TIMEOUT).checked().strip()
            return Epoch(int(out), f"commit {info.commit[:12]}")
    # a .dsc, or a tree unpacked from one (dpkg-source -x): the same time either way, so a
    # rebuild of the tree at another path stamps its wheel as the .dsc's build did
    if info.kind in ("dsc", "dir"):
        seconds = _changelog_time(info.path)
        if seconds is not None:
            return Epoch(seconds, "debian/changelog")
    if info.kind == "tarball" and info.url and Path(info.url).is_file():
        seconds = _newest_member(Path(info.url))
        if seconds is not None:
            return Epoch(seconds, f"archive {Path(info.url).name}")
    return Epoch(PLAIN_TREE_EPOCH, PLAIN_TREE)


def _changelog_time(tree: Path) -> int | None:
    """The date of debian/changelog's newest entry (its first trailer line, ` -- Name <mail>  DATE`),
    as dpkg-parsechangelog -STimestamp gives it; read here, so the host needs no dpkg-dev."""
    try:
        with (tree / "debian" / "changelog").open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(" -- ") and "  " in line[4:]:
                    return int(email.utils.parsedate_to_datetime(line[4:].split("  ", 1)[1].strip()).timestamp())
    except (OSError, ValueError, TypeError, IndexError):
        return None
    return None


def _newest_member(archive: Path) -> int | None:
    try:
        with tarfile.open(archive) as tar:
            return max((int(m.mtime) for m in tar), default=None)
    except (tarfile.TarError, OSError, EOFError, ValueError):
        return None


# --------------------------------------------------------------------------- the canonical zip


def zip_time(epoch: int) -> tuple[int, int, int, int, int, int]:
    """The member timestamp for SOURCE_DATE_EPOCH (UTC, even seconds, not before 1980)."""
    t = time.gmtime(max(epoch, ZIP_EPOCH))
    return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec - t.tm_sec % 2)


def _mode(info: zipfile.ZipInfo) -> int:
    if info.is_dir():
        return stat.S_IFDIR | 0o755
    unix = info.external_attr >> 16
    return stat.S_IFREG | (0o755 if unix & 0o111 else 0o644)


def canonical_order(names: Sequence[str]) -> list[str]:
    """Payload first, sorted; then the .dist-info members, sorted, RECORD last (as `wheel` writes
    them: installers read the metadata from the end)."""

    def key(name: str) -> tuple[int, str]:
        top = name.split("/", 1)[0]
        if top.endswith(".dist-info"):
            return (2, name) if name == f"{top}/RECORD" else (1, name)
        return (0, name)

    return sorted(names, key=key)


def _is_canonical(infos: Sequence[zipfile.ZipInfo], when: tuple[int, ...]) -> bool:
    names = [i.filename for i in infos]
    return names == canonical_order(names) and all(
        i.date_time == when
        and i.external_attr == _mode(i) << 16
        and i.create_system == 3
        and not i.extra
        and not i.comment
        and i.compress_type == zipfile.ZIP_DEFLATED
        for i in infos
    )


def normalize_wheel(wheel: Path, epoch: int) -> bool:
    """Rewrite the wheel in canonical form (in place, atomically); False when it already was.
    Contents are untouched, so RECORD's hashes stay true."""
    when = zip_time(epoch)
    with named_os_errors(wheel, "normalizing the wheel"), _open_wheel(wheel) as src:
        infos = src.infolist()
        if _is_canonical(infos, when):
            return False
        by_name = {i.filename: i for i in infos}
        mode = stat.S_IMODE(wheel.stat().st_mode)
        with (
            atomic_writer(wheel, mode=mode) as f,
            zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED, compresslevel=DEFLATE_LEVEL) as dst,
        ):
            for name in canonical_order(list(by_name)):
                old = by_name[name]
                new = zipfile.ZipInfo(name, date_time=when)
                new.create_system = 3
                new.external_attr = _mode(old) << 16
                new.compress_type = zipfile.ZIP_DEFLATED
                with src.open(old) as data, dst.open(new, "w") as out:
                    shutil.copyfileobj(data, out, 1 << 20)
    return True


# what a zip archive that is damaged or not a wheel raises while read: a truncated or corrupt
# archive, a bad CRC, a member name that is not the UTF-8 its flag says, an encrypted member, a
# compression method Python lacks
_DAMAGED = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, NotImplementedError, RuntimeError)


def check_member_count(wheel: Path) -> None:
    """WheelError when the archive's end record announces more than MEMBERS_LIMIT members: read
    before zipfile parses the central directory into memory (some 300 bytes a member). Nothing
    when there is no such record: opening the archive then says what it is."""
    end_record = getattr(zipfile, "_EndRecData", None)  # the stdlib's own reader of that record
    if end_record is None:
        return
    with named_os_errors(wheel, "reading the wheel"), wheel.open("rb") as f:
        try:
            record = end_record(f)
        except (*_DAMAGED, struct.error):
            return
    count = record[getattr(zipfile, "_ECD_ENTRIES_TOTAL", 4)] if record else 0
    if count > MEMBERS_LIMIT:
        raise WheelError(
            f"{wheel} has {count} members, more than the {MEMBERS_LIMIT} torchbuild compares",
            hint="give a wheel that pip wrote (a torch wheel has about 15,000 members)",
        )


@contextlib.contextmanager
def _open_wheel(wheel: Path) -> Iterator[zipfile.ZipFile]:
    check_member_count(wheel)
    try:
        archive = zipfile.ZipFile(wheel)
    except _DAMAGED as exc:
        raise WheelError(f"{wheel} is not a zip archive ({exc})", hint="give a wheel that pip wrote") from exc
    with archive:
        yield archive


# --------------------------------------------------------------------------- comparing two wheels


@dataclasses.dataclass(frozen=True)
class MemberDifference:
    name: str
    what: str  # "only in A", "only in B", "content", "timestamp", "mode", "compression", "position"
    a: str
    b: str


@dataclasses.dataclass(frozen=True)
class WheelDiff:
    a_sha256: str
    b_sha256: str
    members: tuple[MemberDifference, ...]

    @property
    def identical(self) -> bool:
        return self.a_sha256 == self.b_sha256


def _members(archive: zipfile.ZipFile, wheel: Path) -> dict[str, zipfile.ZipInfo]:
    """The archive's members by name; WheelError when there are more than MEMBERS_LIMIT (an end
    record that understates them) or one says it holds more than MEMBER_LIMIT bytes (nothing is
    decompressed before this check)."""
    from torchbuild.core.console import printable

    infos = archive.infolist()
    if len(infos) > MEMBERS_LIMIT:
        raise WheelError(
            f"{wheel} has {len(infos)} members, more than the {MEMBERS_LIMIT} torchbuild compares",
            hint="give a wheel that pip wrote (a torch wheel has about 15,000 members)",
        )
    for info in infos:
        if info.file_size > MEMBER_LIMIT:
            raise WheelError(
                f"{wheel}: member {printable(info.filename)} is {info.file_size} bytes uncompressed, more than the "
                f"{MEMBER_LIMIT // 2**20} MiB torchbuild compares",
                hint="give a wheel that pip wrote; this member is far larger than any torch library",
            )
    return {i.filename: i for i in infos}


def _digest(archive: zipfile.ZipFile, info: zipfile.ZipInfo, wheel: Path) -> str:
    """sha256 of the member's uncompressed bytes (streamed; zipfile stops at its recorded size);
    WheelError naming the wheel and member when it cannot be read (bad CRC, corrupt data)."""
    from torchbuild.core.console import printable

    h = hashlib.sha256()
    try:
        with archive.open(info) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except _DAMAGED as exc:
        raise WheelError(
            f"{wheel}: member {printable(info.filename)} cannot be read ({exc}): the wheel is damaged",
            hint="build or download the wheel again; `unzip -t` shows every damaged member",
        ) from exc
    return h.hexdigest()


def diff_wheels(a: Path, b: Path) -> WheelDiff:
    """Whether two wheels are byte-identical and, if not, each member that differs: present in
    one only, other content (sha256 of the uncompressed bytes), or the same content with another
    timestamp, mode, compression or place in the archive."""
    with named_os_errors(a, "reading the wheel"), named_os_errors(b, "reading the wheel"):
        sa, sb = sha256_file(a), sha256_file(b)
        if sa == sb:
            return WheelDiff(sa, sb, ())
        with _open_wheel(a) as za, _open_wheel(b) as zb:
            ia, ib = _members(za, a), _members(zb, b)
            _check_inflate(ia, ib, a, b)
            # each shared member's place among the shared members (a dict: one look-up per name)
            place_a = {n: i for i, n in enumerate(n for n in ia if n in ib)}
            place_b = {n: i for i, n in enumerate(n for n in ib if n in ia)}
            found: list[MemberDifference] = []
            for name in sorted(set(ia) | set(ib)):
                if name not in ib:
                    found.append(MemberDifference(name, "only in A", f"{ia[name].file_size} bytes", ""))
                    continue
                if name not in ia:
                    found.append(MemberDifference(name, "only in B", "", f"{ib[name].file_size} bytes"))
                    continue
                x, y = ia[name], ib[name]
                if x.CRC != y.CRC or x.file_size != y.file_size or _digest(za, x, a) != _digest(zb, y, b):
                    found.append(MemberDifference(name, "content", f"{x.file_size} bytes", f"{y.file_size} bytes"))
                if x.date_time != y.date_time:
                    found.append(MemberDifference(name, "timestamp", _stamp(x), _stamp(y)))
                if x.external_attr >> 16 != y.external_attr >> 16:
                    found.append(MemberDifference(name, "mode", oct(x.external_attr >> 16), oct(y.external_attr >> 16)))
                if x.compress_type != y.compress_type:
                    found.append(MemberDifference(name, "compression", str(x.compress_type), str(y.compress_type)))
                if place_a[name] != place_b[name]:
                    found.append(MemberDifference(name, "position", str(place_a[name]), str(place_b[name])))
    return WheelDiff(sa, sb, tuple(found))


def _check_inflate(ia: dict[str, zipfile.ZipInfo], ib: dict[str, zipfile.ZipInfo], a: Path, b: Path) -> None:
    """WheelError when comparing the members both wheels hold with the same size and CRC would
    inflate more than DIFF_INFLATE_LIMIT, or more than INFLATE_RATIO times a wheel's size."""
    same = [(ia[n], ib[n]) for n in ia if n in ib and ia[n].CRC == ib[n].CRC and ia[n].file_size == ib[n].file_size]
    per_wheel = [sum(x.file_size for x, _ in same), sum(y.file_size for _, y in same)]
    total = sum(per_wheel)
    hint = "compare wheels that pip or `invoke build` wrote; these declare far more content than any torch wheel"
    if total > DIFF_INFLATE_LIMIT:
        raise WheelError(
            f"comparing {a.name} and {b.name} would inflate {total / 2**30:.1f} GiB, more than the "
            f"{DIFF_INFLATE_LIMIT // 2**30} GiB torchbuild inflates for a diff",
            hint=hint,
        )
    for wheel, inflated in zip((a, b), per_wheel):
        size = max(wheel.stat().st_size, 1)
        if inflated > INFLATE_FLOOR and inflated > INFLATE_RATIO * size:
            raise WheelError(
                f"{wheel} would inflate to {inflated / 2**20:.0f} MiB, {inflated // size} times its "
                f"{size / 2**20:.1f} MiB (torchbuild inflates at most {INFLATE_RATIO} times a wheel's size)",
                hint=hint,
            )


def _stamp(info: zipfile.ZipInfo) -> str:
    y, mo, d, h, mi, s = info.date_time
    return f"{y:04d}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}"


def describe(diff: WheelDiff, a: Path, b: Path) -> str:
    """The comparison for people: one line when identical, else a table of the members."""
    from torchbuild.core.console import printable, table

    if diff.identical:
        return f"identical: {printable(a.name)} and {printable(b.name)} (sha256 {diff.a_sha256})"
    head = f"different: {printable(a)} (sha256 {diff.a_sha256[:16]}) and {printable(b)} (sha256 {diff.b_sha256[:16]})"
    if not diff.members:
        return head + "\nevery member has the same name, content, timestamp and mode: the zip's own layout differs"
    rows = [(m.name, m.what, m.a, m.b) for m in diff.members]
    names = len({m.name for m in diff.members})
    return f"{head}\n{table(('member', 'differs in', 'A', 'B'), rows)}\n{names} member{'s' if names > 1 else ''} differ"
