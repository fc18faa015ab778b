"""Shared pieces of the invoke tasks: the error handler, the common options' help, and the
one place a task turns its runtime options into a backend."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import select
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import invoke.parser.parser
from invoke.collection import Collection
from invoke.exceptions import Exit, ParseError
from invoke.parser.argument import Argument
from invoke.parser.context import translate_underscores
from invoke.tasks import Task
from invoke.tasks import task as invoke_task

from torchbuild.core.console import printable as console_printable
from torchbuild.core.dirs import removing_made_dirs
from torchbuild.core.errors import (
    PathError,
    TorchbuildError,
    UsageError,
    debug_enabled,
    fault_path,
    os_fault,
    report,
)
from torchbuild.core.options import flags, from_flags
from torchbuild.core.safeio import not_an_option
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime.backends import Backend, Options, choose, engine_for
from torchbuild.runtime.flags import derive
from torchbuild.runtime.options import LaunchOptions, ProfileChoice
from torchbuild.runtime.options import profile_name as profile_name  # re-exported: the tasks import them here
from torchbuild.runtime.options import spec_from as spec_from

F = TypeVar("F", bound=Callable[..., Any])

# the launch options' help, from their declarations (runtime/options.py): the profile's
# (ProfileChoice: profile, arch, set_), then where the step runs (the rest of LaunchOptions)
HELP = {f.name: f.help for f in flags(ProfileChoice)}
RUNTIME_HELP = {f.name: f.help for f in flags(LaunchOptions) if f.name not in HELP}
# runtime options only some tasks take (read by backend_from when the task has them)
EXTRA_RUNTIME = ("host_mpi",)


# `invoke config | head -1`: the exit status of a program whose reader went away, as a shell
# reports a Unix tool killed by SIGPIPE (Python ignores SIGPIPE and raises BrokenPipeError)
BROKEN_PIPE_EXIT = 128 + signal.SIGPIPE


def stdout_reader_gone() -> bool:
    """Whether standard output is a pipe (or socket) whose reading end was closed: poll(2)
    says POLLERR for the writing end then. A BrokenPipeError from elsewhere (a child's stdin)
    is a real fault, not this."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no stdout, or one without a descriptor
        return False


def quiet_exit_for_closed_stdout() -> int:
    """Point standard output at /dev/null (Python's last flush at exit would fail again and say
    so) and return BROKEN_PIPE_EXIT: nothing is printed, as `yes | head -1` prints nothing."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return BROKEN_PIPE_EXIT


def _broken_pipe_hook(previous: Callable[..., Any]) -> Callable[..., Any]:
    """sys.excepthook for what invoke itself prints before a task runs (`invoke --list | head`):
    a BrokenPipeError on a closed stdout ends the program quietly; anything else goes on to the
    hook there was."""

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if issubclass(kind, BrokenPipeError) and stdout_reader_gone() and not debug_enabled():
            os._exit(quiet_exit_for_closed_stdout())  # the interpreter's exit would flush stdout again
        previous(kind, value, tb)

    return hook


sys.excepthook = _broken_pipe_hook(sys.excepthook)


def handles_errors(fn: F) -> F:
    """Print named errors as `error:` + `hint:` and exit with their code (traceback with --debug).
    An operating-system fault no step named (a full disk, a read-only or vanished path) is named
    here: InsufficientSpace or PathError with the path, never a traceback. A reader that closed
    standard output early (`invoke config | head -1`) ends the task quietly (BROKEN_PIPE_EXIT).
    A failed task removes the directories it made (core/dirs.make_dirs) that are still empty."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with removing_made_dirs():  # a failed task leaves no empty directory it made
                return fn(*args, **kwargs)
        except (TorchbuildError, OSError) as exc:
            if debug_enabled():
                raise
            if isinstance(exc, BrokenPipeError) and stdout_reader_gone():
                raise Exit(code=quiet_exit_for_closed_stdout()) from None
            err = (
                exc
                if isinstance(exc, TorchbuildError)
                else os_fault(exc, fault_path(exc) or "", f"invoke {fn.__name__}")
            )
            raise Exit(code=report(err)) from None
        except ValueError as exc:  # a path with a NUL byte that no check named: every system call refuses it
            if debug_enabled() or "null byte" not in str(exc):
                raise
            raise Exit(
                code=report(
                    PathError(f"invoke {fn.__name__}: a path holds a NUL byte", hint="write the path without it")
                )
            ) from None

    return wrapper  # type: ignore[return-value]


def backend_from(spec: BuildSpec, given: Mapping[str, Any]) -> Backend:
    """The backend a task's runtime options name (given: the task's locals(); the keys of
    RUNTIME_HELP are read): --engine checked by engine_for, options the engine cannot honour
    refused by choose."""
    opts = {key: given[key] for key in (*RUNTIME_HELP, *EXTRA_RUNTIME) if key in given}
    engine = engine_for(str(opts.pop("engine", "") or ""), bool(opts.pop("in_container", False)))
    sif = opts.pop("sif", "")
    options = Options(sif=Path(sif) if sif else None, **opts)
    return choose(spec, engine, options)


@dataclass(frozen=True)
class Launch(LaunchOptions):
    """The launch options (LaunchOptions: their flags and help) as a task gets them; spec() is
    ProfileChoice's."""

    @property
    def runtime(self) -> str:
        """native, docker or apptainer: where the step runs (engine_for)."""
        return engine_for(self.engine, self.in_container)

    def backend(self, spec: BuildSpec, **extra: Any) -> Backend:
        """The backend these options name; extra: a task's own runtime options (EXTRA_RUNTIME)."""
        return backend_from(spec, {**asdict(self), **extra})


_LAUNCH_PARAMS = [
    inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.cli_default)
    for f in flags(LaunchOptions)
]


