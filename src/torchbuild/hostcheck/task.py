"""invoke host-check: is this machine set up for stable benchmark numbers (torchbench's machine_config)?"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from invoke.context import Context
from invoke.exceptions import Exit

from torchbuild.core.errors import UsageError
from torchbuild.core.options import option
from torchbuild.core.safeio import user_path
from torchbuild.hostcheck import host as hc
from torchbuild.runtime.tasks import options_task

# `invoke host-check --strict` when a setting is not ready. The report itself is no failure:
# HostSetupFailed's 25 stays for --apply/--restore failing, and 2..27 for the named errors.
NOT_READY_EXIT = 1


@dataclasses.dataclass(frozen=True)
class HostCheckFlags:
    """`invoke host-check`'s flags: where the host is read, whether to change it, and how to report."""

    root: str = option(
        "/", "read every /sys and /proc path under this directory (default /; pyperf and the GPUs only for /)"
    )
    apply: bool = option(
        False,
        "as root: set governor, turbo, SMT, perf event rate, GPU persistence and clocks, saving the previous values first",
    )
    restore: bool = option(False, "as root: put back the values --apply saved and remove the state file")
    state: str = option(
        "", "the state file --apply writes and --restore reads (default <root>/var/lib/torchbuild/host-state.json)"
    )
    json_: bool = option(False, "print the report as JSON (with the changes --apply or --restore made)")
    strict: bool = option(False, "exit 1 when a setting is not ready (unknown ones do not count)")


@options_task(models={"given": HostCheckFlags}, name="host-check")
def host_check(c: Context, given: HostCheckFlags) -> None:
    """Report what torchbench's machine_config checks: CPU governor, turbo, SMT, C-states, isolated CPUs, GPU persistence and clocks.

    Each setting gets a verdict (ready, not ready, unknown) and the command that fixes it; the
    boot-time ones (C-states, isolated CPUs) the words to add to the kernel command line.

    --apply (root only) makes the runtime changes after saving the previous values to the state
    file; a change that fails puts back the ones made before it. A second --apply keeps the
    state file's values (those from before the first one) and adds only what it lacks, so
    --restore always returns to the original host. --restore puts them back and removes the
    file (with no state file it does nothing).

    Exit status: 0 for the report, ready or not (it is a report); with --strict, 1 and one
    line on stderr naming the settings not ready (unknown ones, such as no GPU or no cpufreq in
    a VM, do not fail it: nothing here can fix them). 25 (HostSetupFailed) only when --apply or
    --restore fails or is run without root; 2 (UsageError) for --apply with --restore.
    """
    root, apply, restore = given.root, given.apply, given.restore
    _check_flags(root, apply=apply, restore=restore)
    state_file = user_path(given.state) if given.state else hc.default_state_file(root)
    actions = _change(root, state_file, apply=apply, restore=restore)
    settings = hc.check(root, state_file=state_file)
    _print_report(settings, actions, state_file, json_=given.json_, apply=apply, restore=restore)
    missing = hc.not_ready(settings)
    if given.strict and missing:
        raise Exit(
            message=f"host-check: not ready: {', '.join(s.name for s in missing)}",
            code=NOT_READY_EXIT,
        )


def _change(root: str, state_file: Path, *, apply: bool, restore: bool) -> list[str]:
    """--apply's or --restore's changes, made (what each did); none without them."""
    actions: list[str] = []
    if apply:
        actions = hc.apply(root, state_file)
    elif restore:
        actions = hc.restore(root, state_file)
    return actions


def _check_flags(root: str, *, apply: bool, restore: bool) -> None:
    """A UsageError for --apply with --restore, or a --root that is no directory."""
    if apply and restore:
        raise UsageError("--apply and --restore undo each other", hint="give one of them")
    if not Path(root).is_dir():
        raise UsageError(f"--root {root} is not a directory", hint="give the directory /sys and /proc are read under")


def _print_report(
    settings: list[hc.Setting], actions: list[str], state_file: Path, *, json_: bool, apply: bool, restore: bool
) -> None:
    """The report as JSON (with the state file and the changes made), else the changes made and the table."""
    if json_:
        extra: dict[str, object] = {"state_file": str(state_file), "state_saved": state_file.is_file()}
        if apply:
            extra["changed"] = actions
        if restore:
            extra["restored"] = actions
        print(hc.as_json(settings, **extra))
    else:
        if actions:
            print("\n".join(actions), end="\n\n")
        print(hc.render(settings))
