"""invoke host-check on fake /sys and /proc trees (and one read of this machine's own)."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from invoke.context import Context
from invoke.exceptions import Exit

from torchbuild.core.errors import HostSetupFailed, PathError
from torchbuild.hostcheck import host as hc
from torchbuild.hostcheck.host import NOT_READY, READY, UNKNOWN, CommandResult, Setting
from torchbuild.hostcheck.task import host_check

CPU = "sys/devices/system/cpu"
CMDLINE = "BOOT_IMAGE=/boot/vmlinuz-6.1.0 root=/dev/sda1 ro quiet\n"


def put(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def make_host(root: Path, cpus: int = 4, *, governor: str = "powersave\n", driver: str = "intel_pstate") -> Path:
    """A host as it boots: every knob in the state a benchmark does not want."""
    put(root, f"{CPU}/online", f"0-{cpus - 1}\n")
    put(root, f"{CPU}/possible", f"0-{cpus - 1}\n")
    for i in range(cpus):
        put(root, f"{CPU}/cpu{i}/cpufreq/scaling_governor", governor)
        put(root, f"{CPU}/cpu{i}/cpufreq/scaling_driver", driver + "\n")
        put(root, f"{CPU}/cpu{i}/cpufreq/scaling_min_freq", "800000\n")
        put(root, f"{CPU}/cpu{i}/cpufreq/scaling_max_freq", "3500000\n")
        put(root, f"{CPU}/cpu{i}/cpufreq/scaling_available_governors", "performance powersave\n")
    if driver == "intel_pstate":
        put(root, f"{CPU}/intel_pstate/no_turbo", "0\n")
    elif driver == "acpi-cpufreq":
        put(root, f"{CPU}/cpufreq/boost", "1\n")
    put(root, f"{CPU}/smt/control", "on\n")
    put(root, f"{CPU}/smt/active", "1\n")
    put(root, f"{CPU}/isolated", "\n")
    put(root, f"{CPU}/cpuidle/current_driver", "intel_idle\n")
    put(root, "sys/module/intel_idle/parameters/max_cstate", "9\n")
    put(root, "proc/cmdline", CMDLINE)
    put(root, "proc/sys/kernel/perf_event_max_sample_rate", "100000\n")
    put(root, "proc/sys/kernel/random/boot_id", "0b3c5f1e-1111-2222-3333-444455556666\n")
    return root


@pytest.fixture
def host(tmp_path: Path) -> Path:
    return make_host(tmp_path / "host")


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root/sys and root/proc with its exact bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "var" not in p.parts
    }


class FakeSmi:
    """nvidia-smi for GPUs that keep persistence and locked clocks between calls."""

    def __init__(self, gpus: int = 2, *, persistence: str = "Disabled", fail: Sequence[str] = ()) -> None:
        self.gpus = [{"persistence": persistence, "locked": None} for _ in range(gpus)]
        self.fail = list(fail)  # arguments (joined by spaces) that fail
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        argv = list(argv)
        assert argv[0] == "nvidia-smi" and all(isinstance(a, str) for a in argv)  # an argument list, no shell
        self.calls.append(argv)
        joined = " ".join(argv[1:])
        if joined in self.fail:
            return CommandResult(3, "", "Setting locked GPU clocks is not supported for GPU 00000000:01:00.0.")
        if argv[1].startswith("--query-gpu="):
            lines = [f"{i}, {g['persistence']}, 1755, 1980, NVIDIA H100 80GB HBM3" for i, g in enumerate(self.gpus)]
            return CommandResult(0, "\n".join(lines) + "\n")
        gpu = self.gpus[int(argv[2])]
        if argv[3] == "-pm":
            gpu["persistence"] = "Enabled" if argv[4] == "1" else "Disabled"
        elif argv[3] == "-lgc":
            gpu["locked"] = argv[4]
        elif argv[3] == "-rgc":
            gpu["locked"] = None
        return CommandResult(0, "All done.\n")

    def changes(self) -> list[str]:
        return [" ".join(c[1:]) for c in self.calls if not c[1].startswith("--query")]


def rows(settings: list[Setting]) -> dict[str, Setting]:
    return {s.name: s for s in settings}


def no_gpu(argv: Sequence[str]) -> CommandResult:
    return CommandResult(127, "", "nvidia-smi: not found on PATH")


# pyperf's own code (the library, not a copy of it) run on a fake tree: its /sys and /proc
# helpers point under ROOT, then pyperf._system is loaded again (its classes read them as they
# are defined), and the logical CPU count is the tree's online CPUs, as psutil counts them.
PYPERF_ON_A_TREE = """
import importlib, os, runpy, sys
root = sys.argv.pop(1)
import pyperf._utils as u, pyperf._cpu_utils as cu, pyperf._system as system
for m in (u, cu):
    m.sysfs_path = lambda path: os.path.join(root, "sys", path)
    m.proc_path = lambda path: os.path.join(root, "proc", path)
