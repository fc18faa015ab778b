"""The profile's JSON Schema (configs/profile.schema.json): generated from configs/defaults.yaml,
committed for editors, the one place resolve takes each value's type, choices and range from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from torchbuild.core.errors import ProfileError
from torchbuild.profile.config import (
    SCHEMA_COMMAND,
    available_profiles,
    data_dir,
    json_schema,
    json_schema_text,
    profiles_dir,
    resolve,
    schema,
)

SCHEMA_PATH = data_dir() / "configs" / "profile.schema.json"


def test_committed_schema_is_the_generated_one():
    committed = SCHEMA_PATH.read_text() if SCHEMA_PATH.is_file() else ""
    assert committed == json_schema_text(), f"configs/profile.schema.json is stale; regenerate it: {SCHEMA_COMMAND}"


def test_schema_is_draft_2020_12_and_lists_every_key_with_its_doc():
    generated = json_schema()
    Draft202012Validator.check_schema(generated)
    assert generated["additionalProperties"] is False
    props = generated["properties"]
    assert set(props) == set(schema()) | {"extends"}
    for name, spec in schema().items():
        assert props[name]["description"] == spec.doc
    assert props["blas"]["enum"] == ["mkl", "openblas", "nvpl", "blis", "eigen", "generic"]
    assert props["distributed"]["items"]["enum"] == ["gloo", "nccl", "mpi", "ucc"]
    assert (props["cpus"]["minimum"], props["cpus"]["maximum"]) == (1, 4096)
    assert props["switches"]["propertyNames"]["pattern"] == "^(?:(USE|BUILD)_[A-Z0-9_]+)$"


@pytest.mark.parametrize("name", available_profiles())
def test_every_shipped_profile_validates_against_the_committed_schema(name):
    validator = Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    data = yaml.safe_load((profiles_dir() / f"{name}.yaml").read_text())
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(data)]
    assert not errors, errors


def test_an_editor_sees_the_errors_resolve_reports():
    """An editor checking a profile with the schema flags the unknown key, the value not among
    the choices, the count out of range and the map entry's name; a number YAML read where text
    is meant, and max_jobs as text, pass as resolve takes them."""
    validator = Draft202012Validator(json_schema())
    bad = {"cuda_arch_lsit": ["9.0"], "blas": "openblass", "cpus": 0, "switches": {"CMAKE_X": "1"}}
    assert {e.validator for e in validator.iter_errors(bad)} == {
        "additionalProperties",
        "enum",
        "minimum",
        "pattern",  # of the switches entry's name (propertyNames)
    }
    assert not list(validator.iter_errors({"extends": "cuda", "compiler_version": 13, "max_jobs": "8"}))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return path


# (the profile's text, the words the message must hold): each names the file, line and key
BAD_VALUES = [
    ("description: x\ncpus: 16.0\n", ["site.yaml:2", "'cpus'", "whole number >= 0"]),
    ("description: x\nexport_env: 'no'\n", ["site.yaml:2", "'export_env'", "true or false"]),
    ("description: x\napt_packages: vim\n", ["site.yaml:2", "'apt_packages'", "expected a list"]),
    ("description: x\nmodules: [gcc, 3.1]\n", ["site.yaml:2", "'modules'", "3.1 was read as a number"]),
    ("description: x\nenv:\n  A: [1]\n", ["site.yaml:2", "'env'", "entry 'A' must be text"]),
    ("description: x\nenv: {1: a}\n", ["site.yaml:2", "'env'", "entry name 1 is not allowed"]),
    ("description: x\nruntime_packages: ['numpy<<2']\n", ["site.yaml:2", "'runtime_packages'", "pip requirement"]),
    ("description: x\nwalltime: '4h'\n", ["site.yaml:2", "'walltime'", "malformed"]),
    ('description: x\ntorch_version: "2.6.0\\n"\n', ["site.yaml:2", "'torch_version'", "malformed"]),
    ("description: x\nsystem_nccl: true\n", ["site.yaml:2", "'system_nccl' was replaced"]),
]


@pytest.mark.parametrize(("text", "words"), BAD_VALUES, ids=[t.split("\n")[1][:24] for t, _ in BAD_VALUES])
def test_a_value_the_schema_refuses_names_file_line_and_key(tmp_path, text, words):
    with pytest.raises(ProfileError) as exc:
        resolve(str(write(tmp_path, text)))
    for word in words:
        assert word in exc.value.message, (word, exc.value.message)


def test_the_first_error_in_the_file_is_the_one_reported(tmp_path):
    path = write(tmp_path, "description: x\nblas: mkk\nmpi: lam\ncompiler: icc\n")
    with pytest.raises(ProfileError, match=r"site.yaml:2: key 'blas': 'mkk' is not allowed; did you mean 'mkl'"):
        resolve(str(path))


def test_numbers_yaml_reads_where_text_is_meant_are_taken_as_text(tmp_path):
    path = write(tmp_path, "description: x\ncompiler_version: 13\nmax_jobs: '8'\ncuda_version: ''\n")
    spec = resolve(str(path), ["switches.USE_MPI=1", "env={A: 1, B: true}"])
    assert (spec.compiler_version, spec.max_jobs) == ("13", 8)
    assert dict(spec.switches)["USE_MPI"] == "1" and dict(spec.env) == {"A": "1", "B": "1"}


def test_committed_defaults_file_is_the_generated_one():
    """configs/defaults.yaml lists the keys as profile/keys.py declares them: a key added there
    (one `key(...)` line) fails this until the file is written again with DEFAULTS_COMMAND."""
    from torchbuild.profile.keys import DEFAULTS_COMMAND, defaults_yaml_text

    committed = (data_dir() / "configs" / "defaults.yaml").read_text()
    assert committed == defaults_yaml_text(), f"configs/defaults.yaml is stale; regenerate it: {DEFAULTS_COMMAND}"


def test_each_key_is_declared_once_and_is_a_field_of_the_spec_in_the_keys_order():
    import dataclasses

    from torchbuild.profile.config import BuildSpec
    from torchbuild.profile.keys import GROUPS

    declared = [f.name for group in GROUPS for f in dataclasses.fields(group)]
    assert len(declared) == len(set(declared))
    fields = [f.name for f in dataclasses.fields(BuildSpec)]
    assert fields == ["profile", *declared, "origins"]
    assert list(schema()) == declared
    assert yaml.safe_load((data_dir() / "configs" / "defaults.yaml").read_text()).keys() == set(declared)
