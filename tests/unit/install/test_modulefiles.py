"""What makes an install environment usable, run for real: runtime_env in a venv's activate
script (sourced by bash, and zsh where installed), the Lua and Tcl literals of the modulefiles
(evaluated by tclsh / lua where installed), and the SIF's %environment lines run by bash."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchbuild.install.modulefiles import (
    HOOK_BEGIN,
    RESTORE,
    ModuleInfo,
    add_activate_hook,
    lua_modulefile,
    lua_string,
    tcl_modulefile,
    tcl_string,
    write_modulefiles,
)
from torchbuild.profile.config import resolve
from torchbuild.sif.host import environment_section

# values a runtime_env may hold that a shell, Lua or Tcl would otherwise interpret
TRICKY = {
    "TB_SPACES": "a b  c",
    "TB_SQUOTE": "it's",
    "TB_DQUOTE": 'say "hi"',
    "TB_DOLLAR": "$HOME/x ${PATH}",
    "TB_BACKTICK": "`echo no` $(echo no)",
    "TB_SEMI": "a; echo injected; b",
    "TB_NEWLINE": "line1\nline2\n",
    "TB_BACKSLASH": "a\\nb\\",
    "NCCL_NET": "AWS Libfabric",
    "TB_WAS_EMPTY": "now set",
}
# the values ahead of activation (set, or set and empty); the others start unset
BEFORE = {"NCCL_NET": "before value", "TB_WAS_EMPTY": ""}


@pytest.fixture(scope="module")
def activate(tmp_path_factory) -> Path:
    """A real venv's bin/activate with TRICKY hooked in."""
    venv = tmp_path_factory.mktemp("hook") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    script = venv / "bin" / "activate"
    script.write_text(add_activate_hook(script.read_text(), TRICKY))
    return script