# One short flag per launch option, the same in every task that takes them (build's, from
# before they were shared); user has none there (-u is build's --out). A task's own options
# get the first free letter of their name, after these, in the order the task lists them.
LAUNCH_SHORT = {
    "profile": "p",
    "arch": "a",
    "set_": "s",
    "in_container": "i",
    "engine": "e",
    "sif": "f",
    "apptainer": "t",
    "nv": "n",
    "memory": "m",
    "rebuild_image": "b",
}


# The words that ask for help: never a value, whatever the option or positional before them.
HELP_WORDS = ("--help", "-h")
# Short flags no task may take: -h is --help; "-" would make `--` an option (invoke picks the
# first free character of the name: "-" for --no-retry, --gpu-type...).
RESERVED_SHORT = frozenset({"h", "-"})
# Options whose values are themselves options of another program, so they may start with '-':
# scheduler directives (submit), apt-get options (image), the benchmark script's arguments (bench).
OPTION_VALUES = frozenset({"directive", "apt_option", "args"})
# the program name the help printed for a task says (cli.program() sets "torchbuild")
PROGRAM = {"binary": "inv[oke]"}
# the collection of every task; tasks/__init__.py puts it here once it is built (this module
# must not import the package, which imports every task module, which imports this one)
COLLECTION: dict[str, Collection] = {}


class _Owner:
    """The task an Argument belongs to, shared (not copied) when invoke's parser deep-copies
    its contexts."""

    def __init__(self, task: Task) -> None:  # type: ignore[type-arg]
        self.task = task

    def __deepcopy__(self, memo: dict[int, Any]) -> _Owner:
        return self


def print_task_help(task: Task) -> None:  # type: ignore[type-arg]
    """What `invoke --help TASK` prints, for the task of the collection that is `task`."""
    from invoke.parser import Parser
    from invoke.program import Program

    ns = COLLECTION["ns"]
    # by body: invoke loading tasks.py copies the sub-collections (and their tasks)
    name = next((n for n in ns.task_names if ns[n].body is task.body), task.name or task.body.__name__)
    program = Program(namespace=ns, binary=PROGRAM["binary"])
    program.collection = ns
    program.parser = Parser(contexts=ns.to_contexts())
    program.print_task_help(name)


def _flag(name: str) -> str:
    """An argument's long flag as the help shows it: --set for set_, --gpu-type for gpu_type."""
    return "--" + translate_underscores(name)


def _usage_exit(err: UsageError) -> Exit:
    """The Exit that ends the program with err reported (err itself with --debug)."""
    if debug_enabled():
        raise err
    return Exit(code=report(err))


# what an option of each kind takes, for the error naming a value it cannot take
_KINDS = {int: ("a whole number", "2"), float: ("a number", "1800")}


class TaskArgument(Argument):
    """An option or positional of a torchbuild task. Invoke's parser gives a positional (or an
    option waiting for its value) the next word whatever it is, so `invoke wheelhouse --help`
    made a wheelhouse named ./--help. Here `--help`/`-h` print the task's help and end the
    program before any task runs; any other value starting with '-' is a UsageError (except
    where the value is itself an option: OPTION_VALUES), and so is a value an int or float
    option cannot take (`--nodes 2.5`: invoke's int() raised ValueError, a traceback)."""

    owner: _Owner
    takes_options: bool = False

    def set_value(self, value: Any, cast: bool = True) -> None:
        flag = _flag(self.names[0])
        if isinstance(value, str) and value.startswith("-"):
            if value in HELP_WORDS:
                print_task_help(self.owner.task)
                raise Exit(code=0)
            if not self.takes_options:
                try:
                    not_an_option(value, flag)
                except UsageError as err:
                    raise _usage_exit(err) from None
        try:
            super().set_value(value, cast)
        except ValueError:
            if not cast or self.kind not in _KINDS:
                raise
            what, example = _KINDS[self.kind]
            raise _usage_exit(
                UsageError(f"{flag} {value!r} is not {what}", hint=f"give {flag} {what}, e.g. {flag} {example}")
            ) from None