importlib.reload(system)
online = cu.parse_cpu_list(u.read_first_line(os.path.join(root, "sys/devices/system/cpu/online")) or "") or []
system.get_logical_cpu_count = lambda: len(online) or None
sys.argv = ["pyperf", *sys.argv[1:]]
runpy.run_module("pyperf", run_name="__main__")
"""


def pyperf_on(root: Path) -> hc.Runner:
    """`python -m pyperf system show` reading root's /sys and /proc instead of this machine's."""

    def run(argv: Sequence[str]) -> CommandResult:
        assert list(argv[:3]) == [sys.executable, "-m", "pyperf"]
        return hc.run_command([sys.executable, "-c", PYPERF_ON_A_TREE, str(root), *argv[3:]])

    return run


def report(root: Path, **kw) -> list[Setting]:
    """host-check's rows for a fake tree, pyperf's read from the same tree."""
    return hc.check(root, pyperf=pyperf_on(root), **{"runner": no_gpu, **kw})


# --------------------------------------------------------------------------- verdicts


def test_a_host_as_it_boots_is_not_ready_with_a_fix_per_setting(host):
    got = rows(report(host))
    # pyperf's rows (governor, turbo, isolated cpus, and its own: perf event, cpu frequency) with ours
    assert list(got) == [*hc.CPU_SETTINGS, "perf event", "cpu frequency", "gpu"]
    assert got["perf event"] == Setting(
        "perf event", "Maximum sample rate: 100000 per second", NOT_READY, "Set max sample rate to 1"
    )
    assert got["cpu governor"] == Setting(
        "cpu governor", "0-3=powersave", NOT_READY, "Use CPU scaling governor 'performance'"
    )
    assert got["turbo boost"] == Setting(
        "turbo boost", "Turbo Boost enabled", NOT_READY, "Disable Turbo Boost to get more reliable CPU frequency"
    )
    assert got["cpu frequency"] == Setting("cpu frequency", "0-3=min=800 MHz, max=3500 MHz", READY, "")
    assert (
        got["smt"].verdict == NOT_READY and got["smt"].fix == "echo off | sudo tee /sys/devices/system/cpu/smt/control"
    )
    assert got["c-states"] == Setting(
        "c-states",
        "no limit (cpuidle driver intel_idle, intel_idle max_cstate=9)",
        NOT_READY,
        "intel_idle.max_cstate=1",  # Quansight's guide's words
        boot_time=True,
    )
    # the last half of the CPUs, as a suggestion
    assert got["isolated cpus"] == Setting(
        "isolated cpus", "No CPU is isolated", NOT_READY, "isolcpus=2-3 rcu_nocbs=2-3", True
    )
    assert got["gpu"].verdict == UNKNOWN and "no NVIDIA GPU/driver found" in got["gpu"].value
    assert not any(s.boot_time for s in got.values() if s.name not in ("c-states", "isolated cpus"))


def test_a_tuned_host_is_ready(host):
    for i in range(4):
        put(host, f"{CPU}/cpu{i}/cpufreq/scaling_governor", "performance\n")
    put(host, f"{CPU}/intel_pstate/no_turbo", "1\n")
    put(host, f"{CPU}/smt/control", "off\n")
    put(host, f"{CPU}/isolated", "2-3\n")
    put(host, "proc/cmdline", CMDLINE.strip() + " intel_idle.max_cstate=1 isolcpus=2-3 rcu_nocbs=2-3\n")
    put(host, "proc/sys/kernel/perf_event_max_sample_rate", "1\n")
    settings = report(host)
    assert {s.name: s.verdict for s in settings} == {
        **dict.fromkeys(hc.CPU_SETTINGS, READY),
        "perf event": READY,
        "cpu frequency": READY,
        "gpu": UNKNOWN,
    }
    assert all(s.fix == "" for s in settings if s.verdict == READY)
    assert hc.kernel_words(settings) == ""
    assert rows(settings)["isolated cpus"].value.startswith("Isolated CPUs (2/4): 2-3")
    assert "sudo invoke host-check --apply" not in hc.render(settings)


def test_governors_are_read_for_every_online_cpu_only(host):
    put(host, f"{CPU}/online", "0-2\n")  # cpu3 offline: its governor does not count
    for i in range(3):
        put(host, f"{CPU}/cpu{i}/cpufreq/scaling_governor", "performance\n")
    assert rows(report(host))["cpu governor"].verdict == READY
    put(host, f"{CPU}/cpu1/cpufreq/scaling_governor", "schedutil\n")
    gov = rows(report(host))["cpu governor"]
    assert gov.verdict == NOT_READY
    assert gov.value == "0,2=performance; 1=schedutil"


def test_the_cpu_rows_are_pyperf_s_and_not_read_for_another_root_without_a_runner(host):
    """pyperf reads this machine's /sys: for another root it runs only through a runner given."""
    got = rows(hc.check(host, runner=no_gpu))
    assert got["cpu governor"].verdict == UNKNOWN and "not queried: pyperf reads" in got["cpu governor"].value
    assert got["smt"].verdict == NOT_READY  # read under root, as before
    asked: list[list[str]] = []

    def pyperf(argv: Sequence[str]) -> CommandResult:
        asked.append(list(argv))
        return CommandResult(127, "", "No module named pyperf")

    got = rows(hc.check(host, runner=no_gpu, pyperf=pyperf))
    assert asked == [[sys.executable, "-m", "pyperf", "system", "show"]]
    assert got["cpu governor"].verdict == UNKNOWN and "No module named pyperf" in got["cpu governor"].value


def test_pyperf_s_other_checks_are_rows_of_their_own(host):
    """What pyperf checks beyond torchbench's list is in the report as pyperf says it: here
    nohz_full on intel_pstate CPUs, which pyperf flags (its advice only, no state)."""
    put(host, f"{CPU}/nohz_full", "2-3\n")
    nohz = rows(report(host))["nohz_full"]
    assert nohz.verdict == NOT_READY and not nohz.boot_time
    assert nohz.value.startswith("WARNING: nohz_full is enabled on CPUs") and "bugzilla" in nohz.fix


