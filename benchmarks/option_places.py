"""How many places declare each option, and how long the functions are (issue 43, item 2).

    python benchmarks/option_places.py [--json]

An option is a profile key or a task's flag (`--set` is set_, `--gpu-type` gpu_type). A place
that declares one is hand-written text that has to change when the option is added:

- yaml:   a top-level key of configs/defaults.yaml (unless the file says it is generated)
- model:  a field of any class declared with key(...) (a profile key), option(...) (a flag) or
          positional(...) (a task's positional argument, as inside.step's): the options model,
          where one declaration gives the field, the flag, its help and argv
- field:  any other annotated field of a class that holds option values as given
          (OPTION_CLASSES: BuildSpec, Launch, BuildOptions, the job's Runtime)
- param:  a parameter of a task function (a function decorated with @task or @launch_task)
- help:   a key of a task's help={...} dict, or of a module-level *HELP dict in a task module
          (tasks/, a feature's task.py or *_task.py, runtime/tasks.py)
- argv:   a "--flag" string literal in the functions of batch/host.py that write the batch
          job's torchbuild command (ARGV_FUNCTIONS)
- names:  a string in a module-level tuple of option names in a task module (JOB_OPTIONS...)

A field and a flag are one option where their names differ only as ALIASES say (targets is
--target, oom_retry is --no-retry). What a model derives at import time (a signature built
from fields, help taken from the model) is not text anyone edits, so it is not counted; nor is
a field declared with a call in DERIVED_CALLS, whose name, default and help come from the
declaration it names (key_option("module_purge"): the switch of that bool key, its help the
key's flag=; like(LaunchOptions, "sif"): that field's default and help): --json lists those
under "derived".
The longest function and the functions over 40 lines: benchmarks/code_shape.py.
"""

from __future__ import annotations

import ast
import collections
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "torchbuild"
# a field named otherwise than its flag (runtime.options.BuildOptions' targets is --target)
ALIASES = {"targets": "target", "canaries": "canary", "oom_retry": "no_retry", "verify": "no_verify", "set": "set_"}
TASK_DECORATORS = {"task", "launch_task", "options_task"}
GENERATED_MARK = "generated from"
OPTION_CLASSES = {"BuildSpec", "Launch", "BuildOptions", "Runtime"}
MODEL_CALLS = {"key", "option", "positional"}
DERIVED_CALLS = {"key_option", "like"}
ARGV_FUNCTIONS = {"_make_job", "_comms_first", "_profile_argv", "args"}


def _name(text: str, field: bool = False) -> str:
    """An option's name (a flag's or a field's: a field's by ALIASES, as its flag is named)."""
    text = text.lstrip("-").replace("-", "_")
    return ALIASES.get(text, text) if field or text == "set" else text


def _yaml_keys() -> list[str]:
    path = ROOT / "configs" / "defaults.yaml"
    text = path.read_text()
    if GENERATED_MARK in text.split("\n", 1)[0]:
        return []
    return list(yaml.safe_load(text))


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def _dict_keys(node: ast.expr) -> list[str]:
    if not isinstance(node, ast.Dict):
        return []
    return [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]


def _task_places(tree: ast.Module, rel: str, places: dict[str, list[str]]) -> None:
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        decorators = [d for d in node.decorator_list if _decorator_name(d) in TASK_DECORATORS]
        if not decorators:
            continue
        for arg in [*node.args.args[1:], *node.args.kwonlyargs]:
            annotation = ast.unparse(arg.annotation) if arg.annotation else ""
            # a model (Launch, BuildOptions...), the profile keys' flags (Mapping) or the Problems: not flags
            if not annotation[:1].isupper():
                places[_name(arg.arg)].append(f"param {rel}:{node.name}")
        for dec in decorators:
            for kw in dec.keywords if isinstance(dec, ast.Call) else []:
                if kw.arg == "help":
                    for key in _dict_keys(kw.value):
                        places[_name(key)].append(f"help {rel}:{node.name}")


def _module_places(tree: ast.Module, rel: str, places: dict[str, list[str]]) -> None:
    for node in tree.body:
        if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Name):
            continue
        name = node.targets[0].id
        if _task_module(rel) and name.endswith("HELP"):
            for key in _dict_keys(node.value):
                places[_name(key)].append(f"help {rel}:{name}")
        if _task_module(rel) and name.endswith("OPTIONS") and isinstance(node.value, (ast.Tuple, ast.List)):
            for elt in node.value.elts:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    places[_name(elt.value)].append(f"names {rel}:{name}")


def _task_module(rel: str) -> bool:
    """A module of tasks: tasks/, a feature's task.py or *_task.py, the shared runtime/tasks.py."""
    return rel.startswith("tasks/") or rel.endswith("task.py") or rel == "runtime/tasks.py"


