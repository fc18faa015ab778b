"""Plain data <-> typed records, one converter for the whole package (cattrs).

A step's request crosses into the container as JSON and comes back as a typed dataclass; a
manifest is written from dataclasses and read back into them. Both go through `converter`:
a key the record does not have, a missing key or a value of the wrong type is a named error
(`from_dict`), never a KeyError or a half-filled record. Types outside the core register
their own hooks where they are defined (BuildSpec in profile/config.py), so this module imports
nothing else of torchbuild but errors.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import cattrs
from cattrs.cols import homogenous_tuple_structure_factory, list_structure_factory, mapping_structure_factory
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn

from torchbuild.core.errors import TorchbuildError, UsageError

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True)


def to_dict(record: Any) -> dict[str, Any]:
    """The record as plain data (JSON-ready)."""
    data = converter.unstructure(record)
    assert isinstance(data, dict)
    return data


def from_dict(
    cls: type[T],
    data: Mapping[str, Any],
    what: str,
    error: type[TorchbuildError] = UsageError,
    hint: str = "",
) -> T:
    """data as a cls; `error` naming what is wrong in one line (what: "the comms request")."""
    if not isinstance(data, Mapping):
        raise error(f"{what} is not a JSON object", hint=hint)
    try:
        return converter.structure(dict(data), cls)
    except ForbiddenExtraKeysError as exc:
        raise error(f"{what} has keys it should not: {', '.join(sorted(exc.extra_fields))}", hint=hint) from None
    except ClassValidationError as exc:
        raise error(f"{what}: {'; '.join(_reasons(exc))}", hint=hint) from None
    except TorchbuildError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise error(f"{what}: {exc}", hint=hint) from None


# cattrs' paths, as transform_error writes them: ".name" for a field, "[0]" for an index and
# "['key']" (the key's repr) for a mapping's key; shown as "name", "[0]" and ".key"
_KEY = re.compile(r"""\[('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\]""")


def _reason(exc: BaseException, path: str) -> str:
    """One leaf's reason at path ("" for the record itself)."""
    if isinstance(exc, ForbiddenExtraKeysError):
        return f"{path or 'the record'} has unknown keys {', '.join(sorted(exc.extra_fields))}"
    if isinstance(exc, KeyError):
        return f"{path}: missing" if path else f"missing {exc}"
    return f"{path}: {exc}" if path else str(exc)


def _reasons(exc: BaseException) -> list[str]:
    """One short reason per leaf of cattrs' exception group ('spec.jobs: expected int'), the
    leaves and their paths found by cattrs.transform_error. Its format_exception hook sees a
    leaf but not its path, and its result is the text "<description> @ <path>": the hook keeps
    the leaf and describes it by its number, so a path is split from a description that cannot
    hold " @ " (a message can: a value is shown)."""
    leaves: list[BaseException] = []

    def keep(leaf: BaseException, _: type | None) -> str:
        leaves.append(leaf)
        return str(len(leaves) - 1)

    out = []
    for line in cattrs.transform_error(exc, path="", format_exception=keep):
        number, _, path = line.partition(" @ ")
        path = _KEY.sub(lambda m: "." + str(ast.literal_eval(m.group(1))), path)
        out.append(_reason(leaves[int(number)], path.removeprefix(".")))
    return out or [str(exc)]


# --------------------------------------------------------------------------- JSON's types, strictly
# cattrs' default hooks call the type: int(True) is 1, str(5) is "5", tuple("ab") is ("a", "b").
# Data that crosses as JSON must already have the record's types, so these hooks only check.

_JSON_KINDS: dict[type, str] = {
    dict: "an object",
    list: "a list",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
}
_EXPECTED: dict[type, str] = {int: "an int", float: "a number", str: "a string", bool: "true or false"}


def kind_of(value: Any) -> str:
    """The JSON kind of a parsed value, for messages ("a string", "null", "an object")."""
    return "null" if value is None else _JSON_KINDS.get(type(value), type(value).__name__)


def _wrong(expected: str, value: Any) -> TypeError:
    shown = json.dumps(value, default=str)
    return TypeError(f"expected {expected}, found {kind_of(value)}" + ("" if len(shown) > 60 else f" {shown}"))


def _primitive(tp: type) -> Callable[[Any, type], Any]:
    def hook(value: Any, _: type) -> Any:
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, tp) and not (tp is not bool and isinstance(value, bool)):
            return value
        raise _wrong(_EXPECTED[tp], value)

    return hook


def _container(tp: Any) -> str:
    """'list', 'object' or '' (not a container these hooks check) for a type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return "list"
    if origin is dict or (dataclasses.is_dataclass(tp) and isinstance(tp, type)):
        return "object"
    return ""


def _checked(tp: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """cattrs' own hook for a list, tuple, dict or dataclass, behind a check of the JSON kind."""
    origin = typing.get_origin(tp)
    if origin is list:
        inner = list_structure_factory(tp, conv)
    elif origin is tuple:
        inner = homogenous_tuple_structure_factory(tp, conv)
    elif origin is dict:
        inner = mapping_structure_factory(tp, conv)
    else:
        inner = make_dict_structure_fn(tp, conv)
    want, kinds = ("a list", (list, tuple)) if _container(tp) == "list" else ("an object", (Mapping,))

    def hook(value: Any, cls: Any) -> Any:
        if not isinstance(value, kinds):
            raise _wrong(want, value)
        return inner(value, cls)

    return hook


for _tp in (int, float, str, bool):
    converter.register_structure_hook(_tp, _primitive(_tp))
converter.register_structure_hook_factory(lambda tp: bool(_container(tp)), lambda tp: _checked(tp, converter))