def test_online_cpus_from_the_directories_when_online_is_missing(host):
    (host / CPU / "online").unlink()
    put(host, f"{CPU}/cpu3/online", "0\n")
    assert hc.online_cpus(host) == [0, 1, 2]


@pytest.mark.parametrize(
    ("boost", "verdict", "value"),
    [
        ("1\n", NOT_READY, "on (cpufreq boost=1)"),
        ("0\n", READY, "off (cpufreq boost=0)"),
        ("x\n", UNKNOWN, "cpufreq boost='x'"),
    ],
)
def test_turbo_on_acpi_cpufreq(tmp_path, boost, verdict, value):
    root = make_host(tmp_path, driver="acpi-cpufreq")
    put(root, f"{CPU}/cpufreq/boost", boost)
    turbo = rows(report(root))["turbo boost"]  # pyperf reads no cpufreq/boost: host-check does
    assert (turbo.verdict, turbo.value) == (verdict, value)
    assert turbo.fix == ("" if verdict == READY else "echo 0 | sudo tee /sys/devices/system/cpu/cpufreq/boost")


def test_turbo_without_either_file_is_unknown(tmp_path):
    root = make_host(tmp_path, driver="none")
    assert rows(report(root))["turbo boost"].verdict == UNKNOWN


@pytest.mark.parametrize(
    ("control", "active", "verdict"),
    [
        ("on", "1", NOT_READY),
        ("on", "0", READY),  # siblings taken offline one by one: torchbench's own way
        ("off", "0", READY),
        ("forceoff", "0", READY),
        ("notsupported", "0", READY),
        ("notimplemented", "0", UNKNOWN),
    ],
)
def test_smt(host, control, active, verdict):
    put(host, f"{CPU}/smt/control", control + "\n")
    put(host, f"{CPU}/smt/active", active + "\n")
    smt = rows(hc.check(host, runner=no_gpu))["smt"]
    assert smt.verdict == verdict and smt.value == f"{control} (active={active})"


@pytest.mark.parametrize(
    "words",
    [
        "intel_idle.max_cstate=0",
        "processor.max_cstate=1",
        "idle=poll",
        "intel_idle.max_cstate=1 processor.max_cstate=1",
    ],
)
def test_cstate_limits_on_the_kernel_command_line(host, words):
    put(host, "proc/cmdline", f"{CMDLINE.strip()} {words}\n")
    cstates = rows(hc.check(host, runner=no_gpu))["c-states"]
    assert cstates.verdict == READY and cstates.boot_time
    assert words.split()[0] in cstates.value


def test_cstate_words_follow_the_cpuidle_driver(host):
    """The guide's intel_idle.max_cstate=1 where intel_idle runs; processor.max_cstate=1 where
    acpi_idle does (AMD), as intel_idle's parameter does nothing there."""
    put(host, f"{CPU}/cpuidle/current_driver", "acpi_idle\n")
    assert rows(hc.check(host, runner=no_gpu))["c-states"].fix == "processor.max_cstate=1"


def test_cstate_words_after_a_lone_dashdash_are_init_s_not_the_kernel_s(host):
    put(host, "proc/cmdline", f"{CMDLINE.strip()} -- intel_idle.max_cstate=0\n")
    assert rows(hc.check(host, runner=no_gpu))["c-states"].verdict == NOT_READY


def test_cstate_limit_from_intel_idle_s_parameter(host):
    put(host, "sys/module/intel_idle/parameters/max_cstate", "1\n")
    cstates = rows(hc.check(host, runner=no_gpu))["c-states"]
    assert cstates.verdict == READY and cstates.value == "limited: intel_idle max_cstate=1"


def test_isolated_cpus_from_isolcpus_alone(host):
    put(host, "proc/cmdline", f"{CMDLINE.strip()} isolcpus=nohz,domain,3\n")
    put(host, "proc/cmdline", f"{CMDLINE.strip()} isolcpus=3\n")
    iso = rows(report(host))["isolated cpus"]
    assert iso.verdict == READY and iso.value.startswith("Isolated CPUs (1/4): 3")


@pytest.mark.parametrize(
    ("online", "words"),
    [
        ("0-1", "isolcpus=1 rcu_nocbs=1"),
        ("0-7", "isolcpus=4-7 rcu_nocbs=4-7"),
        ("0-2,4-6", "isolcpus=4-6 rcu_nocbs=4-6"),
        ("0", ""),
    ],
)
def test_isolation_suggestion_is_the_last_half_of_the_online_cpus(host, online, words):
    put(host, f"{CPU}/online", online + "\n")
    iso = rows(report(host))["isolated cpus"]
    assert iso.verdict == NOT_READY and iso.fix == words


def test_kernel_command_line_words_gather_every_boot_time_fix(host):
    settings = report(host)
    words = "intel_idle.max_cstate=1 isolcpus=2-3 rcu_nocbs=2-3"
    assert hc.kernel_words(settings) == words
    text = hc.render(settings)
    assert f"at boot: add `{words}` to the kernel command line (GRUB_CMDLINE_LINUX_DEFAULT" in text
    assert "sudo invoke host-check --apply" in text
    assert json.loads(hc.as_json(settings))["kernel_cmdline"] == words


def test_an_empty_root_is_all_unknown_and_never_raises(tmp_path):
    settings = hc.check(tmp_path, runner=no_gpu)
    assert [s.name for s in settings] == [*hc.CPU_SETTINGS, "gpu"]
    assert {s.verdict for s in settings} == {UNKNOWN}
    hc.render(settings)
    settings = report(tmp_path)  # pyperf on it finds no CPU and says so
    assert [s.name for s in settings] == [*hc.CPU_SETTINGS, "gpu"]
    assert {s.verdict for s in settings} == {UNKNOWN}