def _shell(shell: str, script: str, cwd: Path) -> list[str]:
    """Run script in shell with a clean environment; its NUL-separated records."""
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), **BEFORE}
    proc = subprocess.run(
        [shell, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split("\0")


def _dump_cmd() -> str:
    """POSIX lines printing NAME=value (set) or NAME (unset) for each TRICKY name, then `--`."""
    parts = []
    for v in TRICKY:
        parts.append(f'if [ -n "${{{v}+x}}" ]; then printf "%s=%s\\0" {v} "${{{v}}}"; else printf "%s\\0" {v}; fi')
    parts.append("printf -- '--\\0'")
    return "\n".join(parts)


def _states(records: list[str]) -> list[dict[str, str | None]]:
    """The dumps in order: name -> value, or None when unset (#markers left out)."""
    states, current = [], {}
    for rec in records:
        if rec.startswith("#"):
            continue
        if rec == "--":
            states.append(current)
            current = {}
        elif rec:
            name, eq, value = rec.partition("=")
            current[name] = value if eq else None
    return states


SHELLS = [
    "bash",
    pytest.param("zsh", marks=pytest.mark.skipif(not shutil.which("zsh"), reason="zsh is not installed here")),
]


@pytest.mark.parametrize("shell", SHELLS)
def test_activate_sets_literal_values_and_deactivate_restores_the_previous_ones(activate, tmp_path, shell):
    script = f"""
set -eu
{_dump_cmd()}
. {activate}
{_dump_cmd()}
env -0 | grep -z '^TB_\\|^NCCL_NET='
printf -- '--\\0'
command -v {RESTORE} >/dev/null && printf '#hook-defined\\0'
deactivate
{_dump_cmd()}
command -v {RESTORE} >/dev/null && printf '#hook-left\\0' || true
set | grep -q '^_TORCHBUILD_' && printf '#saved-vars-left\\0' || true
printf '#%s\\0' "${{VIRTUAL_ENV:-no venv}}"
"""
    records = _shell(shell, script, tmp_path)
    before, active, exported, after = _states(records)[:4]
    expected_before = {k: None for k in TRICKY} | BEFORE
    assert before == expected_before
    assert active == TRICKY  # each value exactly as written: no expansion, no word splitting
    assert exported == TRICKY  # and exported to the job's processes
    assert after == expected_before  # NCCL_NET back to its value, TB_WAS_EMPTY to "", the others unset
    assert "#hook-defined" in records and "#hook-left" not in records
    assert "#saved-vars-left" not in records
    assert "#no venv" in records  # the venv's own deactivate still ran


def test_activating_twice_then_deactivating_once_restores_the_original(activate, tmp_path):
    script = f"""
set -eu
. {activate}
. {activate}
{_dump_cmd()}
deactivate
{_dump_cmd()}
"""
    active, after = _states(_shell("bash", script, tmp_path))
    assert active == TRICKY
    assert after == {k: None for k in TRICKY} | BEFORE


def test_activate_hook_leaves_an_empty_env_alone_and_refuses_what_it_cannot_hook(tmp_path):
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    text = (venv / "bin" / "activate").read_text()
    assert add_activate_hook(text, {}) == text
    hooked = add_activate_hook(text, {"A": "1"})
    assert HOOK_BEGIN in hooked and text.split("deactivate () {")[0] in hooked
    with pytest.raises(ValueError, match="already"):
        add_activate_hook(hooked, {"A": "1"})
    with pytest.raises(ValueError, match="deactivate"):
        add_activate_hook("# an activate script of some other tool\nexport X=1\n", {"A": "1"})


# --------------------------------------------------------------------------- Lua and Tcl literals

LITERALS = [
    "plain",
    "$HOME and ${X}",
    "[exec id] {braces} ]",
    'double "quotes"',
    "back\\slash\\",
    "new\nline",
    "tab\tand\rreturn",
    "\x01" + "2 digits follow a control character: \x1b" + "f",
    "del\x7f",
    "",
    "semi; colon",
    "caf\u00e9 \u20ac",
]


@pytest.mark.parametrize(
    ("value", "lua"),
    [
        ('a"b', '"a\\"b"'),
        ("a\\b", '"a\\\\b"'),
        ("a\nb\tc\rd", '"a\\nb\\tc\\rd"'),
        ("\x01" + "2", '"\\0012"'),  # always three digits: the "2" stays a character
        ("\x7f", '"\\127"'),
        ("$[]{}", '"$[]{}"'),  # nothing special in a Lua string
    ],
)
def test_lua_string_literals(value, lua):
    assert lua_string(value) == lua


@pytest.mark.parametrize(
    ("value", "tcl"),
    [
        ("$HOME", '"\\$HOME"'),
        ("[exec id]", '"\\[exec id\\]"'),
        ("{x}", '"\\{x\\}"'),
        ('a"b', '"a\\"b"'),
        ("a\\b", '"a\\\\b"'),
        ("a\nb", '"a\\nb"'),
        ("\t", '"\\x09"'),
        ("\x1b" + "f", '"\\x1bf"'),  # two hex digits at most since Tcl 8.6: "f" stays a character
    ],
)
def test_tcl_string_literals(value, tcl):
    assert tcl_string(value) == tcl


def test_lua_reads_each_literal_back_as_the_original_value():
    """Lua 5.4 itself (lupa embeds it) parses each literal back to the original bytes."""
    import lupa.lua54  # a test dependency (pip install -e .[test])

    lua = lupa.lua54.LuaRuntime(encoding=None)
    for v in LITERALS:
        assert lua.eval(lua_string(v).encode()) == v.encode(), v


@pytest.mark.skipif(not shutil.which("tclsh"), reason="tclsh is not installed here")
def test_tcl_reads_each_literal_back_as_the_original_value(tmp_path):
    prog = tmp_path / "t.tcl"
    lines = [f"puts [binary encode hex [encoding convertto utf-8 {tcl_string(v)}]]" for v in LITERALS]
    prog.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = subprocess.run(
        ["tclsh", "-encoding", "utf-8", str(prog)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == [v.encode().hex() for v in LITERALS]


# --------------------------------------------------------------------------- modulefiles

INFO = ModuleInfo(
    name="torch",
    version="2.6.0-gh200",
    prefix="/opt/envs/torch-2.6",
    env={"NCCL_NET": "AWS Libfabric", "FI_PROVIDER": "cxi", "MPICH_GPU_SUPPORT_ENABLED": "1"},
    modules=("PrgEnv-gnu", "cray-mpich/8.1.30", "cudatoolkit/12.6"),
    description="PyTorch environment from torchbuild profile gh200",
)


def test_lua_modulefile_loads_modules_in_order_and_pushes_runtime_env():
    lines = lua_modulefile(INFO).splitlines()
    assert lines[0].startswith("-- torch/2.6.0-gh200")
    deps = [ln for ln in lines if ln.startswith("depends_on(")]
    assert deps == ['depends_on("PrgEnv-gnu")', 'depends_on("cray-mpich/8.1.30")', 'depends_on("cudatoolkit/12.6")']
    assert 'family("torch")' in lines
    assert 'prepend_path("PATH", "/opt/envs/torch-2.6/bin")' in lines
    assert 'setenv("VIRTUAL_ENV", "/opt/envs/torch-2.6")' in lines
    pushed = [ln for ln in lines if ln.startswith("pushenv(")]
    assert pushed == [
        'pushenv("NCCL_NET", "AWS Libfabric")',
        'pushenv("FI_PROVIDER", "cxi")',
        'pushenv("MPICH_GPU_SUPPORT_ENABLED", "1")',
    ]
    # modules are loaded before the environment's own settings
    assert lines.index(deps[-1]) < lines.index('prepend_path("PATH", "/opt/envs/torch-2.6/bin")')
    assert not any(ln.startswith("setenv(") and "NCCL" in ln for ln in lines)  # setenv would not restore


def test_tcl_modulefile_loads_modules_in_order_and_pushes_runtime_env():
    text = tcl_modulefile(INFO)
    lines = text.splitlines()
    assert text.startswith("#%Module")
    assert 'conflict "torch"' in lines
    loads = [ln for ln in lines if ln.startswith("module load ")]
    assert loads == ['module load "PrgEnv-gnu"', 'module load "cray-mpich/8.1.30"', 'module load "cudatoolkit/12.6"']
    assert 'prepend-path PATH "/opt/envs/torch-2.6/bin"' in lines
    assert 'setenv VIRTUAL_ENV "/opt/envs/torch-2.6"' in lines
    pushed = [ln for ln in lines if ln.startswith("pushenv ")]
    assert pushed == [
        'pushenv "NCCL_NET" "AWS Libfabric"',
        'pushenv "FI_PROVIDER" "cxi"',
        'pushenv "MPICH_GPU_SUPPORT_ENABLED" "1"',
    ]


TCL_STUBS = r"""
proc emit {args} { set out {}; foreach a $args { lappend out [binary encode hex [encoding convertto utf-8 $a]] }; puts [join $out " "] }
foreach cmd {module-whatis conflict module prepend-path setenv pushenv} { proc $cmd {args} "emit $cmd {*}\$args" }
"""


@pytest.mark.skipif(not shutil.which("tclsh"), reason="tclsh is not installed here")
def test_tcl_modulefile_runs_in_tcl_with_the_exact_values(tmp_path):
    """The whole file sourced by tclsh (module commands stubbed to print their arguments), with
    a prefix and values full of Tcl syntax, and its ModulesHelp called."""
    info = ModuleInfo(
        name="torch",
        version="2.6.0",
        prefix="/opt/{odd}/[dir]/$x",
        env=dict(TRICKY) | {"TB_BRACES": "} {"},
        modules=("cray-mpich/8.1.30",),
        description="profile {cpu}",
    )
    _lua, tcl = write_modulefiles(tmp_path, info)
    prog = tmp_path / "run.tcl"
    prog.write_text(TCL_STUBS + f"source {{{tcl}}}\nModulesHelp\n", encoding="utf-8")
    proc = subprocess.run(["tclsh", str(prog)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    calls = [[bytes.fromhex(x).decode() for x in ln.split(" ")] for ln in proc.stdout.splitlines()]
    pushed = {c[1]: c[2] for c in calls if c[0] == "pushenv"}
    assert pushed == dict(info.env)
    assert ["prepend-path", "PATH", "/opt/{odd}/[dir]/$x/bin"] in calls
    assert ["setenv", "VIRTUAL_ENV", "/opt/{odd}/[dir]/$x"] in calls
    assert ["module", "load", "cray-mpich/8.1.30"] in calls
    assert ["conflict", "torch"] in calls
    assert "/opt/{odd}/[dir]/$x" in proc.stderr and "profile {cpu}" in proc.stderr  # the help text


def test_write_modulefiles_writes_lua_and_tcl_under_name_and_version(tmp_path):
    lua, tcl = write_modulefiles(tmp_path / "modulefiles", INFO)
    assert lua == tmp_path / "modulefiles" / "torch" / "2.6.0-gh200.lua"
    assert tcl == tmp_path / "modulefiles" / "torch" / "2.6.0-gh200"
    assert lua.read_text() == lua_modulefile(INFO)
    assert tcl.read_text() == tcl_modulefile(INFO)
    # written again (a reinstall): replaced, not appended to
    write_modulefiles(tmp_path / "modulefiles", INFO)
    assert tcl.read_text() == tcl_modulefile(INFO)


# --------------------------------------------------------------------------- the SIF's %environment


def _section(tmp_path: Path, host_mpi: list[Path]) -> str:
    dirs = ", ".join(str(d) for d in host_mpi)
    spec = resolve("cpu", [f"host_mpi=[{dirs}]", 'runtime_env={NCCL_NET: "it\'s $HOME", FI_PROVIDER: cxi}'])
    return environment_section(spec)


def test_environment_section_orders_build_then_runtime_then_host_mpi(tmp_path):
    text = _section(tmp_path, [tmp_path / "mpi"])
    lines = [ln.strip() for ln in text.splitlines()]
    runtime = lines.index("# runtime_env: what jobs that run torch need")
    assert any(ln.startswith("export CC=") for ln in lines[:runtime])
    assert lines[runtime + 1 : runtime + 3] == ["export NCCL_NET='it'\"'\"'s $HOME'", "export FI_PROVIDER=cxi"]
    host = next(i for i, ln in enumerate(lines) if ln.startswith("# host_mpi"))
    assert host > runtime + 2
    assert lines[host + 1].startswith(f"if [ -d {tmp_path / 'mpi'} ]; then LD_LIBRARY_PATH=")


@pytest.mark.parametrize("earlier", ["/usr/earlier/lib", None])
def test_environment_section_puts_only_the_bound_host_mpi_dirs_first(tmp_path, earlier):
    present, missing, second = tmp_path / "cray-mpich" / "lib", tmp_path / "not-bound", tmp_path / "pmi" / "lib"
    present.mkdir(parents=True)
    second.mkdir(parents=True)
    text = _section(tmp_path, [present, missing, second])
    script = text + '\nprintf "%s\\0%s\\0%s" "${LD_LIBRARY_PATH-unset}" "$NCCL_NET" "$CC"\n'
    env = {"PATH": os.environ["PATH"], "HOME": "/home/u"}
    if earlier:
        env["LD_LIBRARY_PATH"] = earlier
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    ld, nccl, cc = proc.stdout.split("\0")
    want = [str(present), str(second)] + ([earlier] if earlier else [])
    assert ld.split(":") == want  # no empty entry (the current directory) when it was unset
    assert nccl == "it's $HOME"
    assert cc == "gcc"
