"""Options declared once, as fields of a frozen dataclass: the field is the typed value a step
gets, its metadata the flag's name and help. The tasks' flags and help (runtime/tasks.py
options_task), the typed request (from_flags) and the argv a batch job passes on (to_argv) all
derive from the field, so an option is one line.

    @dataclass(frozen=True)
    class BuildArgs:
        jobs: int = option(0, "parallel compile jobs", parse=parse_jobs_option)
        targets: tuple[str, ...] = option((), "preflight CMake target (repeatable)", flag="target")
        verify: bool = option(True, "skip verifying the wheel", flag="no_verify")

A tuple field is a repeatable flag; a bool field whose default is True is set off by its flag
(--no-verify); parse turns the flag's text into the field's value (a UsageError for bad text).
A field declared with positional(help) has no default: invoke takes it as a positional argument
(`torchbuild inside.step NAME FILE`), in field order.
Kept here rather than through a CLI library (click, typer, cyclopts): invoke stays the command
line, and what it needs from a model is a signature and a help dict, which runtime/tasks.py builds.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from torchbuild.core.problems import Problems

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Option:
    """A field's flag: its name (underscores, as invoke takes it: no_retry is --no-retry), its
    help, and parse (the flag's text to the field's value)."""

    name: str
    help: str
    parse: Callable[[Any], Any] | None = None


def option(default: Any, help: str, *, flag: str = "", parse: Callable[[Any], Any] | None = None) -> Any:
    """A field with a flag (named as the field unless flag names it)."""
    return dataclasses.field(default=default, metadata={"option": Option(flag, help, parse)})


def like(model: type, field: str) -> Any:
    """A field declared as model's field is: its default, flag name, help and parse, for a model
    that takes the same option into another request (the job's Runtime takes --sif as
    LaunchOptions does). A field whose default or help differs is its own option(...)."""
    (same,) = [f for f in dataclasses.fields(model) if f.name == field]
    opt = same.metadata["option"]
    named = dataclasses.replace(opt, name=opt.name or field)  # its flag, whatever this field is called
    return dataclasses.field(default=same.default, metadata={"option": named})


def positional(help: str) -> Any:
    """A field with no default: a positional argument of the task (invoke makes a parameter
    without a default one), with its help."""
    return dataclasses.field(metadata={"option": Option("", help)})


@dataclasses.dataclass(frozen=True)
class Flag:
    """One field's flag as a task takes it."""

    field: str
    name: str
    help: str
    default: Any  # the field's default: a tuple for a repeatable flag
    parse: Callable[[Any], Any] | None

    @property
    def repeatable(self) -> bool:
        return isinstance(self.default, tuple)

    @property
    def negated(self) -> bool:
        """A bool field on by default, set off by its flag (verify by --no-verify)."""
        return self.default is True

    @property
    def positional(self) -> bool:
        """A field with no default (positional()): invoke's positional argument."""
        return self.default is dataclasses.MISSING

    @property
    def cli_default(self) -> Any:
        """What the flag's parameter defaults to: none for a positional one (inspect's empty),
        False for a bool flag, None for a repeatable one (invoke's), "" for a parsed one (not
        given), else the field's default."""
        if self.positional:
            return inspect.Parameter.empty
        if isinstance(self.default, bool):
            return False
        if self.repeatable:
            return None
        return "" if self.parse else self.default

    @property
    def option(self) -> str:
        return "--" + self.name.rstrip("_").replace("_", "-")


def flags(model: type, exclude: Iterable[str] = ()) -> list[Flag]:
    """The flags of a model's fields (those declared with option()), in field order."""
    out = []
    for field in dataclasses.fields(model):
        opt = field.metadata.get("option")
        if opt is None or field.name in exclude:
            continue
        out.append(Flag(field.name, opt.name or field.name, opt.help, field.default, opt.parse))
    return out


def flag_of(model: type, field: str) -> str:
    """A field's flag as it is typed (--sif), to name it in a message from its one declaration."""
    (flag,) = [f for f in flags(model) if f.field == field]
    return flag.option


def from_flags(
    model: type[T], given: Mapping[str, Any], exclude: Iterable[str] = (), problems: Problems | None = None
) -> T:
    """The typed request from the flags' values (given: by flag name, as the task got them);
    a flag left out of given, or excluded, keeps its field's default. With problems, a value its
    parse refuses is recorded there (the field keeps its default), to be named with the task's
    other problems at once."""
    values: dict[str, Any] = {}
    for flag in flags(model, exclude):
        if flag.name not in given:
            continue
        raw = given[flag.name]
        if flag.negated:
            values[flag.field] = not raw
        elif flag.repeatable:
            values[flag.field] = tuple(raw or ())
        elif flag.parse is not None:
            parse = functools.partial(flag.parse, raw)
            parsed = problems.check(parse) if problems is not None else parse()
            values[flag.field] = flag.default if parsed is None else parsed
        else:
            values[flag.field] = raw
    return model(**values)


def to_argv(request: Any, exclude: Iterable[str] = ()) -> list[str]:
    """The flags that give request again, each value joined to its flag (`--target=a b.cpp`:
    one word, so a value is never read as an option): only the fields that differ from their
    default. from_flags of what the task parses from this is request again."""
    argv: list[str] = []
    for flag in flags(type(request), exclude):
        value = getattr(request, flag.field)
        if value == flag.default:
            continue
        if isinstance(flag.default, bool):
            argv.append(flag.option)
        elif flag.repeatable:
            argv += [f"{flag.option}={item}" for item in value]
        else:
            argv.append(f"{flag.option}={value}")
    return argv