def test_odd_files_are_unknown_not_tracebacks(host):
    # a directory where a file should be, binary junk, nonsense values
    for i in range(4):
        path = host / CPU / f"cpu{i}/cpufreq/scaling_governor"
        path.unlink()
        path.mkdir()
    (host / CPU / "intel_pstate/no_turbo").write_bytes(b"\xff\xfe\x00")
    put(host, f"{CPU}/online", "garbage\n")
    put(host, "proc/cmdline", "intel_idle.max_cstate=lots processor.max_cstate=\n")
    put(host, "sys/module/intel_idle/parameters/max_cstate", "\n")
    got = rows(report(host))
    assert got["cpu governor"].verdict == UNKNOWN
    assert got["turbo boost"].verdict == UNKNOWN
    assert got["c-states"].verdict == NOT_READY


# --------------------------------------------------------------------------- GPUs


def test_gpu_rows_from_nvidia_smi(host):
    smi = FakeSmi(2)
    smi.gpus[1]["persistence"] = "Enabled"
    got = rows(hc.check(host, runner=smi))
    assert got["gpu 0 persistence"] == Setting(
        "gpu 0 persistence", "disabled (NVIDIA H100 80GB HBM3)", NOT_READY, "sudo nvidia-smi -i 0 -pm 1"
    )
    assert got["gpu 1 persistence"].verdict == READY
    clocks = got["gpu 0 clocks"]
    assert clocks.verdict == UNKNOWN and "applications 1755 MHz, max 1980 MHz" in clocks.value
    assert clocks.fix == "sudo nvidia-smi -i 0 -lgc 1980,1980 (undo: -rgc)"
    assert smi.calls == [list(hc.GPU_QUERY)]


