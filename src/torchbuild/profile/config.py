"""Profiles: load -> merge (defaults < extends chain < profile < --set) -> validate -> BuildSpec.

profile/keys.py declares every key (type, default, doc), and configs/defaults.yaml lists them. A profile is a flat YAML
mapping of those keys plus an optional ``extends:`` naming another profile (by name or
path). ``--set key=value`` overrides one key; ``--set switches.USE_MPI=1`` sets one entry of
a map. The result is a frozen :class:`BuildSpec`; nothing after resolution reads YAML or
the environment again.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import platformdirs
import yaml
from jsonschema import Draft202012Validator, ValidationError, validators
from packaging.version import InvalidVersion, Version

from torchbuild.core import glibc, records
from torchbuild.core.arch import Arch, host_machine
from torchbuild.core.errors import ProfileError, UsageError
from torchbuild.core.handover import Slot
from torchbuild.core.safeio import PROFILE_LIMIT, not_an_option, read_text, user_path
from torchbuild.profile import cuda_archs, official_wheels, remote_cache, torch_lines
from torchbuild.profile import keys as keys_model
from torchbuild.profile.keys import KeySpec, PackageEntry, RuntimePackage, StrMap
from torchbuild.profile.torch_lines import minor

DEFAULT_PROFILE = "cpu"
_CUDA_ARCH_RE = re.compile(r"\d+\.\d+a?(\+PTX)?")
_PROFILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def data_dir() -> Path:
    """Directory holding configs/ and containers/ (installed package or source checkout)."""
    here = Path(__file__).resolve().parents[1]  # the torchbuild package
    if (here / "configs" / "defaults.yaml").is_file():  # installed wheel
        return here
    return here.parents[1]  # source checkout: src/torchbuild -> repo root


def defaults_file() -> Path:
    return data_dir() / "configs" / "defaults.yaml"


def profiles_dir() -> Path:
    return data_dir() / "configs" / "profiles"


# --------------------------------------------------------------------------- schema


# the types whose value is a list of items
_LISTS = ("list", "requirements", "packages", "cuda_arch_list")


@functools.cache
def _declared() -> Mapping[str, KeySpec]:
    """Every key as profile/keys.py declares it (its defaults not yet checked)."""
    return MappingProxyType(keys_model.declared())


@functools.cache
def schema() -> Mapping[str, KeySpec]:
    """Every allowed key (profile/keys.py), its defaults checked once."""
    keys = _declared()
    # the defaults must themselves be valid, or every profile would inherit an error
    label = str(defaults_file())
    _checked({k: s.default for k, s in keys.items()}, lambda _: label)
    return keys


# The profile's JSON Schema (draft 2020-12), generated from the keys (profile/keys.py): resolve checks each
# value's type, choices and range through it (jsonschema), and editors complete and check
# profiles with its copy in configs/profile.schema.json. It describes the YAML a profile may
# hold: a str key also takes a number YAML read as one (compiler_version: 13), checked as its
# text. What JSON Schema cannot say stays in Python: host paths, pip requirements, NaN, and the
# rules between keys (_cross_check).
SCHEMA_FILE = "profile.schema.json"
SCHEMA_COMMAND = f"python -m torchbuild.profile.config > configs/{SCHEMA_FILE}"
_JOBS_TEXT = r"\s*[0-9]{1,18}\s*"  # max_jobs as text (--set max_jobs=8, max_jobs: "8")


def _anchored(pattern: str) -> str:
    """A key's pattern (matched in full) as JSON Schema's (searched): ^(?:...)$."""
    return f"^(?:{pattern})$"


def _text_schema(spec: KeySpec) -> dict[str, Any]:
    """A str key's value, or a list's item."""
    out: dict[str, Any] = {"type": "string"} if spec.choices else {"type": ["string", "integer"]}
    if spec.choices:
        out["enum"] = list(spec.choices)
    if spec.pattern is not None:
        out["pattern"] = _anchored(spec.pattern)
    return out


def _range_schema(spec: KeySpec, low: float | None) -> dict[str, Any]:
    """minimum (or, for a number without min, exclusiveMinimum 0) and maximum."""
    out: dict[str, Any] = {}
    if spec.minimum is not None or low is not None:
        out["minimum"] = spec.minimum if spec.minimum is not None else low
    else:
        out["exclusiveMinimum"] = 0
    if spec.maximum is not None:
        out["maximum"] = spec.maximum
    return out


_ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# a runtime_packages entry written as a mapping (RuntimePackage)
_PACKAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["requirement"],
    "additionalProperties": False,
    "properties": {
        "requirement": {"type": "string"},
        "pip_args": {"type": "array", "items": {"type": "string"}},
        "env": {
            "type": "object",
            "propertyNames": {"type": "string", "pattern": _anchored(_ENV_NAME)},
            "additionalProperties": {"type": ["string", "number", "boolean"]},
        },
        "check": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
}


def _value_schema(spec: KeySpec) -> dict[str, Any]:
    """The JSON Schema of one key's value, by its type."""
    arch = _CUDA_ARCH_RE.pattern
    kinds: dict[str, dict[str, Any]] = {
        "str": _text_schema(spec),
        "list": {"type": "array", "items": _text_schema(spec)},
        "requirements": {"type": "array", "items": _text_schema(spec)},
        "packages": {"type": "array", "items": {"anyOf": [_text_schema(spec), _PACKAGE_SCHEMA]}},
        "bool": {"type": "boolean"},
        "int": {"type": "integer", **_range_schema(spec, 0)},
        "number": {"type": "number", **_range_schema(spec, None)},
        "jobs": {
            "anyOf": [
                {"const": "auto"},
                {"type": "integer", **_range_schema(spec, 1)},
                {"type": "string", "pattern": _anchored(_JOBS_TEXT)},
            ]
        },
        "cuda_arch_list": {
            "anyOf": [
                {"type": "array", "items": {"type": ["string", "number"], "pattern": _anchored(arch)}},
                {"type": "string", "pattern": _anchored(f"[;, ]*({arch}([;, ]+{arch})*)?[;, ]*")},
            ]
        },
        "map": {
            "type": "object",
            "propertyNames": {
                "type": "string",
                **({"pattern": _anchored(spec.key_pattern)} if spec.key_pattern else {}),
            },
            "additionalProperties": {"type": ["string", "number", "boolean"]},
        },
    }
    return {"description": spec.doc, **kinds[spec.type], "default": spec.default}


def json_schema() -> dict[str, Any]:
    """The profile's JSON Schema (draft 2020-12), generated from the keys (profile/keys.py)."""
    properties: dict[str, Any] = {
        "extends": {"description": "Another profile this one starts from: a name or a path.", "type": "string"}
    }
    properties.update({name: _value_schema(spec) for name, spec in _declared().items()})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "torchbuild profile",
        "description": f"A torchbuild profile; generated from src/torchbuild/profile/keys.py by `{SCHEMA_COMMAND}`.",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }


