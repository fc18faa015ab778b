"""Plain data <-> typed records, one converter for the whole package (cattrs).

A step's request crosses into the container as JSON and comes back as a typed dataclass; a
manifest is written from dataclasses and read back into them. Both go through `converter`:
a key the record does not have, a missing key or a value of the wrong type is a named error
(`from_dict`), never a KeyError or a half-filled record. Types outside the core register
their own hooks where they are defined (BuildSpec in inputs/config.py), so this module imports
nothing else of torchbuild but errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError

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


def _reasons(exc: BaseException, path: str = "") -> list[str]:
    """One short reason per leaf of cattrs' exception group ('spec.jobs: expected int')."""
    if isinstance(exc, ForbiddenExtraKeysError):
        return [f"{path or 'the record'} has unknown keys {', '.join(sorted(exc.extra_fields))}"]
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