@pytest.mark.parametrize(
    ("result", "said"),
    [
        (CommandResult(127, "", "nvidia-smi: not found on PATH"), "nvidia-smi is not on PATH"),
        (
            CommandResult(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"),
            "couldn't communicate with the NVIDIA driver",
        ),
        (CommandResult(0, ""), "nvidia-smi lists none"),
    ],
)
def test_no_gpu_is_one_unknown_row(host, result, said):
    gpu = [s for s in hc.check(host, runner=lambda argv: result) if s.name.startswith("gpu")]
    assert len(gpu) == 1 and gpu[0].verdict == UNKNOWN and gpu[0].name == "gpu"
    assert "no NVIDIA GPU" in gpu[0].value and said in gpu[0].value


def test_another_root_does_not_query_this_machine_s_gpus_unless_given_a_runner(host, monkeypatch):
    monkeypatch.setattr(hc, "run_command", lambda argv: pytest.fail("nvidia-smi was run for a fake root"))
    gpu = rows(hc.check(host))["gpu"]
    assert gpu.verdict == UNKNOWN and "not queried" in gpu.value


# --------------------------------------------------------------------------- apply and restore


def test_apply_changes_the_files_and_saves_the_previous_state_first(host):
    before = snapshot(host)
    smi = FakeSmi(1)
    state = host / "var/lib/torchbuild/host-state.json"
    done = hc.apply(host, runner=smi, as_root=True)
    for i in range(4):
        assert (host / CPU / f"cpu{i}/cpufreq/scaling_governor").read_text() == "performance\n"
    assert (host / CPU / "intel_pstate/no_turbo").read_text() == "1\n"
    assert (host / CPU / "smt/control").read_text() == "off\n"
    assert (host / "proc/sys/kernel/perf_event_max_sample_rate").read_text() == "1\n"
    assert smi.changes() == ["-i 0 -pm 1", "-i 0 -lgc 1980,1980"]
    assert done[0] == "cpu governor: powersave -> performance on cpu0-3"
    assert "turbo boost: /sys/devices/system/cpu/intel_pstate/no_turbo 0 -> 1" in done
    assert "perf event: /proc/sys/kernel/perf_event_max_sample_rate 100000 -> 1" in done
    assert done[-1].startswith(f"saved the previous values to {state}")

    saved = json.loads(state.read_text())
    assert saved["schema"] == "torchbuild.host-state" and saved["root"] == str(host.resolve())
    assert {f["path"]: f["previous"] for f in saved["files"]} == {
        **{f"/{CPU}/cpu{i}/cpufreq/scaling_governor": "powersave\n" for i in range(4)},
        f"/{CPU}/intel_pstate/no_turbo": "0\n",
        f"/{CPU}/smt/control": "on\n",
        "/proc/sys/kernel/perf_event_max_sample_rate": "100000\n",
    }
    assert saved["gpus"] == [{"index": "0", "persistence_mode": "Disabled", "locked_mhz": 1980}]
    assert not list(state.parent.glob(".*tmp*"))  # no temporary file left

    after = rows(report(host, runner=smi))
    runtime = ["cpu governor", "turbo boost", "smt", "gpu 0 persistence", "gpu 0 clocks"]
    assert {name: after[name].verdict for name in runtime} == dict.fromkeys(runtime, READY)
    assert after["gpu 0 clocks"].value == "locked at 1980 MHz by host-check --apply"
    assert after["c-states"].verdict == NOT_READY  # boot-time: left alone
    assert snapshot(host)["proc/cmdline"] == before["proc/cmdline"]


def test_restore_puts_back_the_exact_bytes_and_removes_the_state_file(host):
    # odd but real bytes: no trailing newline, a trailing space
    put(host, f"{CPU}/cpu1/cpufreq/scaling_governor", "schedutil")
    put(host, f"{CPU}/smt/control", "on \n")
    before = snapshot(host)
    smi = FakeSmi(1)
    hc.apply(host, runner=smi, as_root=True)
    assert snapshot(host) != before
    done = hc.restore(host, runner=smi, as_root=True)
    assert snapshot(host) == before
    assert not (host / "var/lib/torchbuild/host-state.json").exists()
    assert smi.changes()[-2:] == ["-i 0 -rgc", "-i 0 -pm 0"]
    assert smi.gpus[0] == {"persistence": "Disabled", "locked": None}
    assert done[-1].startswith("removed ")
    # the clocks are no longer called locked
    assert rows(hc.check(host, runner=smi))["gpu 0 clocks"].verdict == UNKNOWN


def test_restore_without_a_state_file_is_a_no_op(host):
    before = snapshot(host)
    assert hc.restore(host, runner=FakeSmi(), as_root=True) == [
        f"nothing to restore: no state file at {host / 'var/lib/torchbuild/host-state.json'}"
    ]
    assert snapshot(host) == before


def test_a_second_apply_keeps_the_first_saved_state(host, tmp_path):
    before = snapshot(host)
    state = tmp_path / "state.json"
    smi = FakeSmi(1)
    hc.apply(host, state, runner=smi, as_root=True)
    first = json.loads(state.read_text())
    # a reboot puts the governors back, and cpu2's has become something else meanwhile
    for i in range(4):
        put(host, f"{CPU}/cpu{i}/cpufreq/scaling_governor", "powersave\n")
    put(host, f"{CPU}/cpu2/cpufreq/scaling_governor", "ondemand\n")
    hc.apply(host, state, runner=smi, as_root=True)
    second = json.loads(state.read_text())
    assert second["files"] == first["files"]  # still the values from before the first --apply
    assert hc.apply(host, state, runner=smi, as_root=True)[-1].startswith("nothing to change")
    hc.restore(host, state, runner=smi, as_root=True)
    assert snapshot(host) == before


def test_a_state_file_that_is_not_one_is_refused(host):
    state = put(host, "var/lib/torchbuild/host-state.json", "{not json")
    before = snapshot(host)
    for action in (hc.apply, hc.restore):
        with pytest.raises(HostSetupFailed, match="is not a host-check state file"):
            action(host, runner=FakeSmi(), as_root=True)
    assert snapshot(host) == before and state.read_text() == "{not json"


@pytest.mark.parametrize(
    "path",
    ["/etc/shadow", f"/{CPU}/../../../etc/shadow", "relative", "/proc/sys/kernel/core_pattern"],
)
def test_restore_writes_only_where_apply_writes(host, tmp_path, path):
    state = tmp_path / "state.json"
    hc.apply(host, state, runner=FakeSmi(1), as_root=True)
    saved = json.loads(state.read_text())
    saved["files"][0]["path"] = path
    state.write_text(json.dumps(saved))
    with pytest.raises(HostSetupFailed, match="is not a host-check state file"):
        hc.restore(host, state, runner=FakeSmi(1), as_root=True)


@pytest.mark.parametrize("action", [hc.apply, hc.restore])
def test_apply_and_restore_need_root(host, action):
    before = snapshot(host)
    smi = FakeSmi()
    with pytest.raises(HostSetupFailed) as err:
        action(host, runner=smi, as_root=False)
    assert err.value.exit_code == 25
    assert "must run as root" in err.value.message and "sudo invoke host-check" in err.value.hint
    assert "\n" not in err.value.hint
    assert snapshot(host) == before and smi.changes() == []
    assert not (host / "var").exists()


def test_root_is_the_effective_uid_by_default(host, monkeypatch):
    monkeypatch.setattr(hc.os, "geteuid", lambda: 1000)
    assert not hc.is_root()
    with pytest.raises(HostSetupFailed, match="must run as root"):
        hc.apply(host, runner=FakeSmi())


def _failing_write(monkeypatch, bad: Path, code: int) -> None:
    """Writes to bad fail with code, the way a read-only or vanished sysfs file does."""
    real = hc._write_sysfs

    def write(root: Path, path: str, text: str) -> None:
        if hc._under(root, path) == bad:
            raise OSError(code, os.strerror(code), str(bad))
        real(root, path, text)

    monkeypatch.setattr(hc, "_write_sysfs", write)


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOENT, errno.EINVAL])
def test_a_write_failing_half_way_puts_back_what_was_changed(host, monkeypatch, code):
    before = snapshot(host)
    bad = host / CPU / "cpu2/cpufreq/scaling_governor"
    _failing_write(monkeypatch, bad, code)
    smi = FakeSmi(1)
    with pytest.raises(HostSetupFailed) as err:
        hc.apply(host, runner=smi, as_root=True)
    assert str(bad) in err.value.message and "put back the 2 changes made before it" in err.value.message
    assert err.value.exit_code == 25
    assert snapshot(host) == before  # cpu0 and cpu1 are powersave again, the rest untouched
    assert smi.changes() == []  # the GPUs come after the files
    assert not (host / "var/lib/torchbuild/host-state.json").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files anyway (the test above covers it)")
def test_a_read_only_file_half_way_puts_back_what_was_changed(host):
    before = snapshot(host)
    bad = host / CPU / "smt/control"
    bad.chmod(0o444)
    with pytest.raises(HostSetupFailed, match=re.escape(str(bad))):
        hc.apply(host, runner=FakeSmi(1), as_root=True)
    assert snapshot(host) == before


