"""What makes an install environment usable: runtime_env in its activate script (restored by
deactivate), and modulefiles for Lmod (Lua) and Environment Modules (Tcl); with the comms stack
an install carries, its library directories first on LD_LIBRARY_PATH (`prepend`).

Every value is written as a literal of the language that reads it: shell words through
shlex.quote, Lua and Tcl strings with their own escapes. Nothing here runs anything.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from torchbuild.runtime.environment import prepend_path_lines

HOOK_BEGIN = "# >>> torchbuild: runtime_env >>>"
HOOK_END = "# <<< torchbuild: runtime_env <<<"
RESTORE = "_torchbuild_runtime_restore"
DEACTIVATE = re.compile(r"^deactivate \(\) \{\n", re.M)


@dataclasses.dataclass(frozen=True)
class ModuleInfo:
    """What a modulefile says: the module's name and version, the environment's prefix, what
    it sets and loads, and a line of provenance."""

    name: str
    version: str
    prefix: str
    env: Mapping[str, str]
    modules: Sequence[str] = ()
    description: str = ""
    prepend: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)  # var -> dirs, first first


# --------------------------------------------------------------------------- activate


def _saved(var: str) -> tuple[str, str]:
    return f"_TORCHBUILD_HAD_{var}", f"_TORCHBUILD_OLD_{var}"


def activate_hook(env: Mapping[str, str], prepend: Mapping[str, Sequence[str]] | None = None) -> tuple[str, str]:
    """(restore function, exports) for a venv's bin/activate. The exports remember each
    variable's previous value (or that it was unset), set env, then put prepend's directories
    first on their colon lists (after env: a runtime_env LD_LIBRARY_PATH comes after them); the
    function, called first thing by deactivate (and so by every re-activation), puts it back."""
    restore = [f"{RESTORE} () {{"]
    exports = [HOOK_BEGIN]
    for var in dict.fromkeys([*env, *(prepend or {})]):
        had, old = _saved(var)
        restore += [
            f'    if [ "${{{had}:-}}" = 1 ]; then {var}="${{{old}:-}}"; export {var}',
            f'    elif [ "${{{had}:-}}" = 0 ]; then unset {var}; fi',
            f"    unset {had} {old}",
        ]
        exports.append(f'if [ -n "${{{var}+x}}" ]; then {had}=1; {old}="${{{var}}}"; else {had}=0; fi')
        if var in env:
            exports.append(f"{var}={shlex.quote(env[var])}; export {var}")
    for var, dirs in (prepend or {}).items():
        exports += prepend_path_lines(var, list(dirs))
    restore += [f'    if [ ! "${{1:-}}" = nondestructive ]; then unset -f {RESTORE}; fi', "}"]
    exports.append(HOOK_END)
    return "\n".join([HOOK_BEGIN, *restore, HOOK_END]) + "\n", "\n".join(exports) + "\n"


def add_activate_hook(text: str, env: Mapping[str, str], prepend: Mapping[str, Sequence[str]] | None = None) -> str:
    """bin/activate (as `python -m venv` writes it) with runtime_env exported at its end (and
    prepend's directories first on their lists), restored by deactivate. ValueError when the
    script has no `deactivate () {` to hook into."""
    if not env and not prepend:
        return text
    if HOOK_BEGIN in text:
        raise ValueError("the activate script already has torchbuild's runtime_env")
    match = DEACTIVATE.search(text)
    if match is None:
        raise ValueError("the activate script defines no `deactivate () {`")
    restore, exports = activate_hook(env, prepend)
    head, tail = text[: match.end()], text[match.end() :]
    call = f'    {RESTORE} "${{1:-}}"\n'
    body = text[: match.start()] + restore + head[match.start() :] + call + tail
    return body.rstrip("\n") + "\n\n" + exports


def _literal_table(special: dict[str, str], control: str) -> dict[int, str]:
    """A str.translate table for a double-quoted literal: the language's special characters
    as given, other control characters (0-31, 127) in its numeric escape (control.format)."""
    table = {code: control.format(code) for code in (*range(32), 127)}
    table.update({ord(ch): escaped for ch, escaped in special.items()})
    return table


# --------------------------------------------------------------------------- Lua (Lmod)

# Lua: backslash escapes; a decimal \ddd for the other control characters
_LUA = _literal_table({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}, "\\{:03d}")


def lua_string(value: str) -> str:
    """A Lua double-quoted string literal for value (control characters as \\ddd)."""
    return '"' + value.translate(_LUA) + '"'


def lua_modulefile(info: ModuleInfo) -> str:
    s = lua_string
    lines = [
        f"-- {info.name}/{info.version}: written by torchbuild; {info.description}".rstrip("; ").replace("\n", " "),
        f"whatis({s('Name: ' + info.name)})",
        f"whatis({s('Version: ' + info.version)})",
        f"whatis({s('Description: ' + (info.description or 'PyTorch install environment'))})",
        f"help({s(_help(info))})",
        f"family({s(info.name)})",
    ]
    lines += [f"depends_on({s(m)})" for m in info.modules]
    lines += [
        f"prepend_path({s('PATH')}, {s(info.prefix + '/bin')})",
        f"setenv({s('VIRTUAL_ENV')}, {s(info.prefix)})",
    ]
    # pushenv: unloading puts back what was there before (setenv would unset it)
    lines += [f"pushenv({s(k)}, {s(v)})" for k, v in info.env.items()]
    # each prepend_path goes in front of the one before: the last directory first
    lines += [f"prepend_path({s(k)}, {s(d)})" for k, dirs in info.prepend.items() for d in reversed(dirs)]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- Tcl (Environment Modules)

# Tcl: no $ substitution, no [command], no {} or "" word ends; \xhh for control characters
_TCL = _literal_table(
    {"\\": "\\\\", '"': '\\"', "$": "\\$", "[": "\\[", "]": "\\]", "{": "\\{", "}": "\\}", "\n": "\\n"},
    "\\x{:02x}",
)


def tcl_string(value: str) -> str:
    """A Tcl double-quoted word for value: no substitution, no command, newlines escaped."""
    return '"' + value.translate(_TCL) + '"'


def tcl_modulefile(info: ModuleInfo) -> str:
    t = tcl_string
    help_lines = "\n".join(f"    puts stderr {t(line)}" for line in _help(info).splitlines())
    lines = [
        "#%Module1.0",
        f"## {info.name}/{info.version}: written by torchbuild".replace("\n", " "),
        "proc ModulesHelp { } {",
        help_lines,
        "}",
        f"module-whatis {t(f'{info.name} {info.version}: ' + (info.description or 'PyTorch install environment'))}",
        f"conflict {t(info.name)}",
    ]
    # Environment Modules 5 loads these with torch and unloads them with it when nothing else needs them
    lines += [f"module load {t(m)}" for m in info.modules]
    lines += [f"prepend-path PATH {t(info.prefix + '/bin')}", f"setenv VIRTUAL_ENV {t(info.prefix)}"]
    lines += [f"pushenv {t(k)} {t(v)}" for k, v in info.env.items()]
    lines += [f"prepend-path {t(k)} {t(d)}" for k, dirs in info.prepend.items() for d in reversed(dirs)]
    return "\n".join(lines) + "\n"


def _help(info: ModuleInfo) -> str:
    lines = [f"{info.name} {info.version}: the Python environment at {info.prefix}"]
    if info.description:
        lines.append(info.description)
    if info.modules:
        lines.append("loads: " + " ".join(info.modules))
    if info.env:
        lines.append("sets: " + " ".join(info.env))
    for var, dirs in info.prepend.items():
        lines.append(f"puts first on {var}: " + " ".join(dirs))
    return "\n".join(lines)


def write_modulefiles(root: Path, info: ModuleInfo) -> tuple[Path, Path]:
    """root/<name>/<version>.lua (Lmod) and root/<name>/<version> (Environment Modules' Tcl;
    Lmod prefers the .lua of the two). Returns both paths."""
    d = root / info.name
    d.mkdir(parents=True, exist_ok=True)
    lua, tcl = d / f"{info.version}.lua", d / info.version
    lua.write_text(lua_modulefile(info))
    tcl.write_text(tcl_modulefile(info))
    return lua, tcl
