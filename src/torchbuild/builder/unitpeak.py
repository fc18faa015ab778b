"""Each compile's peak memory and time, measured where ccache runs the compiler.

`unitpeak.py COMPILER ARGS...` runs the compiler (ccache hands it over as its prefix_command,
CCACHE_PREFIX, so only real compiles pass here, never cache hits, and ninja's commands stay as
they were: a build measured from its middle rebuilds nothing), waits for it with wait4, and
appends one line to the record $TORCHBUILD_UNITS_RECORD names: peak RSS in KiB, seconds, the
source file and the object file. ccache looks each word of CCACHE_PREFIX up as a program of
its own (no arguments), so the build writes a one-line launcher (launcher()) that ccache runs. The record lives in the build tree, so a build cut and resumed adds to the
same one; builder/step.py reads it back for the report's heaviest units and for the heavy pool's
plans (inputs.jobs.record_unit_peaks).

It starts with -S and imports only the standard library: it runs once per compile, and its
start-up is the whole overhead (about 15 ms against seconds per unit). GNU time would do the
same but is not in every image; psutil would measure from outside, too late for a peak.
"""

from __future__ import annotations

import os
import sys
import time

SOURCES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".C", ".c++")


def _source_and_object(args: list[str]) -> tuple[str, str]:
    obj = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "-o"), "")
    src = next((a for a in reversed(args) if a.endswith(SOURCES) and not a.startswith("-")), "")
    return src, obj


def _status(code: int) -> int:
    """The compiler's exit as a shell would report it (128+N for a signal: OOM kills stay 137)."""
    if os.WIFSIGNALED(code):
        return 128 + os.WTERMSIG(code)
    return os.WEXITSTATUS(code)


RECORD_VARIABLE = "TORCHBUILD_UNITS_RECORD"


def main(argv: list[str]) -> int:
    record, command = os.environ.get(RECORD_VARIABLE, ""), argv[1:]
    if not command:
        print("usage: unitpeak.py COMPILER [ARGS...] (the record in $TORCHBUILD_UNITS_RECORD)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        pid = os.posix_spawnp(command[0], command, os.environ)
    except OSError as exc:
        print(f"unitpeak: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    try:
        _, code, usage = os.wait4(pid, 0)
    except KeyboardInterrupt:  # the build was interrupted: the compiler got the signal too
        return 130
    src, obj = _source_and_object(command[1:])
    src = os.path.abspath(src) if src else ""  # ccache makes paths under CCACHE_BASEDIR relative
    line = f"{usage.ru_maxrss}\t{time.monotonic() - t0:.2f}\t{src}\t{obj}\n"
    if not record:
        return _status(code)
    try:  # one write with O_APPEND: lines of parallel compiles never interleave
        fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode(errors="replace"))
        finally:
            os.close(fd)
    except OSError:
        pass  # a measurement lost never fails the compile
    return _status(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv))


# --------------------------------------------------------------------------- reading it back


def launcher(directory: str, record: str) -> dict[str, str] | None:
    """Write directory/torchbuild-unitpeak, a launcher of this module that ccache can run, and
    return the environment that measures each compile into record (CCACHE_PREFIX and the record's
    variable); None where ccache could not run it (it splits CCACHE_PREFIX at whitespace)."""
    path = os.path.join(directory, "torchbuild-unitpeak")
    parts = [sys.executable, os.path.abspath(__file__), path]
    if any(not p or any(c.isspace() for c in p) for p in parts):
        return None
    # one interpreter argument: Linux passes the rest of a #! line as a single word
    text = f"#!{parts[0]} -IS\nimport runpy\nrunpy.run_path({parts[1]!r}, run_name='__main__')\n"
    try:
        os.makedirs(directory, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    except OSError:
        return None
    return {"CCACHE_PREFIX": path, RECORD_VARIABLE: os.path.abspath(record)}


def read_record(record: str, tree: str, limit: int = 64 * 2**20) -> dict[str, tuple[int, float]]:
    """{source relative to tree: (peak RSS in bytes, seconds)} from a record, the largest peak
    of each unit (one compiled again after an out-of-memory kill counts once)."""
    from torchbuild.core.safeio import read_bytes

    units: dict[str, tuple[int, float]] = {}
    try:
        text = read_bytes(record, limit, "reading the units' peaks").decode(errors="replace")
    except Exception:  # a record that cannot be read leaves the report without the heaviest units
        return units
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 4 or not parts[0].isdigit() or not parts[2]:
            continue
        try:
            seconds = float(parts[1])
        except ValueError:
            continue
        rel = os.path.relpath(parts[2], tree) if os.path.isabs(parts[2]) else parts[2]
        peak = int(parts[0]) * 1024
        if peak > units.get(rel, (0, 0.0))[0]:
            units[rel] = (peak, seconds)
    return units


def heaviest(units: dict[str, tuple[int, float]], top: int = 10) -> list[dict[str, object]]:
    """The top units by peak memory: [{"file", "peak_rss_bytes", "seconds"}] (the canaries' shape)."""
    rows = sorted(units.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
    return [{"file": f, "peak_rss_bytes": peak, "seconds": secs} for f, (peak, secs) in rows]