def test_a_failing_gpu_command_puts_back_the_files_and_the_gpus(host, tmp_path):
    before = snapshot(host)
    smi = FakeSmi(2, fail=["-i 1 -lgc 1980,1980"])
    state = tmp_path / "state.json"
    with pytest.raises(HostSetupFailed) as err:
        hc.apply(host, state, runner=smi, as_root=True)
    assert "nvidia-smi -i 1 -lgc 1980,1980" in err.value.message and "not supported" in err.value.message
    assert snapshot(host) == before
    assert smi.gpus == [{"persistence": "Disabled", "locked": None}] * 2
    assert smi.changes()[-3:] == ["-i 1 -pm 0", "-i 0 -rgc", "-i 0 -pm 0"]
    assert not state.exists()


def test_a_failed_apply_leaves_an_earlier_state_file_as_it_was(host, tmp_path, monkeypatch):
    state = tmp_path / "state.json"
    smi = FakeSmi(1)
    put(host, f"{CPU}/intel_pstate/no_turbo", "1\n")
    hc.apply(host, state, runner=smi, as_root=True)
    saved = state.read_bytes()
    put(host, f"{CPU}/intel_pstate/no_turbo", "0\n")  # someone turned turbo back on
    _failing_write(monkeypatch, host / CPU / "intel_pstate/no_turbo", errno.EBUSY)
    with pytest.raises(HostSetupFailed):
        hc.apply(host, state, runner=smi, as_root=True)
    assert state.read_bytes() == saved


def test_a_restore_that_fails_keeps_only_what_is_left(host, tmp_path, monkeypatch):
    state = tmp_path / "state.json"
    smi = FakeSmi(1)
    hc.apply(host, state, runner=smi, as_root=True)
    _failing_write(monkeypatch, host / CPU / "cpu3/cpufreq/scaling_governor", errno.EROFS)
    with pytest.raises(HostSetupFailed, match="cpu3/cpufreq/scaling_governor"):
        hc.restore(host, state, runner=smi, as_root=True)
    left = json.loads(state.read_text())
    assert [f["path"] for f in left["files"]] == [f"/{CPU}/cpu3/cpufreq/scaling_governor"] and left["gpus"] == []
    assert (host / CPU / "cpu0/cpufreq/scaling_governor").read_text() == "powersave\n"
    monkeypatch.undo()
    hc.restore(host, state, runner=smi, as_root=True)
    assert (host / CPU / "cpu3/cpufreq/scaling_governor").read_text() == "powersave\n"
    assert not state.exists()


