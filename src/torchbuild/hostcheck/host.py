"""`invoke host-check`: is this machine set up for stable benchmark numbers?

What torchbench's ``torchbenchmark/util/machine_config.py`` and Quansight's from-source guide
care about, one row each, with a verdict (``ready``, ``not ready``, ``unknown``) and the fix:

- from pyperf (``python -m pyperf system show``, PYPERF_SHOW): the CPU scaling governor,
  turbo boost, isolated CPUs (pyperf's ``Linux scheduler``), and every other operation pyperf
  checks (perf event sample rate, ASLR, CPU frequency, IRQ affinity, power supply, nohz_full
  with intel_pstate), each as pyperf says: its advice makes a row not ready;
- added here, as pyperf has no row for them: SMT (off, forced off or not supported; or no
  sibling online, what torchbench's ``set_hyper_threading`` leaves: ``control`` stays ``on``
  with ``active`` 0), the C-state limit (the guide's ``intel_idle.max_cstate=1``, or
  ``processor.max_cstate=1``/``idle=poll``/``halt``, or intel_idle's ``max_cstate`` <= 1),
  acpi-cpufreq's ``cpufreq/boost`` (AMD's turbo, which pyperf does not read), and per NVIDIA GPU
  persistence mode and locked graphics clocks (through ``nvidia-smi``).

Why pyperf's CLI and not its module: ``pyperf system`` is documented as a command; the code
behind it is ``pyperf._system`` (private by its name: no API promise), prints its report and
calls ``sys.exit``. So the command runs through core/process.py (run_command) and its report
is parsed (parse_pyperf: titled sections of ``Operation: message`` lines). pyperf reads this
machine's /sys and /proc only, so with a ``root`` other than ``/`` it runs only when a runner
is passed (tests pass one with a report); otherwise its rows say it was not queried.

The C-state limit and isolated CPUs are boot-time settings (``Setting.boot_time``): their
``fix`` is the words to add to the kernel command line, and ``--apply`` never touches them.

``apply`` (root only) makes the runtime changes (governor, turbo, SMT, perf event sample
rate, GPU persistence and clocks). Before changing anything it saves the previous values to a JSON state file (written
atomically); a write that fails half-way puts back what was already changed and raises
``HostSetupFailed`` naming the file. ``restore`` puts the saved values back, byte for byte, and
removes the state file. Why not ``pyperf system tune``/``reset``: reset is no restore. It
writes ``powersave`` whatever the governor was (on acpi-cpufreq or amd-pstate hosts, whose
default is schedutil or ondemand, powersave holds the lowest frequency), sets every CPU's
minimum frequency to the hardware minimum and starts irqbalance whether or not it ran before;
it saves nothing, so a tune that fails half-way is not undone; and neither touches SMT.

Every /sys and /proc path read or written here is under ``root`` (``/`` by default), so tests
use a fake tree. Its symlinks are resolved as if ``root`` were ``/`` (an absolute target is
root's own path, ``..`` stops at root) and each component is opened with O_NOFOLLOW, so nothing
outside root is read, recorded in the state file or written. Reading never raises: a file that
is missing, unreadable or odd (a FIFO, a directory, more than SETTING_LIMIT) gives ``unknown``.

GPU rows: ``nvidia-smi`` cannot read back a clock lock made with ``-lgc`` (NVML has no getter
for it). The clocks row is ``ready`` only when the state file says this tool locked that GPU's
clocks during the current boot (the state records ``/proc/sys/kernel/random/boot_id``);
otherwise it is ``unknown`` with the applications and maximum clocks and the ``-lgc`` command.
nvidia-smi reports this machine's GPUs whatever ``root`` is, so with a ``root`` other than ``/``
the GPUs are queried only when a runner is passed explicitly (tests pass a fake one): a
``--root /mnt/image --apply`` never locks the clocks of the live GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from torchbuild.core.atomic import atomic_write_bytes
from torchbuild.core.console import table
from torchbuild.core.dirs import make_dirs
from torchbuild.core.errors import HostSetupFailed, PathError, StrPath, TorchbuildError
from torchbuild.core.process import run_captured
from torchbuild.core.safeio import STATE_LIMIT, KiB, loads_json, read_bytes

READY = "ready"
NOT_READY = "not ready"
UNKNOWN = "unknown"
VERDICTS = (READY, NOT_READY, UNKNOWN)

# the rows every report has (GPU rows are added after them: "gpu", or "gpu N persistence" and
# "gpu N clocks" per GPU)
GOVERNOR = "cpu governor"
TURBO = "turbo boost"
SMT = "smt"
CSTATES = "c-states"
ISOLATED = "isolated cpus"
GPU = "gpu"
PERF_EVENT = "perf event"  # pyperf's row, which --apply sets too
CPU_SETTINGS = (GOVERNOR, TURBO, SMT, CSTATES, ISOLATED)
APPLIED = (GOVERNOR, TURBO, SMT, PERF_EVENT)  # the CPU rows --apply sets (and the GPU ones)

STATE_SCHEMA = "torchbuild.host-state"
STATE_VERSION = 1
DEFAULT_STATE = "var/lib/torchbuild/host-state.json"  # under root

CPU_DIR = "/sys/devices/system/cpu"
NO_TURBO = f"{CPU_DIR}/intel_pstate/no_turbo"
BOOST = f"{CPU_DIR}/cpufreq/boost"
SMT_CONTROL = f"{CPU_DIR}/smt/control"
SMT_ACTIVE = f"{CPU_DIR}/smt/active"
CPUIDLE_DRIVER = f"{CPU_DIR}/cpuidle/current_driver"
INTEL_IDLE_MAX_CSTATE = "/sys/module/intel_idle/parameters/max_cstate"
CMDLINE = "/proc/cmdline"
# pyperf advises 1 (the kernel profiler's interrupts kept to the least); --apply writes it
PERF_RATE = "/proc/sys/kernel/perf_event_max_sample_rate"
BOOT_ID = "/proc/sys/kernel/random/boot_id"

# The C-state limit to add at boot. Quansight's guide (the seed): `intel_idle.max_cstate=1` in
# GRUB_CMDLINE_LINUX_DEFAULT, which keeps the intel_idle driver and its C1. The advice here had
# been `intel_idle.max_cstate=0 processor.max_cstate=1` (intel_idle off, acpi_idle held to C1),
# with no reason given for differing: it is the guide's now. Where the cpuidle driver is
# acpi_idle (AMD CPUs, or Intel ones intel_idle does not know), intel_idle's parameter does
# nothing and processor.max_cstate=1 is the limit that applies.
CSTATE_WORDS = "intel_idle.max_cstate=1"
ACPI_CSTATE_WORDS = "processor.max_cstate=1"
GRUB_KEY = "GRUB_CMDLINE_LINUX_DEFAULT"
GPU_QUERY = (
    "nvidia-smi",
    "--query-gpu=index,persistence_mode,clocks.applications.graphics,clocks.max.graphics,name",
    "--format=csv,noheader,nounits",
)
# pyperf's report (see the module's docstring: its CLI, not its private module)
PYPERF_SHOW = (sys.executable, "-m", "pyperf", "system", "show")
PYPERF_SECTIONS = {"System state": "state", "Advices": "advice", "Warnings": "warning", "Errors": "error"}
PYPERF_NAMES = {
    "CPU scaling governor": GOVERNOR,
    "Turbo Boost (intel_pstate)": TURBO,
    "Turbo Boost (MSR)": TURBO,
    "Linux scheduler": ISOLATED,
}
PYPERF_SKIPPED = ("CPU", "ERROR", "WARNING")  # the CPUs it looked at; lines of no operation
NO_GOVERNOR = "pyperf shows no CPU scaling governor (no cpufreq driver: a VM?)"
COMMAND_TIMEOUT = 60
# a /sys or /proc value is a line (a CPU list of thousands of CPUs is a few KiB)
SETTING_LIMIT = 64 * KiB
# CPU ids are below this (the kernel's NR_CPUS is at most 8192)
MAX_CPUS = 16384
# symlinks followed in one path before ELOOP, as the kernel's own limit
MAX_SYMLINKS = 40


@dataclasses.dataclass(frozen=True)
class Setting:
    """One row of the report. fix: the command that makes it ready (empty when ready); for a
    boot_time setting, the words to add to the kernel command line (then reboot)."""

    name: str
    value: str
    verdict: str
    fix: str
    boot_time: bool = False


@dataclasses.dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str = ""


Runner = Callable[[Sequence[str]], CommandResult]


def run_command(argv: Sequence[str]) -> CommandResult:
    """Run argv (an argument list, never a shell string); 127 when the program is not on PATH,
    124 when it outlives COMMAND_TIMEOUT. Never raises."""
    exe = shutil.which(argv[0])
    if exe is None:
        return CommandResult(127, "", f"{argv[0]}: not found on PATH")
    try:
        proc = run_captured([exe, *argv[1:]], timeout=COMMAND_TIMEOUT)
    except OSError as exc:
        return CommandResult(126, "", f"{argv[0]}: {exc.strerror or exc}")
    if proc.returncode is None:
        return CommandResult(124, "", f"{argv[0]}: no answer in {COMMAND_TIMEOUT} s")
    return CommandResult(proc.returncode, proc.stdout, proc.stderr)


def is_root() -> bool:
    """Whether this process may change the host's settings (the effective uid is 0)."""
    return os.geteuid() == 0


