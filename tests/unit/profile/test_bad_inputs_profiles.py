"""Bad profiles, --set values and --jobs: each is a named error with the file (and line)
and a one-line hint, found when the profile resolves, never a traceback or hours later."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import TEST_TORCH

from torchbuild.core.errors import ProfileError, UsageError
from torchbuild.profile.config import parse_jobs_option, resolve

LONG_LOCAL = "a" * 220

# (what is wrong with the file, its bytes, the words the message must hold)
BAD_PROFILE_FILES = [
    ("latin-1 byte on line 1", b"description: caf\xe9\n", ["bad.yaml:1", "not UTF-8"]),
    ("latin-1 byte on line 3", b"# a profile\nblas: openblas\ndescription: \xe9t\xe9\n", ["bad.yaml:3", "not UTF-8"]),
    ("UTF-16 file", "description: x\n".encode("utf-16"), ["bad.yaml:1", "not UTF-8"]),
    ("empty file", b"", ["bad.yaml", "the profile is empty"]),
    ("only comments", b"# nothing here yet\n", ["bad.yaml", "the profile is empty"]),
    ("only blank lines", b"\n\n  \n", ["bad.yaml", "the profile is empty"]),
    ("top key twice", b"blas: mkl\nmpi: none\nblas: openblas\n", ["bad.yaml:3", "'blas' is given twice", "line 1"]),
    ("map entry twice", b"switches:\n  USE_A: 1\n  USE_A: 0\n", ["bad.yaml:3", "'USE_A' is given twice", "line 2"]),
    ("extends twice", b"extends: cpu\nextends: cuda\n", ["bad.yaml:2", "'extends' is given twice"]),
    ("flow map entry twice", b"env: {A: '1', A: '2'}\n", ["bad.yaml:1", "'A' is given twice"]),
    (
        "local_version making the file name too long",
        f"description: x\nlocal_version: {LONG_LOCAL}\n".encode(),
        ["bad.yaml:2", "'local_version'", "255 bytes"],
    ),
    ("torch_version not PEP 440", b"torch_version: 2.6.0abc\n", ["bad.yaml:1", "'torch_version'", "PEP 440"]),
    ("torch_version with two dots", b"torch_version: 2.6.0..\n", ["bad.yaml:1", "PEP 440"]),
    (
        "a raw ESC (YAML's reader refuses it)",
        b"description: a\x1b[31mb\n",
        ["bad.yaml", "holds the control character U+001B (ESC)"],
    ),
    ("a raw NUL", b"description: a\x00b\n", ["bad.yaml", "holds the control character U+0000"]),
]


@pytest.mark.parametrize(("what", "data", "words"), BAD_PROFILE_FILES, ids=[c[0] for c in BAD_PROFILE_FILES])
def test_bad_profile_file_is_named(tmp_path: Path, what, data, words):
    path = tmp_path / "bad.yaml"
    path.write_bytes(data)
    with pytest.raises(ProfileError) as exc:
        resolve(str(path))
    for word in words:
        assert word in exc.value.message, (word, exc.value.message)
    assert exc.value.hint and "\n" not in exc.value.hint


# (what the user typed after --set, the words the message must hold)
BAD_SET_VALUES = [
    ("switches={USE_X: 1", ["--set switches=", "not valid YAML"]),
    ("cflags=[-O2", ["--set cflags=", "not valid YAML"]),
    ("cuda_arch_list=[8.0", ["--set cuda_arch_list=", "not valid YAML"]),
    ("nvcc_threads=[", ["--set nvcc_threads=", "not valid YAML"]),
    ("module_purge={", ["--set module_purge=", "not valid YAML"]),
    ("env={A: [}", ["--set env=", "not valid YAML"]),
    (f"local_version={LONG_LOCAL}", ["--set", "'local_version'", "255 bytes"]),
    ("torch_version=2.6.0xyz", ["--set", "'torch_version'", "PEP 440"]),
]


@pytest.mark.parametrize(("item", "words"), BAD_SET_VALUES, ids=[c[0][:30] for c in BAD_SET_VALUES])
def test_bad_set_value_is_named(item, words):
    with pytest.raises(ProfileError) as exc:
        resolve("cpu", [item])
    for word in words:
        assert word in exc.value.message, (word, exc.value.message)
    assert exc.value.hint and "\n" not in exc.value.hint


def test_longest_local_version_that_fits_is_accepted():
    # torch-2.6.0+<L>-cp312-cp312-manylinux_2_28_aarch64.whl.manifest.json is 255 bytes
    fixed = len("torch-2.6.0+-cp312-cp312-manylinux_2_28_aarch64.whl.manifest.json")
    local = "a" * (255 - fixed)
    assert resolve("cpu", [TEST_TORCH, f"local_version={local}", "python_version=3.12"]).local_version == local
    with pytest.raises(ProfileError, match="256 bytes") as exc:
        resolve("cpu", [TEST_TORCH, f"local_version={local}a", "python_version=3.12"])
    assert exc.value.hint == "shorten local_version by at least 1 character"


# (what the user gave to --jobs, the words the message must hold)
BAD_JOBS = [
    ("0", "'0'"),
    ("-1", "'-1'"),
    (-2, "-2"),
    ("many", "'many'"),
    ("1.5", "'1.5'"),
    (2.5, "2.5"),
    (True, "True"),
]


@pytest.mark.parametrize(("value", "shown"), BAD_JOBS, ids=[repr(c[0]) for c in BAD_JOBS])
def test_bad_jobs_option_is_a_usage_error(value, shown):
    with pytest.raises(UsageError) as exc:
        parse_jobs_option(value)
    assert exc.value.message.startswith(f"--jobs {shown}:") and ">= 1" in exc.value.message


@pytest.mark.parametrize(
    ("value", "jobs"), [(0, 0), (None, 0), ("", 0), ("auto", 0), (1, 1), ("4", 4), (" 8 ", 8), (16, 16)]
)
def test_jobs_option_values(value, jobs):
    assert parse_jobs_option(value) == jobs


def test_jobs_option_names_the_option_it_checks():
    with pytest.raises(UsageError, match=r"^--max-jobs 'x':"):
        parse_jobs_option("x", "--max-jobs")


# issue 41 item 1: a control character in a value that reaches an environment (a line break in
# runtime_env ran as a command on `module load` with Environment Modules 5.5 and Lmod 8.6)
# (the route, how the value is given: a profile's text, a profile it extends, or --set items)
CONTROL_ROUTES = {
    "profile": ('runtime_env:\n  NCCL_SOCKET_IFNAME: "hsn{c}/tmp/pwn.sh{c}"\n', None, []),
    "extends": ("extends: base.yaml\ndescription: child\n", 'runtime_env: {{A: "x{c}y"}}\n', []),
    "--set map": ("description: plain\n", None, ['runtime_env={{A: "x{c}y"}}']),
    "--set entry": ("description: plain\n", None, ["runtime_env.A=x{c}y"]),
    "--set env": ("description: plain\n", None, ["env.CFLAGS_EXTRA=a{c}b"]),
    "--set list": ("description: plain\n", None, ['cflags=["-O2{c}-g"]']),
    "--set str": ("description: plain\n", None, ["cuda_home=/usr{c}/local"]),
    "package env": ('runtime_packages:\n  - {{requirement: six, env: {{SIX_X: "a{c}b"}}}}\n', None, []),
}
CONTROLS = {"newline": "\n", "cr": "\r", "tab": "\t", "esc": "\x1b", "nul": "\x00", "del": "\x7f", "csi": "\x9b"}


@pytest.mark.parametrize("char", sorted(CONTROLS))
@pytest.mark.parametrize("route", sorted(CONTROL_ROUTES))
def test_a_control_character_in_a_value_is_refused_for_every_route(tmp_path: Path, route, char):
    """A newline, carriage return, tab, escape, NUL, DEL or C1 character in any value, from the
    profile, a profile it extends or --set, is a ProfileError naming the key and the character
    (shown escaped, never the raw value), with a one-line hint: nothing installs it."""
    c = CONTROLS[char]
    text, base, sets = CONTROL_ROUTES[route]
    if base is not None:
        (tmp_path / "base.yaml").write_text(base.format(c=c.encode("unicode_escape").decode()))
    path = tmp_path / "p.yaml"
    # in YAML text the character goes as its double-quoted escape (a raw one is a reader error)
    path.write_text(text.format(c=c.encode("unicode_escape").decode()))
    # a --set value in YAML ({...}, [...]) holds the character by its escape too (YAML folds a raw
    # line break in a quoted scalar into a space); a plain --set value holds it as it is
    sets = [s.format(c=c.encode("unicode_escape").decode() if s.split("=", 1)[1][:1] in "[{" else c) for s in sets]
    with pytest.raises(ProfileError, match="control character") as exc:
        resolve(str(path), sets)
    assert exc.value.exit_code == 2 and exc.value.hint and "\n" not in exc.value.hint
    assert c not in exc.value.message and "pwn" not in exc.value.message, exc.value.message
    assert repr(c).strip("'") in exc.value.message


def test_printable_shell_and_lua_characters_in_runtime_env_are_kept(tmp_path: Path):
    """Quotes, $, backticks, ;, brackets and non-ASCII text are data, not control characters:
    they stay (the modulefiles quote them; tests/integration/test_modules_control.py loads them)."""
    value = 'it\'s $HOME; `id` [x] {y} "q" \\ caf\u00e9 \u4e2d'
    spec = resolve("cpu", [f"runtime_env.TB_Q={value}"])
    assert spec.runtime_env["TB_Q"] == value