def test_a_state_file_that_cannot_be_saved_changes_nothing(host, tmp_path, monkeypatch):
    before = snapshot(host)
    smi = FakeSmi(1)
    blocker = put(tmp_path, "file", "")  # a file where the state's directory should be
    with pytest.raises(PathError, match=r"file.state\.json \(or a parent of it\) exists and is not a directory"):
        hc.apply(host, blocker / "state.json", runner=smi, as_root=True)

    def full(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(hc, "_write_atomically", full)
    with pytest.raises(HostSetupFailed, match=r"cannot save the previous settings to .*; nothing was changed") as err:
        hc.apply(host, tmp_path / "state.json", runner=smi, as_root=True)
    assert "free space" in err.value.hint
    assert snapshot(host) == before and smi.changes() == []


def test_a_default_state_file_that_cannot_be_made_says_so_not_the_kernel(host):
    put(host, "var/lib/torchbuild", "a file where the state's directory goes\n")
    before = snapshot(host)
    with pytest.raises(
        PathError, match=r"torchbuild.host-state\.json \(or a parent of it\) exists and is not a"
    ) as err:
        hc.apply(host, runner=FakeSmi(0), as_root=True)
    assert "kernel" not in err.value.hint
    assert snapshot(host) == before


# --------------------------------------------------------------------------- symlinks under --root


def outside_file(tmp_path: Path) -> Path:
    """A file outside the fake root holding what a setting would: --apply would change it."""
    return put(tmp_path, "outside/secret", "powersave\nSECRET\n")


def escaping_links(host: Path, outside: Path) -> None:
    """Setting files replaced by symlinks that lead out of host: absolute, relative with
    enough `..`, and through a directory symlink (cpu3/cpufreq -> the directory outside)."""
    links = {
        f"{CPU}/cpu1/cpufreq/scaling_governor": str(outside),
        f"{CPU}/cpu2/cpufreq/scaling_governor": "../" * 12 + str(outside).lstrip("/"),
        f"{CPU}/smt/control": str(outside),
        f"{CPU}/cpu3/cpufreq": str(outside.parent),
    }
    shutil.rmtree(host / CPU / "cpu3/cpufreq")
    for rel, target in links.items():
        (host / rel).unlink(missing_ok=True)
        (host / rel).symlink_to(target)
    outside.with_name("scaling_governor").write_text("powersave\n")


def test_apply_never_follows_a_symlink_out_of_root(host, tmp_path):
    outside = outside_file(tmp_path)
    escaping_links(host, outside)
    state = tmp_path / "state.json"
    before = {p: p.read_bytes() for p in outside.parent.iterdir()}
    done = hc.apply(host, state, runner=FakeSmi(0), as_root=True)
    assert {p: p.read_bytes() for p in outside.parent.iterdir()} == before
    text = state.read_text()
    assert "SECRET" not in text  # the target's content is never recorded
    saved = {f["path"] for f in json.loads(text)["files"]}
    assert saved == {
        f"/{CPU}/cpu0/cpufreq/scaling_governor",
        f"/{CPU}/intel_pstate/no_turbo",
        "/proc/sys/kernel/perf_event_max_sample_rate",
    }
    assert done[0] == "cpu governor: powersave -> performance on cpu0"
    # the report reads inside root too: the links are missing files there
    assert rows(hc.check(host, runner=no_gpu))["smt"].verdict == UNKNOWN
    hc.restore(host, state, runner=FakeSmi(0), as_root=True)
    assert {p: p.read_bytes() for p in outside.parent.iterdir()} == before


@pytest.mark.parametrize("kind", ["absolute", "relative", "loop", "fifo"])
def test_restore_never_writes_through_what_was_put_in_a_setting_s_place(host, tmp_path, kind):
    outside = outside_file(tmp_path)
    state = tmp_path / "state.json"
    hc.apply(host, state, runner=FakeSmi(0), as_root=True)
    planted = host / CPU / "smt/control"
    planted.unlink()
    if kind == "absolute":
        planted.symlink_to(outside)
    elif kind == "relative":
        planted.symlink_to("../" * 12 + str(outside).lstrip("/"))
    elif kind == "loop":
        planted.symlink_to(planted.name)
    else:
        os.mkfifo(planted)
    with pytest.raises(HostSetupFailed, match=re.escape(str(planted))) as err:
        hc.restore(host, state, runner=FakeSmi(0), as_root=True)
    assert err.value.exit_code == 25
    assert outside.read_text() == "powersave\nSECRET\n"
    assert [f["path"] for f in json.loads(state.read_text())["files"]] == [f"/{CPU}/smt/control"]
    assert (host / CPU / "cpu0/cpufreq/scaling_governor").read_text() == "powersave\n"  # the rest put back


def test_symlinks_inside_root_are_followed_as_in_root(host, tmp_path):
    """Real sysfs links cpuN/cpufreq to ../cpufreq/policyN; an absolute link means root's own
    path, as it would after chroot, not this machine's."""
    for i, target in ((0, "../cpufreq/policy0"), (1, f"/{CPU}/cpufreq/policy1")):
        put(host, f"{CPU}/cpufreq/policy{i}/scaling_governor", "powersave\n")
        put(host, f"{CPU}/cpufreq/policy{i}/scaling_available_governors", "performance powersave\n")
        shutil.rmtree(host / CPU / f"cpu{i}/cpufreq")
        (host / CPU / f"cpu{i}/cpufreq").symlink_to(target)
    before = snapshot(host)
    state = tmp_path / "state.json"
    hc.apply(host, state, runner=FakeSmi(0), as_root=True)
    assert (host / CPU / "cpufreq/policy0/scaling_governor").read_text() == "performance\n"
    assert (host / CPU / "cpufreq/policy1/scaling_governor").read_text() == "performance\n"
    hc.restore(host, state, runner=FakeSmi(0), as_root=True)
    assert snapshot(host) == before


def test_the_default_state_file_stays_inside_root(host, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (host / "var").symlink_to(elsewhere)  # root's /var -> a directory of this machine
    done = hc.apply(host, runner=FakeSmi(0), as_root=True)
    assert list(elsewhere.iterdir()) == []
    state = hc.default_state_file(host)
    assert state.is_file() and state.resolve().is_relative_to(host.resolve())
    assert done[-1].startswith(f"saved the previous values to {state}")


# --------------------------------------------------------------------------- hostile files


@pytest.mark.parametrize(
    "online",
    ["0-400000000", "0-3,400000000", "9" * 5000, "0-" + "9" * 5000, "4294967296", "0-3:2/" + "9" * 5000],
)
def test_an_impossible_online_cpu_list_falls_back_to_the_cpu_directories(host, online):
    put(host, f"{CPU}/online", online + "\n")
    assert hc.apply(host, host / "state.json", runner=FakeSmi(0), as_root=True)[0] == (
        "cpu governor: powersave -> performance on cpu0-3"
    )


@pytest.mark.parametrize("kind", ["fifo", "huge", "directory"])
def test_an_odd_setting_file_is_unknown_and_never_blocks(host, kind):
    target = host / CPU / "smt/control"
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)  # opening it for reading would wait for a writer
    elif kind == "huge":
        target.write_bytes(b"on" + b" " * (hc.SETTING_LIMIT + 1))
    else:
        target.mkdir()
    assert rows(hc.check(host, runner=no_gpu))["smt"].verdict == UNKNOWN
    hc.apply(host, host / "state.json", runner=FakeSmi(0), as_root=True)
    assert f"/{CPU}/smt/control" not in (host / "state.json").read_text()


def good_state(host: Path) -> dict:
    return {"schema": "torchbuild.host-state", "version": 1, "root": str(host.resolve()), "files": [], "gpus": []}


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe{\x00\x00binary",
        b'{"schema": "torchbuild.host-state", "note": "caf\xe9"}',
        b"[" * 100_000,
        b'{"schema": "torchbuild.host-state", "version": NaN, "files": [], "gpus": []}',
        b'{"schema": "torchbuild.host-state", "version": "one", "files": [], "gpus": []}',
        b'{"schema": "torchbuild.host-state", "version": 1, "files": [], "gpus": [{"index": "0", "locked_mhz": "x"}]}',
        b'{"schema": "torchbuild.host-state", "version": 1, "gpus": [], "files": '
        b'[{"path": "/sys/devices/system/cpu/smt/control", "previous": "on", "applied": 5}]}',
    ],
)
def test_a_state_file_that_is_not_one_is_a_named_error_for_apply_and_restore(host, tmp_path, content):
    state = tmp_path / "state.json"
    state.write_bytes(content)
    before = snapshot(host)
    for action in (hc.apply, hc.restore):
        with pytest.raises(HostSetupFailed, match="is not a host-check state file") as err:
            action(host, state, runner=FakeSmi(0), as_root=True)
        assert err.value.exit_code == 25 and "\n" not in err.value.message
    assert snapshot(host) == before and state.read_bytes() == content
    assert rows(hc.check(host, runner=no_gpu, state_file=state))["smt"].verdict == NOT_READY  # the report is made