class CommandLineError(ParseError, Exit):
    """A command line invoke's parser cannot read (an option missing its value, an unknown word):
    reported as a UsageError (`error: UsageError: ...`, a hint, exit 2) instead of invoke's own
    line, which named internal objects (`Flag <TaskArgument: prefix (r) *> needed value`) and
    exited 1. It is a ParseError, so every `except ParseError` of invoke still catches it, and
    an Exit, so invoke's Program exits with its code (Program.run checks Exit before ParseError
    for the code, and prints no Exit message: the text is this error's str)."""

    def __init__(self, msg: str, context: Any = None) -> None:
        ParseError.__init__(self, msg, context)
        Exit.__init__(self, None, UsageError.exit_code)
        self.usage = self._usage(msg, context)

    @staticmethod
    def _usage(msg: str, context: Any) -> UsageError:
        # <TaskArgument: prefix (r) *> -> --prefix; <TaskArgument: set_ ...> -> --set
        text = re.sub(r"<\w*Argument: ([\w-]+)[^>]*>", lambda m: _flag(m.group(1)), msg)
        missing = re.fullmatch(r"Flag (--[\w-]+) needed value and was not given one!", text)
        unknown = re.fullmatch(r"No idea what '(.*)' is!", text, re.DOTALL)
        task = getattr(context, "name", None)
        program = "torchbuild" if PROGRAM["binary"] == "torchbuild" else "invoke"
        where = f"{program} {task}: " if task else ""
        positional = re.fullmatch(r"'.*' did not receive required positional arguments: (.*)", text)
        if positional:
            return UsageError(
                f"{where}the argument {positional.group(1)} is missing",
                hint=f"`{program} --help {task}` shows the task's arguments",
            )
        if missing:
            flag = missing.group(1)
            return UsageError(
                f"{where}{flag} needs a value",
                hint=f"write {flag} VALUE (a word starting with '-' is the next option, not the value)",
            )
        if unknown:
            return UsageError(
                f"{where}no option or task {console_printable(unknown.group(1))!r}",
                hint="`invoke --list` lists the tasks, `invoke --help TASK` the options of one",
            )
        return UsageError(f"{where}{console_printable(text.rstrip('!'))}")

    def __str__(self) -> str:
        name = type(self.usage).__name__
        return f"error: {name}: {self.usage.message}\nhint: {self.usage.hint}"


# Invoke's parser raises the ParseError its module names (invoke/parser/parser.py's `from
# ..exceptions import ParseError`); naming CommandLineError there makes every parse error of
# `invoke` (tasks.py imports this package before it parses the tasks' words) and of the
# `torchbuild` program a UsageError. Invoke offers no other hook: its Program is not ours
# when the `invoke` command runs.
setattr(invoke.parser.parser, "ParseError", CommandLineError)  # noqa: B010


_invoke_complete_flag = invoke.parser.parser.ParseMachine.complete_flag


def _complete_flag(machine: Any) -> None:
    """Invoke's ParseMachine.complete_flag, which also refuses a repeatable option seen again
    without a value (`--set a=1 --set`): invoke's own check looks only at the option's raw value,
    already the list of the earlier values, so the bare one was dropped. The machine's
    flag_got_value says whether this occurrence had its value. Set on invoke's class like
    ParseError above: the machine is fluidity's state machine, whose states a subclass does not
    inherit, and invoke offers no hook."""
    flag = machine.flag
    repeatable = flag is not None and flag.takes_value and flag.kind is list and not flag.optional
    if repeatable and not machine.flag_got_value:
        machine.error(f"Flag {flag!r} needed value and was not given one!")
    _invoke_complete_flag(machine)


setattr(invoke.parser.parser.ParseMachine, "complete_flag", _complete_flag)  # noqa: B010


