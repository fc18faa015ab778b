"""A task's flags from models: the signature and help of a task made from the fields of its
option models (core/options.py) and from the profile keys that have a flag (profile/keys.py
key(..., flag=HELP)); the body gets the typed requests. runtime/tasks.py's options_task and
launch_task use it.

Invoke stays the command line (`invoke submit --account x`): it reads a task's flags from the
function's signature and help dict, so the bridge is a signature made with inspect.Signature and
a help dict made from the same fields, in this one place; the flags are invoke's own, with
TorchbuildTask's guards (`--help` anywhere prints the help and runs nothing).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torchbuild.core.options import Flag, flags, from_flags
from torchbuild.core.problems import Problems
from torchbuild.profile.keys import flag_keys

_KIND = inspect.Parameter.POSITIONAL_OR_KEYWORD


def key_flags(exclude: Iterable[str] = ()) -> dict[str, str]:
    """The profile keys a task flag of the same name sets: name -> help (key(..., flag=HELP)).
    Each takes the key's value as text, checked as a --set of the key is. Not the bool keys:
    their switches are fields of option models (profile/keys.py key_option)."""
    return {name: spec.flag for name, spec in flag_keys().items() if name not in exclude and spec.type != "bool"}


@dataclasses.dataclass(frozen=True)
class Derived:
    """What a task's models make of its signature: the public parameters (the flags invoke
    parses), their help, the repeatable ones, and call (the flags' values to fn's arguments)."""

    params: list[inspect.Parameter]
    help: dict[str, str]
    repeatable: list[str]
    call: Callable[[dict[str, Any]], dict[str, Any]]


def derive(fn: Callable[..., Any], models: Mapping[str, type], keys: str, exclude: Iterable[str]) -> Derived:
    """Each parameter of fn named in models stands, where it is, for the flags of that model's
    fields (less exclude), and fn gets the model built from them (from_flags); the parameter
    named keys stands for the profile-key flags (key_flags, less exclude), and fn gets those
    given, by key. A parameter named problems gets a Problems holding the flags' bad values (so
    the body names them with its own checks at once). The other parameters are fn's own flags."""
    excluded = tuple(exclude)
    model_flags: dict[str, list[Flag]] = {param: flags(model, excluded) for param, model in models.items()}
    keyed = key_flags(excluded) if keys else {}
    public: list[inspect.Parameter] = []
    own = inspect.signature(fn).parameters
    for param in own.values():
        if param.name == "problems":  # the body's Problems, which a flag's bad value joins (from_flags)
            continue
        if param.name in models:
            public += [inspect.Parameter(f.name, _KIND, default=f.cli_default) for f in model_flags[param.name]]
        elif param.name == keys:
            public += [inspect.Parameter(k, _KIND, default="") for k in keyed]
        else:
            public.append(param.replace(kind=_KIND))

    def call(kwargs: dict[str, Any]) -> dict[str, Any]:
        problems = Problems() if "problems" in own else None
        for param, model in models.items():
            given = {f.name: kwargs.pop(f.name) for f in model_flags[param] if f.name in kwargs}
            kwargs[param] = from_flags(model, given, excluded, problems)
        if problems is not None:
            kwargs["problems"] = problems
        if keys:
            kwargs[keys] = {k: kwargs.pop(k) for k in keyed if k in kwargs}
        return kwargs

    all_flags = [f for fs in model_flags.values() for f in fs]
    helps = {**keyed, **{f.name: f.help for f in all_flags}}
    return Derived(public, helps, [f.name for f in all_flags if f.repeatable], call)