# --------------------------------------------------------------------------- reading


def _under(root: Path, system_path: str) -> Path:
    """system_path (/sys/..., /proc/...) inside root, as written (for messages; the files are
    opened through _open_in_root)."""
    return root / system_path.lstrip("/")


def _components(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _resolve(root: Path, system_path: str) -> list[str]:
    """system_path's components under root with every symlink resolved as if root were `/`
    (chroot semantics): an absolute target starts again at root, `..` stops at root, so no
    symlink leads out of root. What does not exist (yet) is kept as named. OSError (ELOOP)
    after MAX_SYMLINKS symlinks, as the kernel gives up."""
    todo = _components(system_path)[::-1]  # a stack: the next component last
    parts: list[str] = []
    links = 0
    while todo:
        name = todo.pop()
        if name == "..":
            if parts:
                parts.pop()
            continue
        here = root.joinpath(*parts, name)
        try:
            is_link = stat.S_ISLNK(os.lstat(here).st_mode)
        except OSError:
            is_link = False
        if not is_link:
            parts.append(name)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(_under(root, system_path)))
        target = os.readlink(here)
        if target.startswith("/"):
            parts = []
        todo.extend(_components(target)[::-1])
    return parts


def _open_in_root(root: Path, system_path: str, flags: int) -> int:
    """A file descriptor for system_path inside root (see _resolve: no symlink leads out of
    root). Each component is opened relative to its directory with O_NOFOLLOW, so a symlink
    put in its place meanwhile fails (ELOOP) instead of being followed. OSError otherwise."""
    parts = _resolve(root, system_path)
    walk = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
    fd = os.open(root, walk)
    try:
        for name in parts[:-1]:
            below = os.open(name, walk | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = below
        return os.open(parts[-1] if parts else ".", flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


def _read_bytes(root: Path, system_path: str) -> bytes | None:
    """The regular file's bytes (at most SETTING_LIMIT), None when it is missing, unreadable,
    larger, or not a regular file (a FIFO or device is never opened for long: O_NONBLOCK)."""
    try:
        fd = _open_in_root(root, system_path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        total = 0
        while total <= SETTING_LIMIT:
            chunk = os.read(fd, SETTING_LIMIT + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks) if total <= SETTING_LIMIT else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _read(root: Path, system_path: str) -> str | None:
    """The file's text, stripped; None when it is missing, unreadable or not text."""
    data = _read_bytes(root, system_path)
    try:
        return data.decode("ascii").strip() if data is not None else None
    except UnicodeDecodeError:
        return None


def _read_exact(root: Path, system_path: str) -> str | None:
    """The file's exact bytes as a JSON-safe str (surrogateescape), None when unreadable."""
    data = _read_bytes(root, system_path)
    return data.decode("utf-8", "surrogateescape") if data is not None else None


def parse_cpulist(text: str) -> list[int] | None:
    """The kernel's CPU list format ("0-3,8,10-11") as sorted ids; None when it is not one,
    or names a CPU id of MAX_CPUS or more (no kernel has that many: `0-400000000` is no list)."""
    cpus: set[int] = set()
    for chunk in text.strip().split(","):
        chunk = chunk.strip()
        if not chunk:
            continue
        m = re.fullmatch(r"(\d{1,9})(?:-(\d{1,9}))?(?::\d{1,9}/\d{1,9})?", chunk)
        if m is None:
            return None
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if last < first or last >= MAX_CPUS:
            return None
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Sorted ids as the kernel's CPU list format: [0, 1, 2, 5] -> "0-2,5"."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def online_cpus(root: Path) -> list[int]:
    """The online CPUs: /sys/devices/system/cpu/online, else the cpuN directories whose
    `online` file does not say 0. Empty when neither is readable."""
    text = _read(root, f"{CPU_DIR}/online")
    listed = parse_cpulist(text) if text else None
    if listed:
        return listed
    found: list[int] = []
    try:
        fd = _open_in_root(root, CPU_DIR, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return []
    try:
        names = os.listdir(fd)
    except OSError:
        return []
    finally:
        os.close(fd)
    for name in names:
        m = re.fullmatch(r"cpu(\d{1,9})", name)
        if m and int(m.group(1)) < MAX_CPUS and _read(root, f"{CPU_DIR}/{name}/online") != "0":
            found.append(int(m.group(1)))
    return sorted(found)


def _cmdline(root: Path) -> list[str] | None:
    text = _read(root, CMDLINE)
    if text is None:
        return None
    words = text.split()
    # the words after a lone "--" go to init, not to the kernel
    return words[: words.index("--")] if "--" in words else words


def _param(words: Sequence[str], key: str) -> str | None:
    """The value of the last key=value word (the kernel keeps the last one), None when absent."""
    value = None
    for word in words:
        if word.startswith(f"{key}="):
            value = word.split("=", 1)[1]
    return value


def _governor_file(cpu: int) -> str:
    return f"{CPU_DIR}/cpu{cpu}/cpufreq/scaling_governor"


def _check_smt(root: Path) -> Setting:
    control, active = _read(root, SMT_CONTROL), _read(root, SMT_ACTIVE)
    fix = f"echo off | sudo tee {SMT_CONTROL}"
    if control is None:
        if active == "0":
            return Setting(SMT, "inactive (smt/active=0, no smt/control)", READY, "")
        return Setting(SMT, "no smt/control (kernel without SMT control)", UNKNOWN, "disable SMT in the firmware")
    value = f"{control} (active={active if active is not None else '?'})"
    if control in ("off", "forceoff", "notsupported"):
        return Setting(SMT, value, READY, "")
    if control == "on":
        # control stays "on" when the siblings were taken offline one by one (torchbench's way)
        return Setting(SMT, value, READY, "") if active == "0" else Setting(SMT, value, NOT_READY, fix)
    return Setting(SMT, value, UNKNOWN, "disable SMT in the firmware")


def _check_cstates(root: Path) -> Setting:
    words = _cmdline(root)
    limits: list[str] = []
    if words is not None:
        for key, most in (("intel_idle.max_cstate", 1), ("processor.max_cstate", 1)):
            value = _param(words, key)
            if value is not None and value.isdigit() and int(value) <= most:
                limits.append(f"{key}={value}")
        idle = _param(words, "idle")
        if idle in ("poll", "halt"):
            limits.append(f"idle={idle}")
    param = _read(root, INTEL_IDLE_MAX_CSTATE)
    driver = _read(root, CPUIDLE_DRIVER)
    fix = ACPI_CSTATE_WORDS if driver == "acpi_idle" else CSTATE_WORDS
    if limits:
        return Setting(CSTATES, f"limited: {' '.join(limits)} on the kernel command line", READY, "", True)
    if param is not None and param.lstrip("-").isdigit() and int(param) <= 1:
        return Setting(CSTATES, f"limited: intel_idle max_cstate={param}", READY, "", True)
    if words is None and param is None:
        return Setting(CSTATES, f"{CMDLINE} unreadable", UNKNOWN, fix, True)
    facts = [f"cpuidle driver {driver}"] if driver else []
    if param is not None:
        facts.append(f"intel_idle max_cstate={param}")
    return Setting(CSTATES, "no limit" + (f" ({', '.join(facts)})" if facts else ""), NOT_READY, fix, True)


def isolation_words(cpus: Sequence[int]) -> str:
    """The kernel command-line words that isolate the last half of cpus ("" for fewer than 2):
    the guide's isolcpus= with the rcu_nocbs= pyperf advises beside it (not nohz_full=, which
    pyperf flags as incompatible with intel_pstate)."""
    if len(cpus) < 2:
        return ""
    chosen = format_cpulist(sorted(cpus)[len(cpus) // 2 :])
    return f"isolcpus={chosen} rcu_nocbs={chosen}"


# --------------------------------------------------------------------------- pyperf's rows


@dataclasses.dataclass
class _Said:
    """What `pyperf system show` said about one of its operations, by section."""

    state: list[str] = dataclasses.field(default_factory=list)
    advice: list[str] = dataclasses.field(default_factory=list)
    warning: list[str] = dataclasses.field(default_factory=list)
    error: list[str] = dataclasses.field(default_factory=list)


def parse_pyperf(text: str) -> dict[str, _Said]:
    """`pyperf system show`'s report as {operation: what it said}, in pyperf's order. Its
    sections are titles underlined with `=` (PYPERF_SECTIONS); each line is `Operation: message`
    (an operation's name holds no `: `). Lines of no operation (`ERROR: ...`) are kept under
    their first word."""
    said: dict[str, _Said] = {}
    lines = text.splitlines()
    section = None
    for i, line in enumerate(lines):
        underlined = i + 1 < len(lines) and lines[i + 1].startswith("===")
        if underlined:
            section = PYPERF_SECTIONS.get(line.strip())
            continue
        operation, sep, message = line.partition(": ")
        if section is None or not sep or line.startswith("==="):
            continue
        getattr(said.setdefault(operation.strip(), _Said()), section).append(message.strip())
    return said


def _pyperf_row(name: str, said: _Said) -> Setting:
    """One of pyperf's operations as a row: its advice makes it not ready (the value its state,
    or, with none, its first advice: nohz_full's warning), an error with no state unknown; its
    errors and warnings are added to the value."""
    notes = [*said.error, *said.warning]
    value = "; ".join(said.state) + (f" (pyperf: {'; '.join(notes)})" if said.state and notes else "")
    if said.advice:
        advice = said.advice if said.state else said.advice[1:]
        return Setting(name, value or said.advice[0], NOT_READY, "; ".join(advice))
    if not said.state:
        return Setting(name, "; ".join(notes) or "pyperf shows nothing", UNKNOWN, "")
    return Setting(name, value, READY, "")


def _isolated_row(root: Path, said: _Said | None) -> Setting:
    """pyperf's `Linux scheduler` as the isolated-cpus row (boot-time); the fix names the last
    half of the online CPUs (isolation_words) where pyperf says `isolcpus=<cpu list>`."""
    states = said.state if said is not None else []
    isolated = [s for s in states if s.startswith("Isolated CPUs")]
    if isolated:
        return Setting(ISOLATED, "; ".join(states) + "; run benchmarks on them with taskset", READY, "", True)
    cpus = online_cpus(root)
    if len(cpus) == 1:
        return Setting(ISOLATED, "none (one CPU online: nothing to isolate)", NOT_READY, "", True)
    if not states:
        return Setting(ISOLATED, "pyperf shows no Linux scheduler state", UNKNOWN, isolation_words(cpus), True)
    return Setting(ISOLATED, "; ".join(states), NOT_READY, isolation_words(cpus), True)


def _boost_row(root: Path) -> Setting:
    """Turbo where pyperf has no row for it: acpi-cpufreq's (AMD's) cpufreq/boost, which pyperf
    does not read (it asks intel_pstate, else Intel's MSR)."""
    boost = _read(root, BOOST)
    if boost in ("0", "1"):
        on = boost == "1"
        fix = f"echo 0 | sudo tee {BOOST}" if on else ""
        return Setting(TURBO, f"{'on' if on else 'off'} (cpufreq boost={boost})", NOT_READY if on else READY, fix)
    if boost is not None:
        return Setting(TURBO, f"cpufreq boost={boost!r}", UNKNOWN, f"echo 0 | sudo tee {BOOST}")
    return Setting(TURBO, "pyperf shows no Turbo Boost state, and there is no cpufreq/boost", UNKNOWN, "")


def _turbo_row(root: Path, said: _Said | None) -> Setting:
    """pyperf's turbo row, unless it shows no state and acpi-cpufreq's boost file says one."""
    if said is not None and (said.state or _read(root, BOOST) is None):
        return _pyperf_row(TURBO, said)
    return _boost_row(root)


def _pyperf_rows(root: Path, runner: Runner | None) -> tuple[list[Setting], list[Setting]]:
    """(the governor, turbo and isolated-cpus rows; pyperf's other rows) from `pyperf system
    show` (PYPERF_SHOW), run for root `/` or through the runner given."""
    run = runner if runner is not None else (run_command if root.resolve() == Path("/") else None)
    if run is None:
        why = f"not queried: pyperf reads this machine's /sys and /proc, not those of {root}"
        return [Setting(GOVERNOR, why, UNKNOWN, ""), _boost_row(root), _isolated_row(root, None)], []
    res = run(list(PYPERF_SHOW))
    said = parse_pyperf(res.stdout)
    if not said:
        lines = (res.stderr.strip() or res.stdout.strip() or f"exit status {res.returncode}").splitlines()
        why = f"`pyperf system show` said nothing to read ({lines[-1]})"
        return [Setting(GOVERNOR, why, UNKNOWN, ""), _boost_row(root), _isolated_row(root, None)], []
    named = {op: said.pop(op) for op in list(said) if op in PYPERF_NAMES}
    by_name = {PYPERF_NAMES[op]: s for op, s in named.items()}
    governor = by_name.get(GOVERNOR)
    rows = [
        _pyperf_row(GOVERNOR, governor) if governor else Setting(GOVERNOR, NO_GOVERNOR, UNKNOWN, ""),
        _turbo_row(root, by_name.get(TURBO)),
        _isolated_row(root, by_name.get(ISOLATED)),
    ]
    # lower case as the other rows; pyperf's "Check nohz_full" is the "nohz_full" row
    others = [_pyperf_row(op.lower().removeprefix("check "), s) for op, s in said.items() if op not in PYPERF_SKIPPED]
    return rows, others


# --------------------------------------------------------------------------- GPUs


@dataclasses.dataclass(frozen=True)
class _Gpu:
    index: str
    persistence: str  # "Enabled", "Disabled", or what nvidia-smi said ("[N/A]")
    applications_mhz: int | None
    max_mhz: int | None
    name: str


def _mhz(text: str) -> int | None:
    text = text.strip().removesuffix("MHz").strip()
    return int(text) if text.isdigit() else None


def _query_gpus(runner: Runner) -> tuple[list[_Gpu], str]:
    """The GPUs nvidia-smi lists, or ([], why there are none)."""
    res = runner(list(GPU_QUERY))
    if res.returncode == 127:
        return [], "no NVIDIA GPU/driver found (nvidia-smi is not on PATH)"
    if res.returncode != 0:
        said = (res.stdout.strip() or res.stderr.strip() or f"exit status {res.returncode}").splitlines()[0]
        return [], f"no NVIDIA GPU/driver found (nvidia-smi: {said})"
    gpus: list[_Gpu] = []
    for line in res.stdout.splitlines():
        fields = [f.strip() for f in line.split(",", 4)]
        if len(fields) < 4 or not fields[0].isdigit():
            continue
        name = fields[4] if len(fields) > 4 else ""
        gpus.append(_Gpu(fields[0], fields[1], _mhz(fields[2]), _mhz(fields[3]), name))
    if not gpus:
        return [], "no NVIDIA GPU found (nvidia-smi lists none)"
    return gpus, ""


def _smi(index: str, *args: str) -> list[str]:
    return ["nvidia-smi", "-i", index, *args]


def _shown(argv: Sequence[str]) -> str:
    return "sudo " + " ".join(argv)


def _gpu_rows(gpus: Sequence[_Gpu], locked: dict[str, int]) -> list[Setting]:
    rows: list[Setting] = []
    for gpu in gpus:
        label = f"{GPU} {gpu.index}"
        about = f" ({gpu.name})" if gpu.name else ""
        if gpu.persistence == "Enabled":
            rows.append(Setting(f"{label} persistence", f"enabled{about}", READY, ""))
        elif gpu.persistence == "Disabled":
            rows.append(
                Setting(f"{label} persistence", f"disabled{about}", NOT_READY, _shown(_smi(gpu.index, "-pm", "1")))
            )
        else:
            rows.append(Setting(f"{label} persistence", f"{gpu.persistence}{about}", UNKNOWN, ""))
        if gpu.max_mhz is None:
            rows.append(Setting(f"{label} clocks", "nvidia-smi reports no maximum graphics clock", UNKNOWN, ""))
            continue
        if gpu.index in locked:
            rows.append(
                Setting(f"{label} clocks", f"locked at {locked[gpu.index]} MHz by host-check --apply", READY, "")
            )
            continue
        lock = _shown(_smi(gpu.index, "-lgc", f"{gpu.max_mhz},{gpu.max_mhz}"))
        apps = f"{gpu.applications_mhz} MHz" if gpu.applications_mhz is not None else "n/a"
        rows.append(
            Setting(
                f"{label} clocks",
                f"applications {apps}, max {gpu.max_mhz} MHz (a -lgc lock cannot be read back)",
                UNKNOWN,
                f"{lock} (undo: -rgc)",
            )
        )
    return rows


def _resolve_runner(root: Path, runner: Runner | None) -> Runner | None:
    """The runner GPUs are queried through; None (no query) for another root with no runner."""
    if runner is not None:
        return runner
    return run_command if root.resolve() == Path("/") else None


def _check_gpus(root: Path, runner: Runner | None, state: dict[str, Any] | None) -> list[Setting]:
    run = _resolve_runner(root, runner)
    if run is None:
        return [Setting(GPU, f"not queried: nvidia-smi shows this machine's GPUs, not those of {root}", UNKNOWN, "")]
    gpus, why = _query_gpus(run)
    if not gpus:
        return [Setting(GPU, why, UNKNOWN, "")]
    return _gpu_rows(gpus, _locked_this_boot(root, state))


# --------------------------------------------------------------------------- the report


def default_state_file(root: StrPath = "/") -> Path:
    """<root>/var/lib/torchbuild/host-state.json, its symlinks resolved inside root (_resolve):
    a `var` that links to `/etc` is root's own etc, never the host's."""
    rootp = Path(root)
    try:
        return rootp.joinpath(*_resolve(rootp, DEFAULT_STATE))
    except OSError:  # symlinks that loop: writing there fails the same way, naming it
        return _under(rootp, DEFAULT_STATE)


def check(
    root: StrPath = "/",
    *,
    runner: Runner | None = None,
    pyperf: Runner | None = None,
    state_file: StrPath | None = None,
) -> list[Setting]:
    """Every setting's row: the CPU rows (GOVERNOR, TURBO, SMT, CSTATES, ISOLATED), pyperf's
    other rows, then the GPU rows. Never raises: what cannot be read is UNKNOWN. runner: how
    nvidia-smi is run, pyperf: how PYPERF_SHOW is run (each default run_command, and only for
    root "/"); state_file: where --apply saved its state (default under root), read to know
    which GPU clocks it locked."""
    rootp = Path(root)
    state = _load_state_quietly(Path(state_file) if state_file is not None else default_state_file(rootp))
    (governor, turbo, isolated), others = _pyperf_rows(rootp, pyperf)
    rows = [governor, turbo, _check_smt(rootp), _check_cstates(rootp), isolated, *others]
    return rows + _check_gpus(rootp, runner, state)


def kernel_words(settings: Iterable[Setting]) -> str:
    """The words to add to the kernel command line for the boot-time settings not ready."""
    return " ".join(s.fix for s in settings if s.boot_time and s.verdict != READY and s.fix)


def not_ready(settings: Iterable[Setting]) -> list[Setting]:
    return [s for s in settings if s.verdict == NOT_READY]


def _fix_text(s: Setting) -> str:
    if s.boot_time and s.fix and s.verdict != READY:
        return f"cmdline += {s.fix}"
    return s.fix


def render(settings: Sequence[Setting]) -> str:
    """The report as a table (verdict, setting, value, fix) and what to do next."""
    shown = {READY: "ready", NOT_READY: "NOT READY", UNKNOWN: "unknown"}
    text = table(["", "setting", "value", "fix"], [(shown[s.verdict], s.name, s.value, _fix_text(s)) for s in settings])
    counts = {v: sum(1 for s in settings if s.verdict == v) for v in VERDICTS}
    lines = [text, "", f"{counts[READY]} ready, {counts[NOT_READY]} not ready, {counts[UNKNOWN]} unknown"]
    if any(s.verdict == NOT_READY and (s.name in APPLIED or s.name.startswith(f"{GPU} ")) for s in settings):
        lines.append(
            "now: `sudo invoke host-check --apply` sets governor, turbo, SMT, perf event rate and GPU persistence and clocks "
            "(saving what `invoke host-check --restore` puts back)"
        )
    words = kernel_words(settings)
    if words:
        lines.append(
            f"at boot: add `{words}` to the kernel command line ({GRUB_KEY} in /etc/default/grub, "
            "then update-grub or grub2-mkconfig) and reboot"
        )
    return "\n".join(lines)


def as_json(settings: Sequence[Setting], **extra: Any) -> str:
    """The report for machines: ready (no row NOT_READY; unknown ones do not count), counts per
    verdict, settings, kernel_cmdline (the words to add), and extra."""
    data: dict[str, Any] = {
        "ready": not not_ready(settings),
        "counts": {v: sum(1 for s in settings if s.verdict == v) for v in VERDICTS},
        "settings": [dataclasses.asdict(s) for s in settings],
        "kernel_cmdline": kernel_words(settings),
        **extra,
    }
    return json.dumps(data, indent=2)


# --------------------------------------------------------------------------- the state file


def _boot_id(root: Path) -> str | None:
    return _read(root, BOOT_ID)


def _locked_this_boot(root: Path, state: dict[str, Any] | None) -> dict[str, int]:
    """{gpu index: MHz} for the GPU clocks --apply locked in this boot (a reboot undoes locks)."""
    if not state or state.get("boot_id") is None or state.get("boot_id") != _boot_id(root):
        return {}
    locked: dict[str, int] = {}
    for gpu in state.get("gpus", []):
        if isinstance(gpu, dict) and isinstance(gpu.get("locked_mhz"), int):
            locked[str(gpu.get("index"))] = gpu["locked_mhz"]
    return locked


def _valid_state(data: object) -> bool:
    if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
        return False
    files, gpus = data.get("files"), data.get("gpus")
    return (
        isinstance(files, list)
        and isinstance(gpus, list)
        and all(isinstance(f, dict) and _valid_file(f) for f in files)
        and all(isinstance(g, dict) and _valid_gpu(g) for g in gpus)
    )


def _valid_file(entry: dict[str, Any]) -> bool:
    return (
        _settable(entry.get("path"))
        and isinstance(entry.get("previous"), str)
        and all(isinstance(entry.get(key, ""), str) for key in ("setting", "applied"))
    )


def _valid_gpu(entry: dict[str, Any]) -> bool:
    index, mhz, mode = entry.get("index"), entry.get("locked_mhz"), entry.get("persistence_mode")
    return (
        isinstance(index, str)
        and re.fullmatch(r"[0-9]{1,4}", index) is not None
        and (mhz is None or (isinstance(mhz, int) and not isinstance(mhz, bool)))
        and (mode is None or isinstance(mode, str))
    )


def _settable(path: object) -> bool:
    """Whether a state file's path is one --apply writes: under /sys/devices/system/cpu, no "..",
    or PERF_RATE. (--restore runs as root and writes what the file says: it writes nowhere else.)"""
    if path == PERF_RATE:
        return True
    return isinstance(path, str) and path.startswith(f"{CPU_DIR}/") and ".." not in path.split("/")


def _load_state_quietly(path: Path) -> dict[str, Any] | None:
    try:
        return load_state(path)
    except TorchbuildError:
        return None


def _state_bytes(path: Path) -> bytes | None:
    """The state file's bytes (at most STATE_LIMIT), None when there is none; PathError naming
    it when it cannot be one (a directory, a FIFO, far too large, a parent that is a file)."""
    try:
        return read_bytes(path, STATE_LIMIT, "the host-check state file (--state)")
    except PathError as err:
        if isinstance(err.__cause__, FileNotFoundError):
            return None
        raise


def load_state(path: StrPath) -> dict[str, Any] | None:
    """The saved state, None when there is no state file; PathError when the path cannot hold
    one (a directory...), HostSetupFailed when the file is not one (not UTF-8, not JSON, not
    the schema)."""
    p = Path(path)
    raw = _state_bytes(p)
    if raw is None:
        return None
    why = ""
    try:
        data = loads_json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        data, why = None, f"not UTF-8 text: byte {raw[exc.start]:#04x} at offset {exc.start}"
    except ValueError as exc:
        data, why = None, f"not JSON: {exc}"
    if not _valid_state(data):
        raise HostSetupFailed(
            f"{p} is not a host-check state file" + (f" ({why})" if why else ""),
            hint="look at it and put the values back by hand, then remove it",
        )
    assert isinstance(data, dict)
    version = data.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise HostSetupFailed(f"{p} is not a host-check state file (version {version!r})")
    if version > STATE_VERSION:
        raise HostSetupFailed(f"{p} was written by a newer torchbuild", hint="use that torchbuild to --restore")
    return data


def _write_atomically(path: Path, data: bytes) -> None:
    """path holds data or what it held before, never a part (a new temporary file, never one
    that was there, then rename)."""
    make_dirs(path.parent)  # recorded: a failed --apply leaves no empty var/lib/torchbuild (core/dirs.py)
    atomic_write_bytes(path, data, mode=0o600)  # the state file stays private, as mkstemp made it


def _save_state(path: Path, state: dict[str, Any]) -> None:
    try:
        _write_atomically(path, (json.dumps(state, indent=2) + "\n").encode())
    except OSError as exc:
        raise HostSetupFailed(
            f"cannot save the previous settings to {path}: {exc.strerror}; nothing was changed",
            hint=_state_hint(exc),
        ) from exc


def _state_hint(exc: OSError) -> str:
    """What to do when the state file cannot be written (the setting hints speak of the kernel)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free space on its file system, or give --state a file on another one"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "run it as root, or give --state a file in a directory you can write"
    return "give --state a file in a directory (one that exists or can be made)"


# --------------------------------------------------------------------------- changing


def _hint(exc: OSError) -> str:
    if isinstance(exc, _NotASetting):
        return "a setting is a regular file: check that --root is a copy of a system's / and not another tree"
    if exc.errno == errno.ELOOP:
        return "a symlink under --root loops, or was put in place while host-check ran: look at the path named"
    if exc.errno == errno.EROFS:
        return "it is on a read-only file system (in a container /sys is read-only): run it on the host"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "run it as root on the host (sudo), not in a container"
    if exc.errno == errno.ENOENT:
        return "the setting is gone (a CPU went offline, a driver changed?): run `invoke host-check` again"
    return "the kernel refused the value: apply the fix the report prints by hand"


class _NotASetting(OSError):
    """The file to write is not a regular file (a FIFO, a device node): nothing is written."""


def _write_sysfs(root: Path, system_path: str, text: str) -> None:
    """Write text to an existing regular file inside root (never creates one: a missing file is
    ENOENT; never follows a symlink out of root: _open_in_root)."""
    data = text.encode("utf-8", "surrogateescape")
    fd = _open_in_root(root, system_path, os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # O_TRUNC does nothing to these
            raise _NotASetting(
                errno.EINVAL, "not a regular file (a FIFO or device node)", str(_under(root, system_path))
            )
        if os.write(fd, data) != len(data):
            raise OSError(errno.EIO, "short write", str(_under(root, system_path)))
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True)
class _FileChange:
    setting: str
    path: str  # the system path (/sys/...), read and written under root
    previous: str  # the file's exact bytes (surrogateescape)
    applied: str


@dataclasses.dataclass(frozen=True)
class _GpuChange:
    index: str
    persistence: str | None  # the previous mode, when --apply enables persistence
    lock_mhz: int | None  # the clock --apply locks at


def _plan(
    root: Path, runner: Runner | None, state: dict[str, Any] | None
) -> tuple[list[_FileChange], list[_GpuChange], list[str]]:
    """What --apply changes (in this order), and notes on what it leaves."""
    files: list[_FileChange] = []
    notes: list[str] = []

    def change(setting: str, path: str, applied: str) -> None:
        previous = _read_exact(root, path)
        if previous is not None and previous.strip() != applied.strip():
            files.append(_FileChange(setting, path, previous, applied))

    for cpu in online_cpus(root):
        path = _governor_file(cpu)
        current = _read(root, path)
        if current is None or current == "performance":
            continue
        available = _read(root, f"{CPU_DIR}/cpu{cpu}/cpufreq/scaling_available_governors")
        if available is not None and "performance" not in available.split():
            notes.append(f"left cpu{cpu}'s governor {current}: its driver offers no performance governor")
            continue
        change(GOVERNOR, path, "performance\n")
    if _read(root, NO_TURBO) is not None:
        change(TURBO, NO_TURBO, "1\n")
    elif _read(root, BOOST) is not None:
        change(TURBO, BOOST, "0\n")
    if _read(root, SMT_CONTROL) == "on" and _read(root, SMT_ACTIVE) != "0":
        change(SMT, SMT_CONTROL, "off\n")
    change(PERF_EVENT, PERF_RATE, "1\n")
    return files, _gpu_plan(root, runner, state), notes


def _gpu_plan(root: Path, runner: Runner | None, state: dict[str, Any] | None) -> list[_GpuChange]:
    """What --apply changes on each GPU: persistence mode where it is off, clocks locked where they are not
    already (this boot)."""
    gpus: list[_GpuChange] = []
    run = _resolve_runner(root, runner)
    if run is not None:
        found, _ = _query_gpus(run)
        locked = _locked_this_boot(root, state)
        for gpu in found:
            persistence = gpu.persistence if gpu.persistence == "Disabled" else None
            lock = gpu.max_mhz if gpu.max_mhz is not None and gpu.index not in locked else None
            if persistence is not None or lock is not None:
                gpus.append(_GpuChange(gpu.index, persistence, lock))
    return gpus


def _merge(
    existing: dict[str, Any] | None, root: Path, files: Sequence[_FileChange], gpus: Sequence[_GpuChange]
) -> dict[str, Any]:
    """The state to save: the existing one's previous values are kept (they are the values from
    before the first --apply); settings it does not hold yet are added after its own."""
    state: dict[str, Any] = existing or {
        "schema": STATE_SCHEMA,
        "version": STATE_VERSION,
        "root": str(root.resolve()),
        "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": [],
        "gpus": [],
    }
    state = json.loads(json.dumps(state))  # a copy
    state["boot_id"] = _boot_id(root)
    known = {f["path"] for f in state["files"]}
    for ch in files:
        if ch.path not in known:
            state["files"].append(
                {"setting": ch.setting, "path": ch.path, "previous": ch.previous, "applied": ch.applied}
            )
            known.add(ch.path)
    by_index = {g["index"]: g for g in state["gpus"]}
    for g in gpus:
        entry = by_index.get(g.index)
        if entry is None:
            entry = {"index": g.index, "persistence_mode": None, "locked_mhz": None}
            state["gpus"].append(entry)
            by_index[g.index] = entry
        if g.persistence is not None and entry.get("persistence_mode") is None:
            entry["persistence_mode"] = g.persistence
        if g.lock_mhz is not None:
            entry["locked_mhz"] = g.lock_mhz
    return state


def _summary(written: Sequence[tuple[str, str, str, str]]) -> list[str]:
    """One line per file written (setting, path, before, after); the governors in one line per
    (before, after): "cpu governor: powersave -> performance on cpu0-63"."""
    lines: list[str] = []
    governors: dict[tuple[str, str], list[int]] = {}
    for setting, path, before, after in written:
        m = re.fullmatch(rf"{CPU_DIR}/cpu(\d+)/cpufreq/scaling_governor", path)
        if m:
            governors.setdefault((before.strip(), after.strip()), []).append(int(m.group(1)))
        else:
            lines.append(f"{setting}: {path} {before.strip()} -> {after.strip()}")
    gov = [f"{GOVERNOR}: {b} -> {a} on cpu{format_cpulist(cpus)}" for (b, a), cpus in governors.items()]
    return gov + lines


def _require_root(as_root: bool | None, what: str) -> None:
    if not (is_root() if as_root is None else as_root):
        raise HostSetupFailed(
            f"invoke host-check {what} changes kernel and GPU driver settings and must run as root",
            hint=f"run `sudo invoke host-check {what}`, or apply the fixes the report prints by hand",
        )


def _run_gpu(run: Runner, argv: list[str]) -> str | None:
    """None when argv succeeded, else what nvidia-smi said."""
    res = run(argv)
    if res.returncode == 0:
        return None
    said = (res.stdout.strip() or res.stderr.strip() or f"exit status {res.returncode}").splitlines()
    return said[-1] if said else f"exit status {res.returncode}"


def apply(
    root: StrPath = "/",
    state_file: StrPath | None = None,
    *,
    runner: Runner | None = None,
    as_root: bool | None = None,
) -> list[str]:
    """Set the runtime settings for benchmarking: every online CPU's governor to performance,
    turbo off, SMT off, the perf event sample rate to 1 (pyperf's advice), and per GPU
    persistence on and graphics clocks locked at their maximum. Returns one line per change. Boot-time settings (C-states, isolated CPUs) are left: the
    report prints the kernel command-line words.

    Root only (as_root: None asks os.geteuid(); else HostSetupFailed). Before changing anything
    the previous values are saved to state_file (default <root>/var/lib/torchbuild/host-state.json),
    written atomically. When a change fails, the ones made before it are put back, the state
    file is as it was, and HostSetupFailed names the file (or the nvidia-smi command).

    A state file that already exists is kept, not overwritten: its previous values are the
    host's own, from before the first --apply, and only those are worth restoring; an --apply
    run again (after a reboot or a driver reload undid a setting, or in every benchmark job's
    prologue) must not replace them with the tuned values. Settings it does not hold yet are
    added to it. So --apply is idempotent, and one --restore goes back to the original host."""
    _require_root(as_root, "--apply")
    rootp = Path(root)
    state_path = Path(state_file) if state_file is not None else default_state_file(rootp)
    existing = load_state(state_path)
    _check_state_root(state_path, existing, rootp, "pass the same --root, or another --state")
    files, gpus, notes = _plan(rootp, runner, existing)
    if not files and not gpus:
        return [*notes, "nothing to change: every runtime setting is already set"]
    previous_bytes = _state_bytes(state_path) if existing is not None else None
    _save_state(state_path, _merge(existing, rootp, files, gpus))
    undo = _Undo(state_path, previous_bytes)
    done = _apply_files(rootp, files, undo)
    done += _apply_gpus(_resolve_runner(rootp, runner), gpus, undo)
    return [*done, *notes, f"saved the previous values to {state_path} (`invoke host-check --restore` puts them back)"]


def _check_state_root(state_path: Path, state: dict[str, Any] | None, root: Path, hint: str) -> None:
    """HostSetupFailed when the state file was saved for another root."""
    if state is not None and state.get("root") not in (None, str(root.resolve())):
        raise HostSetupFailed(
            f"{state_path} holds the state of root {state.get('root')}, not {root.resolve()}", hint=hint
        )


@dataclasses.dataclass
class _Undo:
    """The changes --apply made so far, each with how to put it back; on a failure (fail) they
    are put back in the reverse order and the state file is as it was before."""

    state_path: Path
    previous_bytes: bytes | None  # the state file before this --apply (None: there was none)
    made: list[tuple[str, Callable[[], str | None]]] = dataclasses.field(default_factory=list)

    def add(self, what: str, put_back: Callable[[], str | None]) -> None:
        """put_back: puts it back, returning an error or None."""
        self.made.append((what, put_back))

    def fail(self, what: str, reason: str, hint: str) -> HostSetupFailed:
        failed_undo = []
        for name, put_back in reversed(self.made):
            err = put_back()
            if err is not None:
                failed_undo.append(f"{name} ({err})")
        if failed_undo:
            return HostSetupFailed(
                f"could not change {what}: {reason}; could not put back {', '.join(failed_undo)}",
                hint=f"the previous values are in {self.state_path}: `sudo invoke host-check --restore` tries again",
            )
        try:
            if self.previous_bytes is None:
                self.state_path.unlink(missing_ok=True)
            else:
                _write_atomically(self.state_path, self.previous_bytes)
        except OSError:
            pass
        n = len(self.made)
        after = f"put back the {n} change{'s' if n != 1 else ''} made before it" if n else "nothing was changed"
        return HostSetupFailed(f"could not change {what}: {reason}; {after}", hint=hint)


def _apply_files(root: Path, files: Sequence[_FileChange], undo: _Undo) -> list[str]:
    """Write each file's applied value (undo.fail on the first that fails); the summary lines."""
    written: list[tuple[str, str, str, str]] = []
    for ch in files:
        target = _under(root, ch.path)
        try:
            _write_sysfs(root, ch.path, ch.applied)
        except OSError as exc:
            raise undo.fail(str(target), exc.strerror or str(exc), _hint(exc)) from None

        def put_file_back(path: str = ch.path, previous: str = ch.previous) -> str | None:
            try:
                _write_sysfs(root, path, previous)
            except OSError as exc:
                return exc.strerror or str(exc)
            return None

        undo.add(str(target), put_file_back)
        written.append((ch.setting, ch.path, ch.previous, ch.applied))
    return _summary(written)


def _gpu_steps(g: _GpuChange) -> list[tuple[list[str], list[str], str]]:
    """The nvidia-smi commands of one GPU's change: (command, its undo, the line saying it)."""
    steps: list[tuple[list[str], list[str], str]] = []
    if g.persistence is not None:
        steps.append((_smi(g.index, "-pm", "1"), _smi(g.index, "-pm", "0"), f"gpu {g.index} persistence: on"))
    if g.lock_mhz is not None:
        clocks = f"{g.lock_mhz},{g.lock_mhz}"
        steps.append(
            (
                _smi(g.index, "-lgc", clocks),
                _smi(g.index, "-rgc"),
                f"gpu {g.index} clocks: locked at {g.lock_mhz} MHz",
            )
        )
    return steps


def _apply_gpus(run: Runner | None, gpus: Sequence[_GpuChange], undo: _Undo) -> list[str]:
    """Run each GPU's nvidia-smi commands (undo.fail on the first that fails); a line for each."""
    done: list[str] = []
    for g in gpus:
        assert run is not None  # GPU changes are planned only with a runner
        gpu_run: Runner = run
        for argv, back, line in _gpu_steps(g):
            err = _run_gpu(gpu_run, argv)
            if err is not None:
                raise undo.fail(
                    f"`{' '.join(argv)}`", err, "the GPU or driver refused it: see `nvidia-smi -q`"
                ) from None

            def put_gpu_back(back: list[str] = back, gpu_run: Runner = gpu_run) -> str | None:
                return _run_gpu(gpu_run, back)

            undo.add(f"`{' '.join(back)}`", put_gpu_back)
            done.append(line)
    return done


def _not_run(root: Path) -> Runner:
    """A runner that runs nothing: nvidia-smi would change this machine's GPUs, not root's."""

    def runner(argv: Sequence[str]) -> CommandResult:
        return CommandResult(1, "", f"not run: nvidia-smi changes this machine's GPUs, not those of {root}")

    return runner


def restore(
    root: StrPath = "/",
    state_file: StrPath | None = None,
    *,
    runner: Runner | None = None,
    as_root: bool | None = None,
) -> list[str]:
    """Put back what --apply saved, byte for byte, in the reverse order (GPUs first, then the
    files, so SMT is back on before the siblings' governors are written), and remove the state
    file (and the default's directory, var/lib/torchbuild, when that leaves it empty). Returns one line per value put back; none, with a line saying so, when there is no
    state file (a second --restore is a no-op).

    Root only, as --apply. Every value is tried; when some cannot be put back, the state file
    keeps just those (so a rerun retries them) and HostSetupFailed names the first."""
    _require_root(as_root, "--restore")
    rootp = Path(root)
    state_path = Path(state_file) if state_file is not None else default_state_file(rootp)
    state = load_state(state_path)
    if state is None:
        return [f"nothing to restore: no state file at {state_path}"]
    _check_state_root(state_path, state, rootp, "pass the same --root as --apply had")
    put_back = _PutBack()
    run = _resolve_runner(rootp, runner) or _not_run(rootp)
    for gpu in reversed(state["gpus"]):
        put_back.gpu(run, gpu)
    for entry in reversed(state["files"]):
        put_back.file(rootp, entry)
    if put_back.failures:
        raise put_back.failed(state_path, state)
    _remove_state(state_path)
    if state_file is None:  # <root>/var/lib/torchbuild, --apply's: gone with its last file
        with contextlib.suppress(OSError):
            state_path.parent.rmdir()
    return [*put_back.done, *_summary(put_back.written), f"removed {state_path}"]


@dataclasses.dataclass
class _PutBack:
    """What --restore put back so far, and what it could not (kept in the state file)."""

    done: list[str] = dataclasses.field(default_factory=list)  # the GPUs' lines
    written: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)  # the files' (for _summary)
    failures: list[str] = dataclasses.field(default_factory=list)
    left_gpus: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    left_files: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def gpu(self, run: Runner, gpu: dict[str, Any]) -> None:
        """Unlock one GPU's clocks and turn its persistence back off, as --apply saved them."""
        left: dict[str, Any] = {"index": gpu["index"], "persistence_mode": None, "locked_mhz": None}
        if gpu.get("locked_mhz") is not None:
            err = _run_gpu(run, _smi(gpu["index"], "-rgc"))
            if err is None:
                self.done.append(f"gpu {gpu['index']} clocks: unlocked")
            else:
                self.failures.append(f"`nvidia-smi -i {gpu['index']} -rgc` ({err})")
                left["locked_mhz"] = gpu["locked_mhz"]
        if gpu.get("persistence_mode") == "Disabled":
            err = _run_gpu(run, _smi(gpu["index"], "-pm", "0"))
            if err is None:
                self.done.append(f"gpu {gpu['index']} persistence: off")
            else:
                self.failures.append(f"`nvidia-smi -i {gpu['index']} -pm 0` ({err})")
                left["persistence_mode"] = "Disabled"
        if left["locked_mhz"] is not None or left["persistence_mode"] is not None:
            self.left_gpus.insert(0, left)

    def file(self, root: Path, entry: dict[str, Any]) -> None:
        """Write one file's previous value back."""
        target = _under(root, entry["path"])
        try:
            _write_sysfs(root, entry["path"], entry["previous"])
        except OSError as exc:
            self.failures.append(f"{target} ({exc.strerror or exc})")
            self.left_files.insert(0, entry)
            return
        self.written.append(
            (str(entry.get("setting", "setting")), entry["path"], entry.get("applied", "?"), entry["previous"])
        )

    def failed(self, state_path: Path, state: dict[str, Any]) -> HostSetupFailed:
        """Keep what is left in the state file; the error naming the first failure."""
        with contextlib.suppress(HostSetupFailed):
            _save_state(state_path, {**state, "files": self.left_files, "gpus": self.left_gpus})
        more = f" and {len(self.failures) - 1} more" if len(self.failures) > 1 else ""
        return HostSetupFailed(
            f"could not put back {self.failures[0]}{more}",
            hint=f"{state_path} keeps what is left: fix the cause and run `sudo invoke host-check --restore` again",
        )


def _remove_state(state_path: Path) -> None:
    """Remove the state file once everything is back (gone already is fine)."""
    try:
        state_path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise HostSetupFailed(
            f"put every value back, but cannot remove {state_path}: {exc.strerror}", hint="remove it by hand"
        ) from exc