def json_schema_text() -> str:
    """json_schema() as configs/profile.schema.json holds it."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def _is_integer(checker: Any, instance: object) -> bool:
    """YAML's 16, not 16.0 (JSON Schema's integer takes both)."""
    return isinstance(instance, int) and not isinstance(instance, bool)


def _fullmatch(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """pattern as Python's re matches the whole text: "2.6.0\\n" does not match ^...$."""
    if isinstance(instance, str) and not re.fullmatch(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_extend: Callable[..., Any] = validators.extend  # untyped in types-jsonschema
_ProfileValidator = _extend(
    Draft202012Validator,
    validators={"pattern": _fullmatch},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


@functools.cache
def _validator() -> Any:
    return _ProfileValidator(json_schema())


if __name__ == "__main__":  # regenerate configs/profile.schema.json: SCHEMA_COMMAND
    print(json_schema_text(), end="")


# --------------------------------------------------------------------------- BuildSpec

# the launcher of a multi-node job (`invoke verify --nodes`) when the profile names none
LAUNCHER_DEFAULTS = {"slurm": "srun", "pbs": "mpiexec"}


def requirement_of(entry: PackageEntry) -> str:
    """The pip requirement of a runtime_packages entry (text, or a mapping's requirement)."""
    return entry if isinstance(entry, str) else entry.requirement


# the groups in reverse: a dataclass lists its bases' fields from the last base to the first,
# so BuildSpec's fields come in the keys' order (keys.GROUPS)
@dataclasses.dataclass(frozen=True)
class BuildSpec(
    keys_model.AfterTheBuild,
    keys_model.BatchJob,
    keys_model.Resources,
    keys_model.Preflight,
    keys_model.CompilerFlags,
    keys_model.Companions,
    keys_model.Libraries,
    keys_model.Cuda,
    keys_model.ToolchainImage,
    keys_model.WhatToBuild,
    keys_model.Named,
):
    """A resolved, validated profile: the name of its file and a field per key (profile/keys.py)."""

    # where each key's value came from ("defaults.yaml", "gh200.yaml:12", "--set"); not hashed
    origins: StrMap = dataclasses.field(default_factory=dict, compare=False, repr=False)

    # -- derived facts (one place each)
    @property
    def cuda(self) -> bool:
        return bool(self.cuda_version)

    @property
    def pythons(self) -> tuple[str, ...]:
        """Every Python the image provides: python_version first, then python_versions' others."""
        return (self.python_version, *(v for v in self.python_versions if v != self.python_version))

    @property
    def job_launcher(self) -> str:
        """The launcher of a multi-node job: the profile's `launcher`, else the scheduler's own
        (srun under Slurm, mpiexec under PBS, as PBS Professional's sites and Cray PALS name it)."""
        return self.launcher or LAUNCHER_DEFAULTS.get(self.scheduler, "mpiexec")

    @property
    def purge_command(self) -> str:
        """The job's `module purge` line (module_purge, module_purge_force); '' for none."""
        if self.module_purge_force:
            return "module --force purge"
        return "module purge" if self.module_purge else ""

    @property
    def git_ref(self) -> str:
        return self.torch_ref or f"v{self.torch_version}"

    @property
    def build_version(self) -> str:
        """PYTORCH_BUILD_VERSION: the version the wheel will carry."""
        if self.local_version:
            return f"{self.torch_version}+{self.local_version}"
        return self.torch_version

    @property
    def image_tag(self) -> str:
        return f"{self.image_name}:{self.profile}-{self.torch_version}-{self.arch.value}"

    @property
    def manifest_tag(self) -> str:
        """The multi-arch manifest list that --push publishes over the per-arch tags."""
        return f"{self.image_name}:{self.profile}-{self.torch_version}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data in the keys' order (plus profile), for printing and hashing."""
        out: dict[str, Any] = {"profile": self.profile}
        for name in schema():
            value = getattr(self, name)
            out[name] = _plain(value)
        return out

    @property
    def hash(self) -> str:
        """sha256 of the resolved profile's build keys; recorded in image labels and manifests.
        The job keys (scope: job) say how a job runs (how a batch job asks for a node, which shared
        compile cache it reads), and the runtime keys (scope: runtime) how the result is installed
        and run, not what is built: a build submitted with another account, through another cache,
        or installed with other runtime settings, is the same build."""
        keys = schema()
        data = {k: v for k, v in self.to_dict().items() if k not in keys or keys[k].scope == "build"}
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


# --------------------------------------------------------------------------- loading


@dataclasses.dataclass
class _Layer:
    """One source of values: a YAML file or the command line."""

    label: str  # shown in messages: a path, or "--set"
    values: dict[str, Any]
    lines: dict[str, int]

    def where(self, key: str) -> str:
        line = self.lines.get(key)
        return f"{self.label}:{line}" if line else self.label


# what one profile (or --set value) may make of its YAML: nodes written out plus nodes repeated
# through aliases (`*a`), and nesting. A profile is a flat mapping of short lists and maps, far
# under both; a billion-laughs file (aliases of aliases) or [[[[...]]]] is refused while it is
# composed, before it takes memory or recursion.
YAML_MAX_NODES = 100_000
YAML_MAX_DEPTH = 32


class _YamlTooLarge(yaml.YAMLError):
    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts the nodes a document expands to (an alias counts as many nodes as
    the node it repeats) and its nesting, and refuses a document over YAML_MAX_NODES or
    YAML_MAX_DEPTH, or with an alias inside the node it names (a recursive structure)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nodes = 0
        self._depth = 0
        self._open: set[str] = set()  # anchors of the collections being composed
        self._sizes: dict[int, int] = {}

    def _size(self, node: yaml.Node) -> int:
        known = self._sizes.get(id(node))
        if known is None:
            known = 1
            if isinstance(node, yaml.SequenceNode):
                known += sum(self._size(item) for item in node.value)
            elif isinstance(node, yaml.MappingNode):
                known += sum(self._size(k) + self._size(v) for k, v in node.value)
            self._sizes[id(node)] = known
        return known

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > YAML_MAX_NODES:
            raise _YamlTooLarge(f"expands to more than {YAML_MAX_NODES} values (aliases repeat their anchor)", mark)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise _YamlTooLarge(f"alias *{event.anchor} is inside the node it names (a loop)", event.start_mark)
            if event.anchor in self.anchors:
                self._count(self._size(self.anchors[event.anchor]), event.start_mark)
            return super().compose_node(parent, index)
        self._count(1, event.start_mark)
        self._depth += 1
        if self._depth > YAML_MAX_DEPTH:
            raise _YamlTooLarge(f"nested more than {YAML_MAX_DEPTH} levels deep", event.start_mark)
        anchor = getattr(event, "anchor", None)
        if anchor:
            self._open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open.discard(anchor or "")
        return node


# What YAML refuses in a document (PyYAML's own Reader.NON_PRINTABLE): control characters but
# tab, line feed and carriage return (NUL, ESC, form feed, \x01, DEL...), C1 controls but NEL,
# surrogates, U+FFFE and U+FFFF. PyYAML checks it when its loader is made, as a ReaderError.
UNPRINTABLE = yaml.reader.Reader.NON_PRINTABLE
_CONTROL_NAMES = {0x00: "NUL", 0x07: "BEL", 0x08: "backspace", 0x0B: "vertical tab", 0x0C: "form feed", 0x1B: "ESC"}


def unprintable(text: str, label: str, lines: bool = True) -> None:
    """ProfileError naming the first character of text YAML does not allow (UNPRINTABLE), its
    line and column, as U+XXXX (never the raw character: an ESC would reach the terminal). The
    one check of raw profile text and of every --set value, whether YAML reads it or not.
    (Issue 41 item 1 refuses more in what reaches an environment: a line break too, which YAML
    allows; that check is about values, this one about the text they are read from.)"""
    found = UNPRINTABLE.search(text)
    if found is None:
        return
    at = found.start()
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    where = f"{label}:{line}" if lines else label
    code = ord(found.group())
    name = f" ({_CONTROL_NAMES[code]})" if code in _CONTROL_NAMES else ""
    raise ProfileError(
        f"{where}: holds the control character U+{code:04X}{name} ({found.group()!r}, column {column}), which a profile "
        "may not (YAML refuses it)",
        hint="remove it: a profile and --set values are plain text (tabs and line breaks only)",
    )


def _load_yaml(text: str, label: str, lines: bool = True) -> tuple[yaml.Node | None, Any]:
    """The composed node and the data of one YAML document, bounded (_BoundedLoader); bad YAML,
    a character YAML refuses, a document too large once expanded, or a number Python will not
    read is a ProfileError."""
    unprintable(text, label, lines)  # PyYAML would raise its ReaderError as the loader is made
    try:
        loader = _BoundedLoader(text)  # its reader refuses NUL, ESC and the like at once
    except yaml.YAMLError as exc:
        raise _yaml_error(label, exc, lines) from None
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _YamlTooLarge as exc:
        raise ProfileError(
            _yaml_error(label, exc, lines).message,
            hint="write the values out: a profile is a flat mapping of short lists and maps",
        ) from None
    except yaml.YAMLError as exc:
        raise _yaml_error(label, exc, lines) from None
    except (ValueError, OverflowError) as exc:  # int() of a 5000-digit number, and the like
        raise ProfileError(
            f"{label}: not usable YAML: {str(exc)[:120]}", hint="write numbers of a sensible size"
        ) from None
    finally:
        loader.dispose()
    return node, data


def _read_yaml(path: Path) -> _Layer:
    text = _read_text(path)
    node, data = _load_yaml(text, str(path))
    if node is None:
        raise ProfileError(
            f"{path}: the profile is empty",
            hint="write the keys it sets (at least description:), or `extends: cpu` to reuse a profile",
        )
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise ProfileError(f"{path}: a profile must be a mapping of key: value")
    if not any(isinstance(k, str) and (k in _declared() or k in RENAMED or k == "extends") for k in data):
        # another kind of file (--profile /etc/shadow): say so, and quote none of its content
        raise ProfileError(
            f"{path} is not a profile: none of its {len(data)} keys is a profile key",
            hint=f"give --profile {_NAMES} or the path of a profile file (keys of configs/defaults.yaml)",
        )
    duplicate = next(_duplicate_keys(node), None)
    if duplicate is not None:
        key, first, again = duplicate
        raise ProfileError(
            f"{path}:{again}: key {key!r} is given twice (first at line {first})",
            hint="remove one of them: YAML would silently keep only the last",
        )
    lines = {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    return _Layer(str(path), data, lines)


def _read_text(path: Path) -> str:
    """The profile's text, at most PROFILE_LIMIT bytes of a regular UTF-8 file (safeio)."""
    return read_text(path, PROFILE_LIMIT, "profile", ProfileError)


def _yaml_error(label: str, exc: yaml.YAMLError, lines: bool = True) -> ProfileError:
    mark = getattr(exc, "problem_mark", None)
    where = f"{label}:{mark.line + 1}" if mark and lines else label
    problem = getattr(exc, "problem", None) or str(exc)
    return ProfileError(f"{where}: not valid YAML: {problem}", hint="check the quoting and brackets on that line")


def _duplicate_keys(node: yaml.Node) -> Iterator[tuple[str, int, int]]:
    """(key, first line, repeated line) for each key given twice in one mapping, at any depth."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + 1
                if key.value in seen:
                    yield key.value, seen[key.value], line
                seen.setdefault(key.value, line)
            yield from _duplicate_keys(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _duplicate_keys(item)


_PROFILE_IS = "a profile is a YAML file of key: value lines (the keys of configs/defaults.yaml)"
_NAMES = "a profile name (`invoke config --list-profiles`)"


def home_path(text: str, what: str, error: type[ProfileError] | type[UsageError] = ProfileError) -> Path:
    """Path(text) with ~ and ~user expanded; error (naming `what`) when ~user names no user of
    this host (Path.expanduser raises RuntimeError) or the text holds a NUL byte."""
    return user_path(text, what, error)


def available_profiles(search_dirs: Sequence[Path] = ()) -> list[str]:
    names: set[str] = set()
    for d in [*search_dirs, profiles_dir()]:
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def find_profile(ref: str, search_dirs: Sequence[Path] = (), relative_to: Path | None = None) -> Path:
    """A profile by name (searched in search_dirs, then configs/profiles) or by path."""
    looks_like_path = ref.endswith((".yaml", ".yml")) or "/" in ref or ref.startswith("~")
    if looks_like_path:
        p = home_path(ref, "profile", ProfileError)
        if not p.is_absolute() and relative_to is not None and (relative_to / p).is_file():
            p = relative_to / p
        if p.is_file():
            return p.resolve()
        what = _PROFILE_IS
        if p.is_dir():
            raise ProfileError(f"profile {ref} is a directory; {what}", hint=f"name a .yaml file in it, or {_NAMES}")
        if p.exists():
            raise ProfileError(f"profile {ref} is not a regular file; {what}", hint=f"name a .yaml file, or {_NAMES}")
        raise ProfileError(
            f"profile file {ref} does not exist; {what}", hint=f"pass a path to a .yaml file, or {_NAMES}"
        )
    dirs = [*(([relative_to]) if relative_to else []), *search_dirs, profiles_dir()]
    for d in dirs:
        p = d / f"{ref}.yaml"
        if p.is_file():
            return p.resolve()
    names = available_profiles(search_dirs)
    close = difflib.get_close_matches(ref, names, n=1)
    suggestion = f"; did you mean {close[0]!r}?" if close else ""
    raise ProfileError(
        f"no profile named {ref!r}{suggestion}",
        hint=f"available profiles: {', '.join(names)} (or pass a path to a .yaml file)",
    )


def _profile_chain(path: Path, search_dirs: Sequence[Path]) -> list[_Layer]:
    """[base-most, ..., path] following extends:, refusing cycles."""
    chain: list[_Layer] = []
    seen: list[Path] = []
    current: Path | None = path
    while current is not None:
        if current in seen:
            cycle = " -> ".join(str(p) for p in [*seen, current])
            raise ProfileError(f"profiles extend each other in a cycle: {cycle}", hint="remove one extends:")
        seen.append(current)
        layer = _read_yaml(current)
        parent = layer.values.pop("extends", None)
        chain.append(layer)
        if parent is None:
            current = None
        elif not isinstance(parent, str):
            raise ProfileError(f"{layer.where('extends')}: extends must be a profile name or path")
        else:
            current = find_profile(parent, search_dirs, relative_to=current.parent)
    chain.reverse()
    return chain


def parse_set(items: Iterable[str]) -> _Layer:
    """Turn ``--set key=value`` strings into a layer; values are parsed by the key's type."""
    keys = schema()
    values: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ProfileError(f"--set {item!r}: expected key=value", hint="e.g. --set python_version=3.12")
        key, _, raw = item.partition("=")
        key = key.strip()
        unprintable(item, f"--set {key[:60]!r}", lines=False)
        bad = _CONTROL_IN_SET.search(item)  # line breaks and tabs may be YAML's own; values are checked
        if bad:
            raise ProfileError(
                f"--set {_shown(key, 40)}: the value holds the control character {_char(bad.group())}",
                hint=CONTROL_HINT,
            )
        top, dot, sub = key.partition(".")
        spec = keys.get(top)
        if top in RENAMED:
            raise ProfileError(f"--set: key {top!r} was replaced", hint=f"write {RENAMED[top]}")
        if spec is None:
            raise ProfileError(f"--set: unknown key {top!r}{_suggest(top)}")
        if dot:
            if spec.type != "map":
                raise ProfileError(f"--set {key}: {top!r} is a {spec.type}, not a map; write --set {top}=...")
            values.setdefault(top, {})[sub] = raw
        else:
            values[top] = _parse_cli_value(spec, raw)
    return _Layer("--set", values, {})


def _parse_cli_value(spec: KeySpec, raw: str) -> Any:
    raw = raw.strip()
    if spec.type in _LISTS:
        if raw.startswith("["):
            return _cli_yaml(spec, raw)
        return [part.strip() for part in re.split(r"[;,]", raw) if part.strip()]
    if spec.type == "map":
        return _cli_yaml(spec, raw) if raw else {}
    if spec.type in ("int", "number", "bool"):
        return _cli_yaml(spec, raw)
    return raw  # str and jobs stay text: "3.10" must not become 3.1


def _cli_yaml(spec: KeySpec, raw: str) -> Any:
    try:
        return _load_yaml(raw, f"--set {spec.name}={raw[:60]}", lines=False)[1]
    except ProfileError as exc:
        raise ProfileError(
            exc.message,
            hint="quote the whole --set argument for the shell; lists are [a, b], maps are {KEY: value}",
        ) from None


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, list(_declared()), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


# --------------------------------------------------------------------------- validation


def _bad(spec: KeySpec, where: str, problem: str, hint: str | None = None) -> ProfileError:
    return ProfileError(f"{where}: key {spec.name!r}: {problem}", hint=hint)


def _shown(value: Any, width: int = 24) -> str:
    """A value for a message: a 10^23 is shown as its first digits, a long text as its start."""
    text = repr(value)
    return text if len(text) <= width else f"{text[: width - 4]}... ({len(text)} characters)"


def _bounds(spec: KeySpec) -> str:
    """'from 1 to 4096': the range of an int (from 0), number (above 0) or jobs (from 1) key."""
    low = spec.minimum if spec.minimum is not None else {"int": 0, "jobs": 1}.get(spec.type, 0)
    high = f"{spec.maximum:g}" if spec.maximum is not None else "any size"
    if spec.type == "number" and spec.minimum is None:
        return f"above 0 up to {high}"
    return f"from {low:g} to {high}"


def _out_of_range(spec: KeySpec, value: float, where: str, expected: str) -> ProfileError:
    bounds = _bounds(spec)
    return _bad(
        spec, where, f"{_shown(value)} is out of range: expected {expected} {bounds}", hint=f"give a value {bounds}"
    )


_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits only: "²".isdigit() is True, int("²") fails


def _count_of_jobs(value: object) -> int | None:
    """value as a whole number >= 1 (an int, or text of ASCII digits), else None."""
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _int_text(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _yaml_scalars(spec: KeySpec, value: Any) -> Any:
    """value as the schema checks it: a number YAML read where the key takes text put back as
    text (compiler_version: 13, cuda_arch_list: [8.0]), a cuda_arch_list given as one text split
    ("8.0;9.0"), max_jobs given as text ("8") as its number; anything else as it came."""
    if spec.type == "str":
        return _int_text(value)
    if spec.type in ("list", "requirements", "packages") and isinstance(value, list):
        return [_int_text(v) for v in value]
    if spec.type == "cuda_arch_list":
        if isinstance(value, str):
            value = [v for v in re.split(r"[;, ]", value) if v]
        if isinstance(value, list):
            return [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value]
    if spec.type == "jobs" and isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        return int(value.strip())
    return value


def _checked(values: Mapping[str, Any], where: Callable[[str], str]) -> dict[str, Any]:
    """values (one layer: a profile file, --set, a request) checked against the profile's JSON
    Schema and then by _canonical, in BuildSpec's form. The first error in the layer's order (an
    unknown key before any value) is a ProfileError naming where its key was set."""
    keys = _declared()
    data = {k: _yaml_scalars(keys[k], v) if k in keys else v for k, v in values.items()}
    errors = list(_validator().iter_errors(data))
    if errors:
        first = min(errors, key=lambda e: _position(e, data))
        if not first.path:  # additionalProperties: a key the schema does not declare
            unknown = next(k for k in data if k not in keys)
            raise _unknown_key(unknown, where(unknown))
        name = str(first.path[0])
        raise _explain(keys[name], first, data[name], where(name))
    return {k: _canonical(keys[k], v, where(k)) for k, v in data.items()}


def _position(error: ValidationError, data: Mapping[str, Any]) -> tuple[int, int]:
    """Where an error is in the layer: its key's place, then its item's or entry's."""
    if not error.path:
        return (-1, 0)
    name = error.path[0]
    value = data.get(str(name))
    entry: Any = error.path[1] if len(error.path) > 1 else None
    if "propertyNames" in error.absolute_schema_path:
        entry = error.instance  # a map's entry name (its path stops at the map)
    if isinstance(value, dict) and entry in value:
        entry = list(value).index(entry)
    return (list(data).index(str(name)), entry if isinstance(entry, int) else 0)


# keys that were replaced, and what to write instead
RENAMED = {"system_nccl": "nccl: system (was system_nccl: true) or nccl: bundled (was false)"}


def _unknown_key(key: Any, where: str) -> ProfileError:
    if key in RENAMED:
        return ProfileError(f"{where}: key {key!r} was replaced", hint=f"write {RENAMED[key]}")
    return ProfileError(
        f"{where}: unknown key {key!r}{_suggest(str(key))}",
        hint="every key is listed with its doc in configs/defaults.yaml (`invoke config --keys`)",
    )


def _explain(spec: KeySpec, error: ValidationError, value: Any, where: str) -> ProfileError:
    """The schema's error on one key's value as the message a user can act on."""
    if spec.type in ("int", "number", "jobs"):
        return _explain_amount(spec, value, where)
    if spec.type == "bool":
        return _bad(spec, where, f"expected true or false, got {value!r}")
    if spec.type == "map":
        return _explain_map(spec, error, value, where)
    if spec.type == "packages" and isinstance(value, list) and len(error.path) > 1:
        return _explain_package(spec, value[int(error.path[1])], where)
    if spec.type == "cuda_arch_list":
        if not isinstance(value, list):
            return _bad(spec, where, f"expected a list of GPU architectures, got {value!r}")
        bad = next(v for v in value if not isinstance(v, str) or not _CUDA_ARCH_RE.fullmatch(v))
        hint = "write major.minor with an optional a or +PTX suffix: 8.0, 9.0a, 9.0+PTX"
        return _bad(spec, where, f"{bad!r} is not a CUDA architecture", hint=hint)
    if spec.type != "str" and not isinstance(value, list):
        return _bad(spec, where, f"expected a list, got {value!r}", hint="write a YAML list: [a, b]")
    return _explain_text(spec, error.instance, where, "value" if spec.type == "str" else "item")


def _explain_text(spec: KeySpec, v: Any, where: str, what: str) -> ProfileError:
    """A str key's value (or a list's item) that is not text, not a choice, or malformed."""
    if isinstance(v, bool) or v is None:
        return _bad(spec, where, f"{what} must be text, got {v!r}")
    if isinstance(v, float):
        return _bad(spec, where, f"{what} {v!r} was read as a number", hint=f"quote it in YAML: '{v}'")
    if not isinstance(v, str):
        return _bad(spec, where, f"{what} must be text, got {type(v).__name__}")
    if spec.choices and v not in spec.choices:
        close = difflib.get_close_matches(v, spec.choices, n=1)
        sugg = f"; did you mean {close[0]!r}?" if close else ""
        shown = ", ".join(repr(c) for c in spec.choices)
        return _bad(spec, where, f"{v!r} is not allowed{sugg}", hint=f"valid values: {shown}")
    return _bad(spec, where, f"{_shown(v, 80)} is malformed (expected to match {spec.pattern})")


def _explain_amount(spec: KeySpec, value: Any, where: str) -> ProfileError:
    """An int, number or jobs value of the wrong type, or out of its range."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if spec.type == "jobs":
        if _count_of_jobs(value) is None:
            return _bad(spec, where, f"expected auto or a whole number {_bounds(spec)}, got {_shown(value)}")
        return _out_of_range(spec, value, where, "auto or a whole number")
    if spec.type == "int":
        if not number or isinstance(value, float) or value < 0:
            return _bad(spec, where, f"expected a whole number >= 0, got {_shown(value)}")
        return _out_of_range(spec, value, where, "a whole number")
    if not number or not value > 0:
        return _bad(spec, where, f"expected a number > 0, got {_shown(value)}")
    if isinstance(value, float) and math.isinf(value):
        return _bad(
            spec,
            where,
            f"expected a finite number, got {value!r}",
            hint=f"give {spec.name} a number, e.g. {spec.default}",
        )
    return _out_of_range(spec, value, where, "a number")


def _explain_map(spec: KeySpec, error: ValidationError, value: Any, where: str) -> ProfileError:
    if not isinstance(value, dict):
        return _bad(spec, where, f"expected a mapping, got {value!r}")
    if "propertyNames" in error.absolute_schema_path:
        return _bad(spec, where, f"entry name {error.instance!r} is not allowed (must match {spec.key_pattern})")
    k = error.path[1]
    return _bad(spec, where, f"entry {k!r} must be text or a number, got {value[k]!r}")


# A control character in a value is refused wherever the value comes from: values reach
# environments (a line break in runtime_env ran as a command on `module load` with Environment
# Modules 5.5 and Lmod 8.6, which hand the value to the shell raw), scripts and terminals.
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 (tab and line breaks too), DEL, C1
_CONTROL_IN_SET = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # what YAML's reader refuses
CONTROL_HINT = "write the value as one line of printable text (no line break, tab, escape or other control character)"


_CONTROL_NAMES = {0: "NUL", 9: "tab", 10: "line feed", 13: "carriage return", 27: "ESC", 127: "DEL"}


def _char(ch: str) -> str:
    """A control character as a message shows it: its escape (and name), never the character."""
    shown = repr(ch) if ch in "\t\n\r" else f"'\\x{ord(ch):02x}'"
    name = _CONTROL_NAMES.get(ord(ch))
    return f"{shown} ({name})" if name else shown


def _control_in(value: Any, at: str = "") -> tuple[str, str] | None:
    """(where, character) of the first control character in value's text (a map's entries, a
    list's items, a runtime_packages mapping's fields: "entry A ", "item 2 env.B "), or None."""
    if isinstance(value, str):
        bad = CONTROL_CHARACTER.search(value)
        return (at, bad.group()) if bad else None
    if isinstance(value, Mapping):
        found = (_control_in(v, f"{at.rstrip()}.{k} " if at else f"entry {k} ") for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        found = (_control_in(v, f"{at}item {i + 1} ") for i, v in enumerate(value))
    else:
        return None
    return next((hit for hit in found if hit is not None), None)


def _canonical(spec: KeySpec, value: Any, where: str) -> Any:
    """A value the schema accepted in BuildSpec's form (tuples, read-only maps of text, floats),
    after the checks JSON Schema cannot make: control characters, ~user in host paths, pip
    requirements, NaN."""
    control = _control_in(value)
    if control is not None:
        at, ch = control
        raise _bad(spec, where, f"{at}holds the control character {_char(ch)}", hint=CONTROL_HINT)
    if spec.type == "map":
        return _canonical_map(spec, value, where)
    if spec.type == "number":
        if value != value:  # NaN passes every comparison JSON Schema makes
            raise _bad(spec, where, f"expected a number > 0, got {value!r}")
        return float(value)
    if spec.type == "packages":
        return tuple(_package(spec, item, where) for item in value)
    items = tuple(value) if spec.type in _LISTS else (value,)
    if spec.path:
        for item in items:
            home_path(item, f"{where}: key {spec.name!r}:")
    if spec.type == "requirements":
        _check_requirements(spec, items, where)
    return items if spec.type in _LISTS else value


def _canonical_map(spec: KeySpec, value: Mapping[str, Any], where: str) -> StrMap:
    result: dict[str, str] = {}
    for k, v in value.items():
        text = ("1" if v else "0") if isinstance(v, bool) else str(v)
        if spec.path:
            home_path(text, f"{where}: key {spec.name}.{k}:")
        result[k] = text
    return MappingProxyType(result)


def _check_requirements(spec: KeySpec, items: Iterable[str], where: str) -> None:
    """Each item a pip requirement (PEP 508: name, extras, version specifiers, markers)."""
    from packaging.requirements import InvalidRequirement, Requirement

    for item in items:
        try:
            Requirement(item)
        except InvalidRequirement as exc:
            raise _bad(
                spec,
                where,
                f"{item!r} is not a pip requirement ({str(exc).splitlines()[0]})",
                hint="write name[extras]<specifiers>: mpi4py>=4",
            ) from None


# the pip options a runtime_packages entry may pass (pip_args): flags, and options written
# --name=value whose value must match; anything else (an index, a target, a second requirement)
# is refused, so an entry cannot turn into other pip arguments
PIP_FLAGS = frozenset(
    {
        "--no-build-isolation",
        "--no-cache-dir",
        "--no-deps",
        "--pre",
        "--upgrade",
        "--force-reinstall",
        "--ignore-installed",
        "--prefer-binary",
        "--use-pep517",
        "--no-use-pep517",
        "--check-build-dependencies",
        "--no-clean",
        "--compile",
        "--no-compile",
        "--verbose",
    }
)
_PIP_NAMES = r":all:|:none:|[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*"
PIP_VALUED = {"--no-binary": _PIP_NAMES, "--only-binary": _PIP_NAMES, "--config-settings": r"[A-Za-z0-9_.-]+=[^\s]*"}
# a program: a plain name found on PATH, or an absolute path; no shell metacharacters or spaces
COMMAND_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*|/[A-Za-z0-9_.+/-]+")
_PACKAGE_FIELDS = ("requirement", "pip_args", "env", "check")


def pip_arg_problem(arg: str) -> str | None:
    """Why a pip_args item is refused, or None when the allow-list takes it."""
    if arg in PIP_FLAGS:
        return None
    name, eq, value = arg.partition("=")
    if name in PIP_VALUED:
        if eq and re.fullmatch(PIP_VALUED[name], value):
            return None
        return f"{arg!r}: write {name}=VALUE (one item, VALUE matching {PIP_VALUED[name]})"
    return f"{arg!r} is not a pip option runtime_packages may pass"


def _package_problem(item: Any) -> str:
    """What is wrong with a runtime_packages entry the schema refused."""
    if not isinstance(item, dict):
        return f"entry {_shown(item, 40)} must be a requirement or a mapping {{{', '.join(_PACKAGE_FIELDS)}}}"
    unknown = [k for k in item if k not in _PACKAGE_FIELDS]
    if unknown:
        return f"entry field {unknown[0]!r} is not known (fields: {', '.join(_PACKAGE_FIELDS)})"
    if not isinstance(item.get("requirement"), str):
        return f"entry {_shown(item, 40)} needs requirement: the pip requirement as text"
    for key in ("pip_args", "check"):
        value = item.get(key, ["x"])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (key == "check" and not value):
            kind = "an argv (a non-empty list of text)" if key == "check" else "a list of text"
            return f"{item['requirement']}: {key} must be {kind}, got {_shown(value, 40)}"
    env = item.get("env", {})
    if not isinstance(env, dict):
        return f"{item['requirement']}: env must be a mapping of variables, got {_shown(env, 40)}"
    for k, v in env.items():
        if not isinstance(k, str) or not re.fullmatch(_ENV_NAME, k):
            return f"{item['requirement']}: env name {k!r} is not a variable name"
        if not isinstance(v, (str, int, float, bool)):
            return f"{item['requirement']}: env {k} must be text or a number, got {_shown(v, 40)}"
    return f"entry {_shown(item, 40)} is malformed"


def _explain_package(spec: KeySpec, item: Any, where: str) -> ProfileError:
    hint = "write name[extras]<specifiers>, or {requirement: horovod==0.28.1, pip_args: [--no-build-isolation]}"
    return _bad(spec, where, _package_problem(item), hint=hint)


def _package(spec: KeySpec, item: str | Mapping[str, Any], where: str) -> PackageEntry:
    """A runtime_packages entry the schema accepted, checked further: its requirement (PEP 508),
    its pip_args against the allow-list, its check's program; a mapping as a RuntimePackage."""
    if isinstance(item, str):
        _check_requirements(spec, (item,), where)
        return item
    requirement = str(item["requirement"])
    _check_requirements(spec, (requirement,), where)
    for arg in item.get("pip_args", ()):
        problem = pip_arg_problem(arg)
        if problem:
            allowed = ", ".join([*sorted(PIP_FLAGS), *(f"{k}=..." for k in PIP_VALUED)])
            raise _bad(spec, where, f"{requirement}: pip_args {problem}", hint=f"allowed: {allowed}")
    check = tuple(item.get("check", ()))
    if check and not COMMAND_RE.fullmatch(check[0]):
        raise _bad(
            spec,
            where,
            f"{requirement}: check {check[0]!r} is not a program name or absolute path",
            hint="check is an argv run without a shell: [horovodrun, --check-build]",
        )
    env = tuple((k, ("1" if v else "0") if isinstance(v, bool) else str(v)) for k, v in item.get("env", {}).items())
    return RuntimePackage(requirement, tuple(item.get("pip_args", ())), env, check)


def _check_compilers(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """compilers: each a program name or an absolute path (it reaches CC/CXX/FC and the
    preflight as it is written, never through a shell)."""
    for role, command in values["compilers"].items():
        if not COMMAND_RE.fullmatch(command):
            fail(
                where,
                "compilers",
                f"{role}: {_shown(command, 40)} is not a program name or an absolute path",
                "write a name found on PATH (cc, CC, ftn, gcc-13) or an absolute path, without spaces or options "
                "(flags go in cflags/cxxflags)",
            )


def _plain(value: Any) -> Any:
    """A BuildSpec value as the YAML or JSON it came from (lists, dicts, text)."""
    if isinstance(value, Arch):
        return value.value
    if isinstance(value, tuple):
        return [v.as_data() if isinstance(v, RuntimePackage) else v for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    return value


def check_value(name: str, value: Any, where: str) -> None:
    """ProfileError unless value is one the key `name` takes (type, choices, range): for a spec
    made otherwise than by resolve (dataclasses.replace), checked again where it is used."""
    _checked({name: _plain(value)}, lambda _: where)


def parse_jobs_option(value: object, option: str = "--jobs") -> int:
    """A --jobs style option, checked like the max_jobs key: a whole number >= 1 (int or text).

    0 means "plan from cores and memory" and is returned for the option's default only: the
    int 0, None, "" (not given) or "auto" (as max_jobs takes it). An explicit "0", a negative
    or a non-numeric value is a UsageError naming the option."""
    if value is None or value in ("", "auto") or (type(value) is int and value == 0):
        return 0
    jobs = _count_of_jobs(value)
    if jobs is None:
        raise UsageError(
            f"{option} {value!r}: expected a whole number >= 1",
            hint=f"give {option} N with N >= 1, or leave it out to plan the jobs from cores and memory",
        )
    return jobs


# variables the install environment's activate script and modulefiles set themselves
# (and, in the SIF, HOME and TORCHBUILD_PROFILE, which the runtime and %environment set)
RUNTIME_MANAGED = frozenset(
    {"PATH", "VIRTUAL_ENV", "VIRTUAL_ENV_PROMPT", "PYTHONHOME", "PS1", "HOME", "TORCHBUILD_PROFILE"}
)


def fail(where: Mapping[str, str], key: str, problem: str, hint: str | None) -> NoReturn:
    """A profile problem: where the key was set, the key, what is wrong, what to do (the features' checks raise it too)."""
    raise ProfileError(f"{where[key]}: key {key!r}: {problem}", hint=hint)


# A feature's rules over its keys, kept with the table they read; torchbuild.tasks fills these
# (core/handover.py: the profile layer may not import a feature). Each raises `fail`'s ProfileError.
FeatureCheck = Callable[[Mapping[str, Any], Mapping[str, str], Arch], None]
COMMS_CHECK: Slot[FeatureCheck] = Slot("the comms keys' check (comms.checks.check)")
COMPANIONS_CHECK: Slot[FeatureCheck] = Slot("the companions' check (builder.companions.check)")


def _cross_check(values: Mapping[str, Any], where: Mapping[str, str], arch: Arch) -> None:
    """Rules that involve more than one key; the message names where the later key was set."""
    _check_cuda(values, where)
    COMMS_CHECK.get()(values, where, arch)
    _check_compilers(values, where)
    COMPANIONS_CHECK.get()(values, where, arch)
    _check_not_options(values, where)
    _check_libraries(values, where, arch)
    _check_ccache_remote(values, where)
    _check_python_sources(values, where)
    _check_floor_base(values, where)
    _check_required(values, where)
    _run_job_values(values["run_job"], where["run_job"])


# the job keys a run job (`submit --run`) may ask for otherwise than the build's job (run_job)
RUN_JOB_KEYS = ("cpus", "mem", "gpus", "gpu_type", "walltime")


def _run_job_values(entries: Mapping[str, str], where: str) -> dict[str, Any]:
    """run_job's entries as their keys take them (cpus and gpus as numbers), each checked as
    that key is; a ProfileError names the entry."""
    keys = _declared()
    values = {k: int(v) if keys[k].type == "int" and v.isdigit() else v for k, v in entries.items()}
    return _checked(values, lambda k: f"{where}: run_job.{k}")


def run_job_spec(spec: BuildSpec) -> BuildSpec:
    """The spec a run job asks for its node with: the build's job keys, run_job's over them."""
    return dataclasses.replace(spec, **_run_job_values(spec.run_job, spec.origins.get("run_job", "run_job")))


def _check_required(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """required names keys a user sets (not itself), each with what to give."""
    for key, what in values["required"].items():
        if key not in _declared() or key == "required":
            fail(where, "required", f"{key!r} is no key a user could set{_suggest(key)}", "name keys of defaults.yaml")
        if not what.strip():
            fail(where, "required", f"{key}: say what to give", f"e.g. {{{key}: a directory the compute nodes mount}}")


def _check_ccache_remote(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    problem = remote_cache.problem(values["ccache_remote"])
    if problem:
        hint = "write redis://HOST[:PORT] or http(s)://HOST[:PORT]/PATH, or '' for the local cache alone"
        fail(where, "ccache_remote", problem, hint)


def _check_cuda(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """ProfileError for a cuda_arch_list without cuda_version, or the reverse, or a cuda_version other than the
    base image's CUDA."""
    cuda = bool(values["cuda_version"])
    if values["cuda_arch_list"] and not cuda:
        fail(
            where,
            "cuda_arch_list",
            "set, but cuda_version is empty",
            "set cuda_version (e.g. 12.6) or clear cuda_arch_list",
        )
    if cuda and not values["cuda_arch_list"]:
        fail(where, "cuda_version", "CUDA build without cuda_arch_list", 'set cuda_arch_list, e.g. ["8.0", "9.0"]')
    base = base_image_cuda(values["base_image"])
    if cuda and base and base != values["cuda_version"]:
        problem = (
            f"{values['cuda_version']}, but base_image {values['base_image']} ({where['base_image']}) is CUDA {base}"
        )
        hint = f'set cuda_version: "{base}", or a base_image of CUDA {values["cuda_version"]} (nvidia/cuda:X.Y.Z-...)'
        fail(where, "cuda_version", problem, hint)


_NVIDIA_CUDA_TAG = re.compile(r"(?:^|/)nvidia/cuda:(\d+\.\d+)(?:\.\d+)*-")


def base_image_cuda(base_image: str) -> str:
    """The CUDA release (12.6) an nvidia/cuda base image's tag names (12.6.3-cudnn-devel-...),
    on any registry; '' for another base, whose nvcc the image build checks (cuda-check.sh)."""
    found = _NVIDIA_CUDA_TAG.search(base_image)
    return found.group(1) if found else ""


_MODULE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+@/-]*")


def _with_torch_version_modules(values: dict[str, Any], where: Mapping[str, str]) -> None:
    """modules and runtime_modules with torch_version_modules' entry for torch_version added
    (its release, e.g. 2.4.0, over its line, 2.4), each module once."""
    table = values["torch_version_modules"]
    for words in table.values():
        bad = [w for w in str(words).split() if not _MODULE_RE.fullmatch(w)]
        if bad or not str(words).split():
            problem = f"{_shown(str(words), 40)} is not a list of module names"
            fail(where, "torch_version_modules", problem, 'write them space-separated: "cudnn/9.2.0.82-12 nccl/2.21"')
    version = values["torch_version"]
    chosen = table.get(version) or table.get(minor(version))
    if not chosen:
        return
    added = str(chosen).split()
    for key in ("modules", "runtime_modules"):
        values[key] = tuple(dict.fromkeys([*values[key], *added]))


def _check_not_options(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """Refs and sources reach git, tar and pip argvs: one starting with '-' would be read as an option."""
    for key in ("torch_ref", "torch_repo", "nccl_source", "aws_ofi_nccl_source", "companion_refs", "companion_repos"):
        given = values[key] if isinstance(values[key], Mapping) else {"": values[key]}
        for name, value in given.items():
            label = f"{key}.{name}" if name else key
            try:
                not_an_option(value, label, ProfileError)
            except ProfileError as exc:
                fail(where, key, exc.message, exc.hint)


def _check_python_floor(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """python_version (and python_versions) not older than the torch it builds accepts: found at
    config, not when apt or PyTorch's setup.py refuses it in the build (Quansight's guide sets
    python=3.8, "the minimum required version in PyTorch" when it was written). The floors are
    torch_lines.LINES'."""
    line = torch_lines.line_of(values["torch_version"], values["torch_ref"])
    if line is None:
        return
    for key in ("python_version", "python_versions"):
        given = values[key] if key == "python_versions" else (values[key],)
        old = [v for v in given if torch_lines.older(v, line.python_min)]
        if old:
            problem = (
                f"Python {old[0]} is older than PyTorch {line.torch} accepts "
                f"(torch_version {values['torch_version']}, {where['torch_version']}): it needs Python >= {line.python_min}"
            )
            fail(where, key, problem, f"set {key} to {line.python_min} or newer (one the base image's apt provides)")


def _check_toolchain_floor(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """The GCC (compiler_version, else the base's own gcc where torchbuild knows the base by name)
    and the CUDA (cuda_version) not older than the torch line needs (torch_lines.LINES): PyTorch
    2.12 and later are C++20 and need GCC 11.3, which Ubuntu 20.04's 9.4 is not; found here, not
    an hour into the image and the configure. Native builds with a site module's compiler are
    checked by CMake itself."""
    line = torch_lines.line_of(values["torch_version"], values["torch_ref"])
    if line is None:
        return
    torch = f"PyTorch {line.torch} (torch_version {values['torch_version']}, {where['torch_version']})"
    if values["compiler"] == "gcc":
        key = "compiler_version" if values["compiler_version"] else "base_image"
        gcc = str(values["compiler_version"]) or glibc.base_gcc(values["base_image"])
        if torch_lines.older(gcc, line.gcc_min):
            of = "" if key == "compiler_version" else f" (the gcc of {values['base_image']})"
            fail(
                where,
                key,
                f"GCC {gcc}{of} is older than {torch} needs: GCC >= {line.gcc_min} (C++{line.cxx_standard})",
                f"set compiler_version to {line.gcc_min.split('.')[0]} or newer where the base has it, or a newer base_image",
            )
    if values["cuda_version"] and torch_lines.older(str(values["cuda_version"]), line.cuda_min):
        fail(
            where,
            "cuda_version",
            f"CUDA {values['cuda_version']} is older than {torch} builds with: CUDA >= {line.cuda_min}",
            "set cuda_version (and a base_image of that CUDA) to a newer one, or choose an older torch_version",
        )


def _check_cuda_targets(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """Each cuda_arch_list entry one the CUDA compiles for (cuda_archs.TARGETS: 10.0 needs 12.8,
    CUDA 13 dropped 5.0 to 7.2) and the torch line reads (torch_lines.arch_problem), and a CUDA
    major the torch line's official wheels were built with (official_wheels): found here, not as
    an nvcc or CMake error an hour into the image and the configure."""
    cuda = str(values["cuda_version"])
    if not cuda:
        return
    bad = cuda_archs.cannot_compile(cuda, values["cuda_arch_list"])
    if bad:
        fail(where, "cuda_arch_list", f"{bad[0]} (cuda_version set in {where['cuda_version']})", bad[1])
    line = torch_lines.line_of(values["torch_version"], values["torch_ref"])
    if line is None:
        return
    torch = f"PyTorch {line.torch} (torch_version {values['torch_version']}, {where['torch_version']})"
    for entry in values["cuda_arch_list"]:
        problem = torch_lines.arch_problem(line, entry)
        if problem:
            hint = (
                f"choose torch_version {torch_lines.TWO_DIGIT_ARCH_FROM} or newer, or drop {entry} from cuda_arch_list"
            )
            fail(where, "cuda_arch_list", f"{problem}: {torch}", hint)
    wheels = (
        None
        if values["torch_ref"] in torch_lines.DEVELOPMENT_REFS
        else official_wheels.line_of(values["torch_version"])
    )
    if wheels and official_wheels.cuda_too_new(wheels, cuda):
        newest = official_wheels.newest_cuda(wheels)
        fail(
            where,
            "cuda_version",
            f"CUDA {cuda} is a newer major than {torch} was released for (its newest CUDA is {newest})",
            f"set cuda_version to {newest} (and a base_image of that CUDA), or choose a newer torch_version",
        )


# a CPython source tarball with its sha256, pip's own URL#sha256= form; no user or password in
# the URL (it is printed by config and recorded in the image's labels)
_PYTHON_SOURCE = re.compile(r"(?P<url>https?://[^\s#@]+)#sha256=(?P<sha256>[0-9a-f]{64})")


def python_source(value: str) -> tuple[str, str] | None:
    """(url, sha256) of a python_sources value, None where it is not `http(s)://...#sha256=HEX`."""
    m = _PYTHON_SOURCE.fullmatch(value)
    return (m["url"], m["sha256"]) if m else None


def _check_python_sources(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    for version, value in values["python_sources"].items():
        if python_source(str(value)) is None:
            fail(
                where,
                "python_sources",
                f"entry {version!r} is not an http(s) URL with its sha256 and no user or password "
                f"(URL#sha256=<64 lowercase hex digits>)",
                "e.g. https://www.python.org/ftp/python/3.12.12/Python-3.12.12.tar.xz#sha256=fb85a134...",
            )


def _check_floor_base(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """A base_image whose glibc torchbuild knows by name (core.glibc) above the glibc_floor:
    every wheel built in its image or SIF would need that glibc and fail to import on the site,
    so the profile contradicts itself. Found here, before an image is built or a job queued; a
    base it does not know is left to the build's check of the real toolchain (elffloor)."""
    own = glibc.base_glibc(values["base_image"])
    floor = values["glibc_floor"]
    if not glibc.above(own, floor):
        return
    where_to = glibc.base_advice(floor, values["libstdcxx_floor"])
    fail(
        where,
        "base_image",
        f"{values['base_image']} has glibc {own}, newer than glibc_floor {floor} ({where['glibc_floor']}): a wheel "
        f"built in its image or SIF would need GLIBC_{own} and fail to import on the site",
        f"{where_to}; or empty the floor (--set glibc_floor=) for a wheel for that base only",
    )


def _check_libraries(values: Mapping[str, Any], where: Mapping[str, str], arch: Arch) -> None:
    twice = sorted({v for v in values["python_versions"] if values["python_versions"].count(v) > 1})
    if twice:
        fail(where, "python_versions", f"lists {', '.join(twice)} twice", "list each Python once")
    _check_python_floor(values, where)
    _check_toolchain_floor(values, where)
    _check_cuda_targets(values, where)
    if "mpi" in values["distributed"] and values["mpi"] == "none":
        fail(where, "distributed", "mpi backend requested but mpi is none", "set mpi: openmpi, mpich or system")
    if values["mkl_threading"] and values["blas"] != "mkl":
        fail(where, "mkl_threading", f"only applies with blas: mkl (blas is {values['blas']})", "remove mkl_threading")
    if values["blas"] == "mkl" and arch is Arch.AARCH64:
        fail(where, "blas", "MKL exists only for x86_64", "use openblas or nvpl on aarch64")
    if values["blas"] == "nvpl" and arch is Arch.X86_64:
        fail(where, "blas", "NVPL exists only for aarch64", "use mkl or openblas on x86_64")
    managed = sorted(set(values["runtime_env"]) & RUNTIME_MANAGED)
    if managed:
        fail(
            where,
            "runtime_env",
            f"{', '.join(managed)} is set by the install environment itself (its bin/ first on PATH)",
            "leave it out; host library directories go in host_mpi",
        )
    if not _PROFILE_NAME_RE.fullmatch(values["profile"]):
        fail(where, "profile", "profile names may use letters, digits, '.', '_' and '-'", "rename the file")


# the longest platform tag a wheel of ours may carry, and the longest file written beside it
_WORST_PLATFORM = "manylinux_2_28_aarch64"
_WORST_COMPANION = ".manifest.json"  # longer than .verify.json
_NAME_MAX = 255  # bytes in one file name on Linux file systems


def _check_version(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """The wheel's version must be PEP 440, and its file name (and the manifest beside it) fit
    in a file name: found when the profile resolves, not when the wheel is written hours later."""
    torch_version, local = values["torch_version"], values["local_version"]
    version = f"{torch_version}+{local}" if local else torch_version
    key = "local_version" if local and _is_pep440(torch_version) else "torch_version"
    if not _is_pep440(version):
        raise ProfileError(
            f"{where[key]}: key {key!r}: {version} is not a valid version (PEP 440)",
            hint="use a release like 2.6.0 (or 2.6.0rc1) and a local part of letters, digits and dots",
        )
    py = "cp" + values["python_version"].replace(".", "")
    name = f"torch-{version}-{py}-{py}-{_WORST_PLATFORM}.whl{_WORST_COMPANION}"
    excess = len(name.encode()) - _NAME_MAX
    if excess > 0:
        raise ProfileError(
            f"{where[key]}: key {key!r}: the wheel's manifest would be named {name[:40]}... "
            f"({len(name.encode())} bytes), longer than the {_NAME_MAX} bytes a file name may have",
            hint=f"shorten {key} by at least {excess} character{'s' if excess > 1 else ''}",
        )


def _is_pep440(version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def resolve(
    profile: str = DEFAULT_PROFILE,
    overrides: Iterable[str] = (),
    *,
    arch: str | None = None,
    search_dirs: Sequence[Path] = (),
    host: Arch | None = None,
) -> BuildSpec:
    """Resolve a profile (name or path) with --set overrides into a frozen BuildSpec."""
    keys = schema()
    host = host or Arch.host_or_none()
    path = find_profile(profile, search_dirs)
    layers = _profile_chain(path, search_dirs)
    cli = parse_set(overrides)
    if arch is not None:
        cli.values["arch"] = Arch.parse(arch).value if arch != "host" else "host"
    layers.append(cli)

    merged, origins = _merged(keys, layers)
    merged["profile"] = path.stem
    origins["profile"] = str(path)
    merged["arch"] = _target_arch(merged["arch"], host, origins)
    _with_torch_version_modules(merged, origins)
    _cross_check(merged, origins, merged["arch"])
    _check_version(merged, origins)
    return BuildSpec(**merged, origins=MappingProxyType(origins))


def _merged(keys: Mapping[str, KeySpec], layers: Sequence[_Layer]) -> tuple[dict[str, Any], dict[str, str]]:
    """Every key's value and where it was set: the defaults, then each layer over them (maps merge entry by
    entry)."""
    merged: dict[str, Any] = _checked({k: s.default for k, s in keys.items()}, lambda _: "defaults.yaml")
    merged["cache_dir"] = default_cache_dir()
    origins: dict[str, str] = {k: "defaults.yaml" for k in keys}
    for layer in layers:
        for key, value in _checked(layer.values, layer.where).items():
            if keys[key].type == "map":
                value = MappingProxyType({**merged[key], **value})  # maps merge entry by entry
            merged[key] = value
            origins[key] = layer.where(key)
    return merged, origins


def _target_arch(arch: str, host: Arch | None, origins: Mapping[str, str]) -> Arch:
    """The arch to build for: the profile's, or this host's for 'host' (a ProfileError where torchbuild builds
    for no such machine)."""
    if arch == "host":
        if host is None:
            hint = "set arch: aarch64 or x86_64 in the profile, or pass --arch (the target's, not this host's)"
            fail(
                origins,
                "arch",
                f"'host' is this machine, a {host_machine()}, which torchbuild does not build for",
                hint,
            )
        arch = host.value
    return Arch(arch)


def spec_from_dict(data: Mapping[str, Any], label: str = "spec") -> BuildSpec:
    """Rebuild a BuildSpec from BuildSpec.to_dict() output (the request a container receives)."""
    keys = schema()
    missing = set(keys) - set(data)
    unknown = set(data) - set(keys) - {"profile"}
    if missing or unknown:
        raise ProfileError(f"{label}: keys missing {sorted(missing)} / unknown {sorted(unknown)}")
    values = _checked({k: _plain(data[k]) for k in keys}, lambda _: label)
    values["arch"] = Arch(values["arch"])
    return BuildSpec(profile=str(data["profile"]), **values, origins=MappingProxyType({"profile": label}))


def _structure_spec(data: Any, _: type) -> BuildSpec:
    if not isinstance(data, Mapping):
        raise TypeError("the spec is not a JSON object")
    return spec_from_dict(data, "the request's spec")


# a typed request (records.from_dict) carries its spec as BuildSpec.to_dict()'s plain data
records.converter.register_structure_hook(BuildSpec, _structure_spec)
records.converter.register_unstructure_hook(BuildSpec, BuildSpec.to_dict)


def describe_keys() -> str:
    """The key reference as Markdown rows (used by `invoke config --keys` and the docs' key reference)."""
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for k in schema().values():
        shown = [c or json.dumps(c) for c in k.choices]
        kind = k.type + (f" ({' · '.join(shown)})" if shown else "")
        if k.minimum is not None or k.maximum is not None:
            kind += f" ({_bounds(k)})"
        default = json.dumps(k.default)
        rows.append(f"| `{k.name}` | {kind} | `{default}` | {k.doc} |")
    return "\n".join(rows)


def derived(spec: BuildSpec) -> dict[str, tuple[str, str]]:
    """What the build uses where the profile leaves a key empty: name -> (value, what it is
    derived from): torch_ref from torch_version (the companions' refs and repositories:
    builder.companions.derived). `invoke config` shows them, marked as derived."""
    out: dict[str, tuple[str, str]] = {}
    if not spec.torch_ref:
        out["torch_ref"] = (spec.git_ref, f"torch_version {spec.torch_version}")
    return out


def profile_text(spec: BuildSpec) -> str:
    """The resolved profile as a complete profile file (every key, no `extends`): resolving it
    again gives the same spec. Baked into SIFs and written beside batch jobs."""
    from torchbuild import __version__

    data = {k: v for k, v in spec.to_dict().items() if k != "profile"}
    header = f"# profile {spec.profile} as resolved by torchbuild {__version__} (sha256 {spec.hash})\n"
    return header + yaml.safe_dump(data, sort_keys=False)


def shareable_profile_text(spec: BuildSpec) -> str:
    """profile_text without the credentials of its URLs (core.console.redact): what is baked
    into a SIF, a file people copy and share. A build in the SIF that needs one (a ccache_remote
    password) is given it with --set there; the profile beside a batch job keeps them (0600)."""
    from torchbuild.core.console import redact

    text = profile_text(spec)
    shared = redact(text)
    if shared == text:
        return text
    note = "# credentials in URLs removed (***); give them with --set where a build here needs them\n"
    return note + shared


def default_cache_dir() -> str:
    """cache_dir's default on this host: the user cache directory platformdirs names for
    torchbuild ($XDG_CACHE_HOME/torchbuild where that is set, else ~/.cache/torchbuild). Where it
    is the directory defaults.yaml's default names, that text itself (~/.cache/torchbuild): a
    resolved profile, a manifest and what is keyed on the spec stay as they were."""
    documented = str(schema()["cache_dir"].default)
    path = platformdirs.user_cache_path("torchbuild")
    return documented if path == Path(documented).expanduser() else str(path)


def cache_dir(spec: BuildSpec) -> Path:
    """The profile's cache directory on this host (ccache, pip cache, sources, logs)."""
    return home_path(spec.cache_dir, "cache_dir")


def wanted(spec: BuildSpec) -> bool:
    return spec.nccl == "source" or bool(spec.aws_ofi_nccl_version)