@pytest.mark.parametrize("kind", ["directory", "fifo", "device", "huge"])
def test_a_state_path_that_cannot_be_a_state_file_is_a_path_error_naming_it(host, tmp_path, kind):
    state = tmp_path / "state"
    if kind == "directory":
        state.mkdir()
    elif kind == "fifo":
        os.mkfifo(state)
    elif kind == "device":
        state = Path("/dev/zero")
    else:
        state.write_bytes(b" " * (5 << 20))
    before = snapshot(host)
    for action in (hc.apply, hc.restore):
        with pytest.raises(PathError, match=re.escape(str(state))) as err:
            action(host, state, runner=FakeSmi(0), as_root=True)
        assert err.value.exit_code == 15 and "kernel" not in err.value.hint
    assert snapshot(host) == before


def test_task_with_a_directory_as_state_names_it(host, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hc, "is_root", lambda: True)
    monkeypatch.delenv("TORCHBUILD_DEBUG", raising=False)
    (tmp_path / "dir").mkdir()
    for option in ("apply", "restore"):
        with pytest.raises(Exit) as done:
            host_check(Context(), root=str(host), state=str(tmp_path / "dir"), **{option: True})
        assert done.value.code == 15
        err = capsys.readouterr().err
        assert f"error: PathError: the host-check state file (--state): {tmp_path / 'dir'} is a directory" in err
        assert "kernel refused" not in err and "Traceback" not in err


# --------------------------------------------------------------------------- the task


@pytest.fixture
def pyperf_on_host(host, monkeypatch):
    """The task's report with pyperf reading the fake tree (the task runs it only for /)."""
    check = hc.check
    monkeypatch.setattr(hc, "check", lambda root, **kw: check(root, pyperf=pyperf_on(host), **kw))


def test_task_reports_and_exits_0_when_not_ready(host, capsys, pyperf_on_host):
    host_check(Context(), root=str(host))
    out = capsys.readouterr().out
    assert "NOT READY" in out and "cpu governor" in out and "cmdline += isolcpus=2-3 rcu_nocbs=2-3" in out


def test_task_strict_exits_1_with_one_line(host, capsys, pyperf_on_host):
    with pytest.raises(Exit) as done:
        host_check(Context(), root=str(host), strict=True)
    assert done.value.code == 1
    assert done.value.message == (
        "host-check: not ready: cpu governor, turbo boost, smt, c-states, isolated cpus, perf event"
    )


def test_task_json_apply_and_restore(host, capsys, monkeypatch, pyperf_on_host):
    monkeypatch.setattr(hc, "is_root", lambda: True)
    before = snapshot(host)
    host_check(Context(), root=str(host), apply=True, json_=True)
    report = json.loads(capsys.readouterr().out)
    assert report["state_saved"] and any("powersave -> performance" in line for line in report["changed"])
    assert {s["name"]: s["verdict"] for s in report["settings"]}["smt"] == READY
    assert report["ready"] is False  # the boot-time settings are not
    # governor, turbo, smt, perf event, pyperf's cpu frequency; no GPU queried for a fake root
    assert report["counts"] == {READY: 5, NOT_READY: 2, UNKNOWN: 1}
    host_check(Context(), root=str(host), restore=True, json_=True)
    report = json.loads(capsys.readouterr().out)
    assert not report["state_saved"] and report["restored"][-1].startswith("removed")
    assert snapshot(host) == before


def test_task_without_root_exits_25(host, monkeypatch, capsys):
    monkeypatch.setattr(hc, "is_root", lambda: False)
    monkeypatch.delenv("TORCHBUILD_DEBUG", raising=False)
    with pytest.raises(Exit) as done:
        host_check(Context(), root=str(host), apply=True)
    assert done.value.code == 25
    err = capsys.readouterr().err
    assert "error: HostSetupFailed:" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("hint:")]) == 1


def test_task_refuses_apply_with_restore_and_a_root_that_is_no_directory(host):
    with pytest.raises(Exit) as done:
        host_check(Context(), root=str(host), apply=True, restore=True)
    assert done.value.code == 2
    with pytest.raises(Exit) as done:
        host_check(Context(), root=str(host / "nowhere"))
    assert done.value.code == 2


# --------------------------------------------------------------------------- this machine


def test_this_machine_s_own_report():
    settings = hc.check("/")
    names = [s.name for s in settings]
    assert names[: len(hc.CPU_SETTINGS)] == list(hc.CPU_SETTINGS)
    # then pyperf's other rows (perf event, aslr... as this machine has them), then the GPU rows
    gpus = [n for n in names if n.startswith("gpu")]
    assert gpus and names[-len(gpus) :] == gpus
    # the CPU rows are pyperf's: its words for the isolated CPUs (a Linux host always has them)
    iso = {s.name: s for s in settings}["isolated cpus"].value
    assert iso.startswith(("No CPU is isolated", "Isolated CPUs")), iso
    assert all(s.verdict in hc.VERDICTS for s in settings)
    assert "setting" in hc.render(settings)
    json.loads(hc.as_json(settings))
