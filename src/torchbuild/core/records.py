"""Plain data <-> typed records, one converter for the whole package (cattrs).

A step's request crosses into the container as JSON and comes back as a typed dataclass; a
manifest is written from dataclasses and read back into them. Both go through `converter`:
a key the record does not have, a missing key or a value of the wrong type is a named error
(`from_dict`), never a KeyError or a half-filled record. Types outside the core register
their own hooks where they are defined (BuildSpec in inputs/config.py), so this module imports
nothing else of torchbuild but errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, get_args, get_origin

import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError

from torchbuild.core.errors import TorchbuildError, UsageError

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True)

# cattrs' own hooks coerce: str(5) is "5", bool("no") is True, a string is a sequence of
# characters. Requests and manifests are JSON: a value of another JSON type is an error.
_JSON_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _scalar(value: Any, cls: type) -> Any:
    ok = isinstance(value, cls) and not (cls is not bool and isinstance(value, bool))
    if cls is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise TypeError(f"expected {_JSON_NAMES[cls]}, not {json_type(value)}")
    return value


def _is_sequence(cls: Any) -> bool:
    return get_origin(cls) in (list, tuple, Sequence)


def _sequence(value: Any, cls: Any) -> Any:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list, not {json_type(value)}")
    args = get_args(cls)
    if get_origin(cls) is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise TypeError(f"expected a list of {len(args)} items, not {len(value)}")
        return tuple(converter.structure(v, t) for v, t in zip(value, args))
    items = [converter.structure(v, args[0] if args else Any) for v in value]
    return tuple(items) if get_origin(cls) is tuple else items


def _is_mapping(cls: Any) -> bool:
    return get_origin(cls) in (dict, Mapping)


def _mapping(value: Any, cls: Any) -> Any:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, not {json_type(value)}")
    key, item = get_args(cls) or (Any, Any)
    return {converter.structure(k, key): converter.structure(v, item) for k, v in value.items()}


def json_type(value: Any) -> str:
    """The JSON name of value's type ("a list", "null") for a message."""
    names = {bool: "a boolean", str: "a string", int: "an integer", float: "a number"}
    names.update({list: "a list", tuple: "a list", dict: "an object", type(None): "null"})
    return names.get(type(value), type(value).__name__)


for _cls in _JSON_NAMES:
    converter.register_structure_hook(_cls, _scalar)
converter.register_structure_hook_func(_is_sequence, _sequence)
converter.register_structure_hook_func(_is_mapping, _mapping)


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


def _reasons(exc: BaseException, path: str = "") -> list[str]:
    """One short reason per leaf of cattrs' exception group ('spec.jobs: expected int')."""
    if isinstance(exc, ForbiddenExtraKeysError):
        return [f"{path + ': ' if path else ''}unknown keys {', '.join(sorted(exc.extra_fields))}"]
    if isinstance(exc, cattrs.BaseValidationError):
        out: list[str] = []
        for sub in exc.exceptions:
            # cattrs notes where a leaf failed: "Structuring class R @ attribute jobs"
            note = next((str(n) for n in getattr(sub, "__notes__", []) if "@ attribute " in str(n)), "")
            name = note.split("@ attribute ", 1)[1].split()[0] if note else ""
            out += _reasons(sub, ".".join(p for p in (path, name) if p))
        return out or [str(exc)]
    if isinstance(exc, KeyError):
        return [f"{path}: missing" if path else f"missing {exc}"]
    return [f"{path}: {exc}" if path else str(exc)]