def derived_fields() -> dict[str, list[str]]:
    """The fields declared by naming another declaration (DERIVED_CALLS), by option: not counted."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    value = item.value if isinstance(item, ast.AnnAssign) else None
                    if isinstance(value, ast.Call) and _decorator_name(value) in DERIVED_CALLS:
                        named = [a.value for a in value.args if isinstance(a, ast.Constant)] or ["?"]
                        out[str(named[0])].append(f"{_decorator_name(value)} {path.relative_to(SRC)}:{node.name}")
    return dict(out)


def _field_places(tree: ast.Module, rel: str, places: dict[str, list[str]], options: set[str]) -> None:
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not isinstance(item, ast.AnnAssign) or not isinstance(item.target, ast.Name):
                continue
            name = _name(item.target.id, field=node.name != "BuildSpec" and not _is_key(item))
            called = _decorator_name(item.value) if isinstance(item.value, ast.Call) else ""
            if called in DERIVED_CALLS:  # derived_fields() lists it
                continue
            if called in MODEL_CALLS:
                places[name].append(f"model {rel}:{node.name}")
            elif node.name in OPTION_CLASSES and name in options:
                places[name].append(f"field {rel}:{node.name}")


def _argv_places(tree: ast.Module, rel: str, places: dict[str, list[str]], options: set[str]) -> None:
    if rel != "batch/host.py":
        return
    functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name in ARGV_FUNCTIONS]
    for node in (n for f in functions for n in ast.walk(f)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--"):
            name = _name(node.value.split("=", 1)[0])
            if name in options:
                places[name].append(f"argv {rel}:{node.lineno}")


def _is_key(item: ast.AnnAssign) -> bool:
    return isinstance(item.value, ast.Call) and _decorator_name(item.value) == "key"


def option_places() -> dict[str, list[str]]:
    places: dict[str, list[str]] = collections.defaultdict(list)
    for key in _yaml_keys():
        places[key].append("yaml configs/defaults.yaml")
    trees = {str(p.relative_to(SRC)): ast.parse(p.read_text()) for p in sorted(SRC.rglob("*.py"))}
    for rel, tree in trees.items():
        _task_places(tree, rel, places)  # wherever a task is: tasks/, each feature's task.py
        _module_places(tree, rel, places)
    # the profile keys and flags found so far are the options; fields and argv literals of the
    # same names are further places of them (a class's other fields are not options)
    options = set(places) | _model_keys() | _all_flags()
    for rel, tree in trees.items():
        _field_places(tree, rel, places, options)
        _argv_places(tree, rel, places, options)
    return {k: places[k] for k in sorted(options)}


def _model_keys() -> set[str]:
    """The profile keys wherever they are declared (the model, once defaults.yaml is generated)."""
    sys.path.insert(0, str(ROOT / "src"))
    from torchbuild.profile.config import schema

    return set(schema())


def _all_flags() -> set[str]:
    from torchbuild.tasks import ns

    return {_name(a.name) for t in ns.task_names for a in ns[t].get_arguments()}


def _task_flags(*tasks: str) -> set[str]:
    """The flags of these tasks (as invoke lists them), by option name, less the launch options
    every launching task shares (profile, arch, set, engine...: Launch and HELP, one place each)."""
    from torchbuild.runtime.tasks import HELP, RUNTIME_HELP
    from torchbuild.tasks import ns

    shared = {*HELP, *RUNTIME_HELP}
    return {_name(a.name) for t in tasks for a in ns[t].get_arguments() if a.name not in shared}


# where build's and submit's options are declared: their tasks, the models they take, the job's argv
BUILD_SUBMIT_PLACES = ("builder/task.py:build", "batch/task.py", "runtime/tasks.py", "builder/host.py")
BUILD_SUBMIT_PLACES += ("batch/host.py", "profile/keys.py", "profile/config.py")


def _there(where: list[str]) -> list[str]:
    return [w for w in where if w.split(" ", 1)[1].startswith(BUILD_SUBMIT_PLACES)]


def main() -> None:
    places = option_places()
    counts = collections.Counter(len(v) for v in places.values())
    keys = _model_keys()
    build_submit = _task_flags("build", "submit")
    figures = {
        "profile_keys": len(keys),
        "profile_key_places_max": max(len(places[k]) for k in keys),
        "profile_keys_in_more_than_one_place": sum(1 for k in keys if len(places[k]) > 1),
        "build_submit_flags": len(build_submit),
        "build_submit_flag_places_max": max(len(places[k]) for k in build_submit),
        "build_submit_flags_in_more_than_one_place": sum(1 for k in build_submit if len(places[k]) > 1),
        # only the places that declare them for build and submit (a flag of the same name in
        # another task, install's --out, is another option)
        "build_submit_flag_places_max_there": max(len(_there(places[k])) for k in build_submit),
        "build_submit_flags_in_more_than_one_place_there": sum(1 for k in build_submit if len(_there(places[k])) > 1),
        "options": len(places),
        "declarations": sum(len(v) for v in places.values()),
        "max_places": max(len(v) for v in places.values()),
        "options_by_places": dict(sorted(counts.items())),
        "options_in_more_than_one_place": sum(1 for v in places.values() if len(v) > 1),
    }
    if "--json" in sys.argv:
        print(json.dumps({"figures": figures, "places": places, "derived": derived_fields()}, indent=1))
        return
    for key, value in figures.items():
        print(f"{key}: {value}")
    print("most places:")
    for name, where in sorted(places.items(), key=lambda kv: -len(kv[1]))[:12]:
        print(f"  {name} ({len(where)}): {', '.join(where)}")


if __name__ == "__main__":
    main()
