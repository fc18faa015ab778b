"""Hostile profiles and --set values (issue 27 items 9, 16, 20, 28): alias bombs, nesting, huge
numbers, infinities, ~users that do not exist, a directory as a profile. Each is a ProfileError
naming the key or the file, quickly and in bounded memory, never a traceback."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

import pytest

from torchbuild.core.errors import ProfileError, UsageError
from torchbuild.profile.config import parse_jobs_option, resolve
from torchbuild.runtime.tasks import spec_from


def _laughs(levels: int = 9) -> str:
    """The billion-laughs document: each anchor repeats the one before ten times."""
    lines = ["description: x", "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


def _one_megabyte_of_aliases() -> str:
    """A 1 MB profile: one anchored map of 50 entries, repeated through 20,000 aliases."""
    head = "description: x\nenv: &e {" + ", ".join(f"K{i}: v" for i in range(50)) + "}\n"
    return head + "apt_packages: [" + ", ".join(["*e"] * 20_000) + "]\n"


# (what is hostile about the file, its text, the words the message must hold)
HOSTILE_FILES = [
    ("billion laughs", _laughs(), ["bad.yaml:", "expands to more than"]),
    ("20,000 aliases of one map", _one_megabyte_of_aliases(), ["bad.yaml:3", "expands to more than"]),
    ("alias inside its own anchor", "description: x\nenv: &a [*a]\n", ["bad.yaml:2", "*a", "loop"]),
    ("alias inside its own map", "description: x\nenv: &m {A: *m}\n", ["bad.yaml:2", "*m", "loop"]),
    ("nested 100,000 deep", "description: x\nenv: " + "[" * 100_000 + "]" * 100_000 + "\n", ["nested more than"]),
    ("a 5000-digit number", "description: x\nmax_jobs: " + "9" * 5000 + "\n", ["bad.yaml", "4300 digits"]),
    ("max_jobs 10^23", "description: x\nmax_jobs: 100000000000000000000000\n", ["bad.yaml:2", "'max_jobs'", "4096"]),
    ("nvcc_threads 10^20", "description: x\nnvcc_threads: 100000000000000000000\n", ["bad.yaml:2", "0 to 64"]),
    ("mem_per_job_gb .inf", "description: x\nmem_per_job_gb: .inf\n", ["bad.yaml:2", "'mem_per_job_gb'", "finite"]),
    ("cache_dir of no user", "description: x\ncache_dir: ~nobody-such/x\n", ["bad.yaml:2", "no user 'nobody-such'"]),
    ("a profile over 1 MiB", "description: x\n" + "# padding\n" * 120_000, ["bad.yaml", "more than the 1 MiB"]),
]


@pytest.mark.parametrize(("what", "text", "words"), HOSTILE_FILES, ids=[c[0] for c in HOSTILE_FILES])
def test_hostile_profile_is_a_profile_error_in_bounded_time_and_memory(tmp_path: Path, what, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(ProfileError) as exc:
            resolve(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.monotonic() - start < 20
    assert peak < 200 * 1024 * 1024, peak
    for word in words:
        assert word in exc.value.message, (word, exc.value.message)
    assert exc.value.hint and "\n" not in exc.value.hint


def test_a_few_aliases_still_share_a_list(tmp_path: Path):
    path = tmp_path / "anchors.yaml"
    path.write_text("description: x\ncflags: &flags [-O2, -g]\ncxxflags: *flags\n")
    spec = resolve(str(path))
    assert spec.cxxflags == spec.cflags == ("-O2", "-g")


# (what the user typed after --set, the words the message must hold)
HOSTILE_SETS = [
    ("cache_dir=~nobody-such/x", ["'cache_dir'", "no user 'nobody-such'"]),
    ("cache_dir=/tmp/a\0b", ["'cache_dir'", "NUL"]),
    ("ca_certificates=~nobody-such/ca.pem", ["'ca_certificates'", "no user 'nobody-such'"]),
    ("patches=~nobody-such/series", ["'patches'", "no user"]),
    ("companion_repos.torchvision=~nobody-such/vision", ["companion_repos.torchvision", "no user"]),
    ("mem_per_job_gb=.inf", ["'mem_per_job_gb'", "finite"]),
    ("mem_per_cuda_job_gb=.inf", ["'mem_per_cuda_job_gb'", "finite"]),
    ("mem_per_job_gb=.nan", ["'mem_per_job_gb'", "nan"]),
    ("mem_per_job_gb=0.0000001", ["'mem_per_job_gb'", "out of range"]),
    ("mem_per_job_gb=100000000", ["'mem_per_job_gb'", "out of range"]),
    ("max_jobs=100000000000000000000000", ["'max_jobs'", "1 to 4096"]),
    ("max_jobs=5000", ["'max_jobs'", "1 to 4096"]),
    ("max_jobs=²", ["'max_jobs'", "'²'"]),
    ("nvcc_threads=100000000000000000000", ["'nvcc_threads'", "0 to 64"]),
    ("gpus=100000", ["'gpus'", "0 to 64"]),
    ("cpus=1000000000", ["'cpus'", "1 to 4096"]),
    ("cpus=0", ["'cpus'", "1 to 4096"]),
    ("ccache_size=" + "9" * 400 + "T", ["'ccache_size'", "malformed"]),
    ("env=" + "[" * 100 + "]" * 100, ["--set env=", "nested more than"]),
]


@pytest.mark.parametrize(("item", "words"), HOSTILE_SETS, ids=[c[0][:40] for c in HOSTILE_SETS])
def test_hostile_set_value_is_a_profile_error(item, words):
    with pytest.raises(ProfileError) as exc:
        resolve("cpu", [item])
    for word in words:
        assert word in exc.value.message, (word, exc.value.message)
    assert exc.value.hint and "\n" not in exc.value.hint


def test_the_ranges_ends_are_accepted():
    spec = resolve("cpu", ["max_jobs=4096", "nvcc_threads=64", "mem_per_job_gb=0.1", "gpus=64"])
    assert (spec.max_jobs, spec.nvcc_threads, spec.mem_per_job_gb, spec.gpus) == (4096, 64, 0.1, 64)


def test_own_home_in_cache_dir_still_expands():
    spec = resolve("cpu", ["cache_dir=~/tb-cache"])
    from torchbuild.profile.config import cache_dir

    assert cache_dir(spec) == Path(os.path.expanduser("~/tb-cache"))


@pytest.mark.parametrize("value", ["²", "٣", "1" * 30])
def test_jobs_option_of_other_digits_is_a_usage_error(value):
    with pytest.raises(UsageError, match="--jobs"):
        parse_jobs_option(value)


# (what the profile names, the words the message must hold)
NOT_PROFILES = [
    (lambda t: str(t), ["is a directory", "a profile is a YAML file"]),
    (lambda t: "/dev/null", ["not a regular file", "a profile is a YAML file"]),
    (lambda t: "~nobody-such/p.yaml", ["no user 'nobody-such'"]),
    (lambda t: str(t / "missing.yaml"), ["does not exist", "a profile is a YAML file"]),
]


@pytest.mark.parametrize(("ref", "words"), NOT_PROFILES, ids=["directory", "device", "no such user", "missing"])
def test_a_profile_that_is_not_a_file_says_what_it_is(tmp_path, ref, words):
    with pytest.raises(ProfileError) as exc:
        resolve(ref(tmp_path))
    for word in words:
        assert word in exc.value.message, (word, exc.value.message)


def test_torchbuild_profile_naming_a_directory_is_named_as_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHBUILD_PROFILE", str(tmp_path))
    with pytest.raises(ProfileError) as exc:
        spec_from("", [], "")
    assert exc.value.message.startswith("$TORCHBUILD_PROFILE: ")
    assert "is a directory" in exc.value.message and "does not exist" not in exc.value.message


# Issue 41 item 9: characters YAML refuses (PyYAML's ReaderError escaped as a traceback, also
# through `doctor --profile`): NUL, ESC, form feed, \x01, DEL
CONTROLS = ["\x00", "\x1b", "\x0c", "\x01", "\x7f"]


def _refused(exc: ProfileError, char: str, where: str) -> None:
    assert exc.message.startswith(f"{where}: holds the control character U+{ord(char):04X}"), exc.message
    assert char not in exc.message and char not in exc.hint, "the character itself reaches the terminal"


@pytest.mark.parametrize("char", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_a_control_character_in_a_profile_or_the_profile_it_extends_is_named(tmp_path: Path, char):
    parent = tmp_path / "parent.yaml"
    parent.write_text(f"extends: cpu\ndescription: x\ncflags: [-O2]\nenv: {{A: 'a{char}b'}}\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: parent\ndescription: child\n")
    for ref in (parent, child):
        with pytest.raises(ProfileError) as exc:
            resolve(str(ref))
        _refused(exc.value, char, f"{parent}:4")


@pytest.mark.parametrize("char", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
@pytest.mark.parametrize(
    ("item", "where"),
    [
        ("cflags=[-O2, a{c}]", "--set 'cflags'"),
        ("switches={{USE_X: a{c}}}", "--set 'switches'"),
        ("switches.USE_X=a{c}", "--set 'switches.USE_X'"),
        ("description=a{c}", "--set 'description'"),
    ],
)
def test_a_control_character_in_a_set_value_is_named(char, item, where):
    with pytest.raises(ProfileError) as exc:
        resolve("cpu", [item.format(c=char)])
    _refused(exc.value, char, where)


def test_doctor_names_a_profile_with_a_control_character(tmp_path: Path):
    from torchbuild.doctor.host import _profile_ca_check

    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: cpu\ndescription: a\x1bb\n")
    check = _profile_ca_check([], str(bad))
    assert not check.ok and f"{bad}:2: holds the control character U+001B" in check.detail, check


def test_invoke_config_reports_a_control_character_without_a_traceback(tmp_path: Path, capsys):
    from helpers import invoke_here

    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: cpu\ndescription: a\x01b\n")
    assert invoke_here("config", "--profile", str(bad)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: ProfileError: {bad}:2: holds the control character U+0001"), err
    assert "Traceback" not in err and err.count("\nhint: ") == 1
