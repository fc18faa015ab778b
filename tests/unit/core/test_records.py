"""core.records: JSON data into a record only when every value already has the record's type
(cattrs' default hooks would turn true into 1, 5 into "5" and "ab" into ("a", "b"))."""

from __future__ import annotations

import dataclasses

import pytest

from torchbuild.core.errors import UsageError
from torchbuild.core.records import from_dict, to_dict


@dataclasses.dataclass(frozen=True)
class Item:
    n: int


@dataclasses.dataclass(frozen=True)
class Request:
    jobs: int
    name: str = ""
    seconds: float = 0.0
    flags: tuple[str, ...] = ()
    items: tuple[Item, ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)


WRONG = {
    "bool for int": ({"jobs": True}, "jobs: expected an int, found a boolean true"),
    "string for int": ({"jobs": "2"}, 'jobs: expected an int, found a string "2"'),
    "number for string": ({"jobs": 1, "name": 5}, "name: expected a string, found a number 5"),
    "string for list": ({"jobs": 1, "flags": "ab"}, 'flags: expected a list, found a string "ab"'),
    "list for object": ({"jobs": 1, "env": ["A=1"]}, "env: expected an object, found a list"),
    "bad item": ({"jobs": 1, "items": [{"n": 1}, {"n": "x"}]}, r"items\[1\]\.n: expected an int"),
    "unknown nested key": ({"jobs": 1, "items": [{"n": 1, "m": 2}]}, r"items\[0\] has unknown keys m"),
    "missing": ({"name": "x"}, "jobs: missing"),
    "bad mapping value": ({"jobs": 1, "env": {"A": 1}}, "env.A: expected a string, found a number 1"),
    "key with a quote": ({"jobs": 1, "env": {"it's": 1}}, "env.it's: expected a string, found a number 1"),
    "value with an at": ({"jobs": 1, "env": {"A": " @ x"}, "name": 2}, "name: expected a string"),
}


@pytest.mark.parametrize(("data", "message"), WRONG.values(), ids=WRONG.keys())
def test_a_value_of_the_wrong_json_type_is_a_named_error(data, message):
    with pytest.raises(UsageError, match=message):
        from_dict(Request, data, "the request")


def test_json_values_of_the_right_types_round_trip():
    data = {"jobs": 2, "name": "x", "seconds": 3, "flags": ["a"], "items": [{"n": 1}], "env": {"A": "1"}}
    request = from_dict(Request, data, "the request")
    assert request == Request(2, "x", 3.0, ("a",), (Item(1),), {"A": "1"})
    assert to_dict(request) == {**data, "seconds": 3.0}