class TorchbuildTask(Task):  # type: ignore[type-arg]
    """Every torchbuild task (`task` below makes them): its arguments are TaskArguments, and no
    option has a reserved short flag (RESERVED_SHORT): the option invoke would give one has none,
    and every other option keeps the short flag it had. A repeatable option given without a
    value (`--set` at the end, or before another option, also after an earlier `--set a=1`) is
    a UsageError (_complete_flag)."""

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        given_help = dict(self.help)  # invoke pops each help text as it uses it: keep them for the next call
        try:
            args: list[Argument] = super().get_arguments(ignore_unknown_help)
        finally:
            self.help = given_help
        owner = _Owner(self)
        for arg in args:
            arg.names = tuple(n for n in arg.names if n not in RESERVED_SHORT)
            arg.__class__ = TaskArgument  # same attributes; set_value checks the words given
            guarded = cast(TaskArgument, arg)
            guarded.owner = owner
            guarded.takes_options = arg.name in OPTION_VALUES
            if arg.kind is list:
                # invoke starts a repeatable option's raw value as [], never None, so its parser's
                # "needed value and was not given one" never fired: a bare `--set` was dropped
                arg.raw_value = None
        return args


def task(**kwargs: Any) -> Callable[[Callable[..., Any]], TorchbuildTask]:
    """invoke's @task(...), making a TorchbuildTask."""
    made: Callable[[Callable[..., Any]], TorchbuildTask] = invoke_task(klass=TorchbuildTask, **kwargs)
    return made


class LaunchTask(TorchbuildTask):
    """A Task whose launch options keep the short flags of LAUNCH_SHORT. Invoke would pick them
    in signature order, so adding an option could move -s from --set to --source; and it never
    picks "-" (invoke would, for --no-retry: build's is -y)."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        pinned = LAUNCH_SHORT.get(name)
        self.auto_shortflags = pinned is None
        try:
            opts: dict[str, Any] = super().arg_opts(name, default, {*taken_names, *LAUNCH_SHORT.values(), "-"})
        finally:
            self.auto_shortflags = True
        if pinned:
            opts["names"].append(pinned)
        return opts


def launch_task(
    help: Mapping[str, str] = {},
    iterable: Iterable[str] = (),
    name: str = "",
    models: Mapping[str, type] = {},
    keys: str = "",
    exclude: Iterable[str] = (),
) -> Callable[[F], LaunchTask]:
    """@task for a task whose body is fn(c, launch: Launch, *its own options): the Launch options
    are added to its command line (with their help) in one place, and errors are handled. A
    parameter named in models stands for its model's flags, the one named keys for the profile
    keys' flags (runtime/flags.py derive)."""

    def decorate(fn: F) -> LaunchTask:
        derived = derive(fn, models, keys, exclude)
        context, own = derived.params[0], derived.params[2:]

        @functools.wraps(fn)
        def body(c: Any, *args: Any, **kwargs: Any) -> Any:
            given = {p.name: kwargs.pop(p.name) for p in _LAUNCH_PARAMS if p.name in kwargs}
            return fn(c, from_flags(Launch, given), *args, **derived.call(kwargs))

        body.__signature__ = inspect.Signature([context, *own, *_LAUNCH_PARAMS])  # type: ignore[attr-defined]
        options: dict[str, Any] = {
            "help": {**HELP, **RUNTIME_HELP, **derived.help, **help},
            "iterable": ["set_", *derived.repeatable, *iterable],
            "klass": LaunchTask,
        }
        if name:
            options["name"] = name
        made: LaunchTask = invoke_task(**options)(handles_errors(body))
        return made

    return decorate


def options_task(
    *,
    models: Mapping[str, type] = {},
    keys: str = "",
    exclude: Iterable[str] = (),
    help: Mapping[str, str] = {},
    iterable: Iterable[str] = (),
    name: str = "",
) -> Callable[[F], TorchbuildTask]:
    """@task whose flags come from models (runtime/flags.py derive): each parameter of the body
    named in models is that model, built from its fields' flags; the one named keys is the
    profile-key flags given (key -> text). help adds to or overrides the declared help; name is
    the task's name where it is not the function's (host-check)."""

    def decorate(fn: F) -> TorchbuildTask:
        derived = derive(fn, models, keys, exclude)

        @functools.wraps(fn)
        def body(c: Any, *args: Any, **kwargs: Any) -> Any:
            return fn(c, *args, **derived.call(kwargs))

        body.__signature__ = inspect.Signature(derived.params)  # type: ignore[attr-defined]
        helps = {**derived.help, **help}
        repeatable = [*derived.repeatable, *iterable]
        options: dict[str, Any] = {"klass": TorchbuildTask, "help": helps, "iterable": repeatable}
        if name:
            options["name"] = name
        made: TorchbuildTask = invoke_task(**options)(handles_errors(body))
        return made

    return decorate
