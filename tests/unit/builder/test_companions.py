"""Companion libraries (torchvision, torchaudio, torchtext): the table, the profile keys, where
their trees come from and what each build is given; `invoke develop`'s mode and venv; and
`invoke bench`'s constraints (a torchbench install that asks for another torch fails and leaves
the built one in place)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import pytest
from helpers import TEST_TORCH, isolated_pip_env, make_wheel
from packaging.version import Version

from torchbuild.bench import step as benchmod
from torchbuild.builder import companions
from torchbuild.builder.companion_table import TABLE, default_ref, pairing_problem, version_problem
from torchbuild.core.errors import BenchFailed, CompanionError, ProfileError, SourceError
from torchbuild.devloop.step import BASE_PTH, make_venv, mode_for
from torchbuild.profile.config import resolve
from torchbuild.runtime.environment import build_env

# --------------------------------------------------------------------------- the table


def test_the_table_pairs_each_torch_line_with_the_issue_s_versions():
    want = {
        "2.3": ("0.18", "2.3"),
        "2.4": ("0.19", "2.4"),
        "2.5": ("0.20", "2.5"),
        "2.6": ("0.21", "2.6"),
        "2.7": ("0.22", "2.7"),
        "2.8": ("0.23", "2.8"),
        "2.9": ("0.24", "2.9"),
        "2.10": ("0.25", "2.10"),
        "2.11": ("0.26", "2.11"),
        "2.12": ("0.27", None),  # torchaudio in maintenance: no line after 2.11
        "2.13": ("0.28", None),
        "2.14": ("0.29", None),
        "2.15": ("0.30", None),
    }
    assert {t: (r["torchvision"], r.get("torchaudio")) for t, r in TABLE.items()} == want
    assert [t for t, r in TABLE.items() if "torchtext" in r] == ["2.3"]


@pytest.mark.parametrize(
    ("name", "torch", "ref", "want"),
    [
        ("torchvision", "2.6.0", "", "v0.21.0"),
        ("torchaudio", "2.6.0", "", "v2.6.0"),
        ("torchvision", "2.5.1", "", "v0.20.1"),
        ("torchtext", "2.3.1", "", "v0.18.1"),
        ("torchvision", "2.10.0a0", "main", "main"),
        ("torchvision", "2.2.0", "", ""),
    ],
)
def test_default_refs_follow_torch_s_patch_number_and_main(name, torch, ref, want):
    assert default_ref(name, torch, ref) == want


def test_pairs_outside_the_table_are_named():
    assert "last line goes with torch 2.3" in pairing_problem("torchtext", "2.4.0")
    assert "not in the companion table" in pairing_problem("torchvision", "2.2.1")
    assert pairing_problem("torchvision", "2.2.1", "main") == ""
    problem = version_problem("torchvision", "0.20.1", "2.6.0")
    assert "torchvision 0.20.1 does not go with torch 2.6.0" in problem and "TABLE" in problem
    assert version_problem("torchvision", "0.21.0a0", "2.6.0") == ""


# --------------------------------------------------------------------------- profile keys


def test_companion_keys_resolve_and_are_refused_where_they_do_not_fit():
    spec = resolve("cpu", [TEST_TORCH, "companions=[torchvision, torchaudio]", 'companion_env={"BUILD_SOX": 1}'])
    assert spec.companions == ("torchvision", "torchaudio") and spec.companion_env == {"BUILD_SOX": "1"}
    with pytest.raises(ProfileError, match=r"torchtext has no release for torch 2.6"):
        resolve("cpu", [TEST_TORCH, "companions=[torchtext]"])
    with pytest.raises(ProfileError, match=r"companion_refs.*names torchaudio, which companions does not list"):
        resolve("cpu", [TEST_TORCH, "companions=[torchvision]", 'companion_refs={"torchaudio": "v2.6.0"}'])
    with pytest.raises(ProfileError, match=r"companion_repos.*not allowed"):
        resolve("cpu", [TEST_TORCH, "companions=[torchvision]", 'companion_repos={"vision": "/x"}'])
    assert resolve("cpu", [TEST_TORCH, "companions=[torchtext]", "torch_version=2.3.1"]).companions == ("torchtext",)


# --------------------------------------------------------------------------- sources


def _archive(tmp_path: Path, top: str, version: str) -> tuple[Path, str]:
    tree = tmp_path / "src" / top
    tree.mkdir(parents=True)
    (tree / "version.txt").write_text(version + "\n")
    (tree / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    archive = tmp_path / f"{top}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname=top)
    return archive, hashlib.sha256(archive.read_bytes()).hexdigest()


def _vision_spec(repo: object, *extra: str):
    """The cpu profile with torchvision from repo, plus extra --set values."""
    return resolve(
        "cpu", [TEST_TORCH, "companions=[torchvision]", f'companion_repos={{"torchvision": "{repo}"}}', *extra]
    )


def test_an_archive_is_checked_unpacked_and_paired_before_anything_compiles(tmp_path):
    archive, digest = _archive(tmp_path, "vision-0.21.0", "0.21.0")
    spec = _vision_spec(archive, f'companion_sha256={{"torchvision": "{digest}"}}')
    out = io.StringIO()
    (got,) = companions.fetch(spec, tmp_path / "cache", out=out)
    assert got.version == "0.21.0" and got.digest == digest
    assert got.tree.is_relative_to(tmp_path / "cache" / "src") and (got.tree / "version.txt").is_file()
    # the same archive for torch 2.5: refused, naming the table
    with pytest.raises(CompanionError, match=r"does not go with torch 2.5.1.*TABLE"):
        companions.fetch(spec, tmp_path / "cache", torch_version="2.5.1", out=out)


def test_a_wrong_sha256_is_refused_before_unpacking(tmp_path):
    archive, _ = _archive(tmp_path, "vision-0.21.0", "0.21.0")
    spec = _vision_spec(archive, f'companion_sha256={{"torchvision": "{"0" * 64}"}}')
    with pytest.raises(SourceError, match=r"companion_repos.torchvision: .* has sha256"):
        companions.fetch(spec, tmp_path / "cache", out=io.StringIO())
    assert not (tmp_path / "cache" / "src").exists()


def test_a_sha256_for_a_git_repository_is_refused(tmp_path):
    spec = resolve(
        "cpu",
        [
            TEST_TORCH,
            "companions=[torchvision]",
            'companion_repos={"torchvision": "https://example.org/vision.git"}',
            f'companion_sha256={{"torchvision": "{"a" * 64}"}}',
        ],
    )
    with pytest.raises(CompanionError, match=r"a sha256 checks an archive"):
        companions.fetch(spec, tmp_path / "cache", out=io.StringIO())
    assert not (tmp_path / "cache").exists()


def test_a_tree_without_version_txt_is_not_taken_for_a_companion(tmp_path):
    tree = tmp_path / "notvision"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    spec = resolve("cpu", [TEST_TORCH, "companions=[torchvision]", f'companion_repos={{"torchvision": "{tree}"}}'])
    with pytest.raises(CompanionError, match=r"no version.txt"):
        companions.fetch(spec, tmp_path / "cache", out=io.StringIO())


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: os.mkfifo(p), "not a regular file"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"0" * (companions.VERSION_TXT_LIMIT + 1)), "more than the 64 KiB"),
    ],
    ids=["fifo", "directory", "huge"],
)
def test_a_version_txt_that_is_no_small_file_is_named_not_read(tmp_path, make, says):
    tree = tmp_path / "vision"
    tree.mkdir()
    make(tree / "version.txt")
    spec = resolve("cpu", [TEST_TORCH, "companions=[torchvision]", f'companion_repos={{"torchvision": "{tree}"}}'])
    with pytest.raises(CompanionError, match=says):
        companions.fetch(spec, tmp_path / "cache", out=io.StringIO())


def test_a_ref_for_an_archive_is_refused(tmp_path):
    archive, _ = _archive(tmp_path, "vision-0.21.0", "0.21.0")
    spec = resolve(
        "cpu",
        [
            TEST_TORCH,
            "companions=[torchvision]",
            f'companion_repos={{"torchvision": "{archive}"}}',
            'companion_refs={"torchvision": "v0.21.0"}',
        ],
    )
    with pytest.raises(CompanionError, match=r"not a git repository"):
        companions.fetch(spec, tmp_path / "cache", out=io.StringIO())


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True
    )


def test_git_companions_come_through_the_mirror_and_update_fast_forwards(tmp_path):
    upstream = tmp_path / "vision.git-work"
    upstream.mkdir()
    _git("init", "-q", "-b", "main", cwd=upstream)
    (upstream / "version.txt").write_text("0.22.0a0\n")
    (upstream / "setup.py").write_text("")
    _git("add", "-A", cwd=upstream)
    _git("commit", "-qm", "one", cwd=upstream)
    url = f"file://{upstream}/.git"
    sets = [TEST_TORCH, "companions=[torchvision]", "torch_ref=main", f'companion_repos={{"torchvision": "{url}"}}']
    spec = resolve("cpu", sets)
    cache = tmp_path / "cache"
    (got,) = companions.fetch(spec, cache, out=io.StringIO())
    assert got.tree == cache / "src" / "vision-main" and got.version == "0.22.0a0"
    assert any((cache / "git").iterdir()), "no mirror was made in the cache"
    (upstream / "new.txt").write_text("x")
    _git("add", "-A", cwd=upstream)
    _git("commit", "-qm", "two", cwd=upstream)
    companions.update(spec, cache, out=io.StringIO())
    assert (got.tree / "new.txt").is_file()


# --------------------------------------------------------------------------- the build's inputs


def test_a_companion_gets_the_toolchain_not_torch_s_switches():
    spec = resolve("cpu", [TEST_TORCH, "companions=[torchaudio]", 'companion_env={"USE_FFMPEG": "1"}'])
    base = build_env(spec, cache_root="/cache", jobs=4)
    env = companions.companion_env(spec, "torchaudio", base)
    assert env["CC"] == base["CC"] and env["CCACHE_DIR"] == "/cache/ccache"
    assert not [k for k in env if k.startswith(("USE_CUDA", "USE_DISTRIBUTED", "PYTORCH_BUILD_", "BLAS"))]
    assert env["BUILD_SOX"] == "0" and env["USE_FFMPEG"] == "1"  # torchbuild's default, then companion_env
    assert "FORCE_CUDA" not in env
    cuda = resolve("cuda", ["companions=[torchvision]"])
    assert companions.companion_env(cuda, "torchvision", build_env(cuda, cache_root="/c", jobs=1))["FORCE_CUDA"] == "1"


@pytest.mark.parametrize(
    ("tree", "torch", "local", "want"),
    [
        ("0.21.0", "2.6.0+gh200", "", "0.21.0+gh200"),
        ("2.6.0a0", "2.6.0+debian", "x", "2.6.0+debian"),  # a release tag's version.txt, a release torch
        ("0.22.0a0", "2.7.0a0+git1234", "gh200", "0.22.0a0+git1234"),  # main with main
        ("2.6.0", "2.6.0", "site", "2.6.0+site"),
        ("2.6.0", "2.6.0", "", "2.6.0"),
    ],
)
def test_the_companion_carries_torch_s_local_version(tree, torch, local, want):
    job = companions.Job(name="torchvision", tree="/t", origin="", digest="", version=tree)
    assert companions.build_version(job, Version(torch), local) == want


def test_ccache_shims_name_the_compilers_and_point_at_ccache(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "ccache"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    spec = resolve("cpu")
    shims = companions.ccache_shims(tmp_path / "shims", spec)
    assert shims is not None
    assert {"gcc", "g++", "cc", "c++"} <= {p.name for p in shims.iterdir()}
    assert all(p.resolve() == fake for p in shims.iterdir())
    assert companions.ccache_shims(tmp_path / "s2", resolve("cpu", [TEST_TORCH, "compiler=clang"])) is not None


def test_the_torch_wheel_name_must_be_one():
    with pytest.raises(CompanionError, match=r"not a torch wheel"):
        companions.torch_wheel_version(Path("torch.whl"))
    assert companions.torch_wheel_version(Path("torch-2.6.0+debian-cp313-cp313-linux_x86_64.whl")) == Version(
        "2.6.0+debian"
    )


# --------------------------------------------------------------------------- develop


@pytest.mark.parametrize(
    ("text", "mode"), [("2.6.0a0", "setup.py"), ("2.8.0a0", "pip"), ("2.10.0a0", "pip"), (None, "pip")]
)
def test_develop_uses_setup_py_develop_for_trees_older_than_2_8(tmp_path, text, mode):
    if text is not None:
        (tmp_path / "version.txt").write_text(text + "\n")
    assert mode_for(tmp_path) == mode


def test_develop_takes_a_version_txt_that_is_a_fifo_for_none(tmp_path):
    os.mkfifo(tmp_path / "version.txt")  # reading it would wait for a writer forever
    assert mode_for(tmp_path) == "pip"


def test_the_develop_venv_sees_the_build_interpreter_s_packages(tmp_path):
    """A venv made from a venv (the image's /opt/venv) sees that venv's packages through a .pth."""
    lines: list[str] = []
    python = make_venv(tmp_path / "v", lines.append)
    assert python.exists() and lines == [f"making the venv {tmp_path / 'v'}"]
    code = "import importlib.util as u; print(u.find_spec('packaging') is not None)"
    seen = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    in_venv = sys.prefix != sys.base_prefix
    assert seen == "True" or not in_venv
    assert bool(list((tmp_path / "v").rglob(BASE_PTH))) == in_venv
    assert make_venv(tmp_path / "v", lines.append) == python and len(lines) == 1  # made once


# --------------------------------------------------------------------------- bench


def test_constraints_pin_exactly_what_is_installed():
    found = {
        "torch": {"version": "2.6.0+gh200", "location": "/x"},
        "torchvision": {"version": "0.21.0+gh200", "location": "/x"},
    }
    assert benchmod.constraints_text(found) == "torch===2.6.0+gh200\ntorchvision===0.21.0+gh200\n"


@pytest.fixture
def fake_torch_venv(tmp_path, monkeypatch):
    """A venv with an installed 'torch' 9.9.9+built (a package and its dist-info, as pip leaves
    them); pip sees no site configuration (this machine's find-links and constraint)."""
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    site = Path(
        subprocess.run(
            [str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("__version__ = '9.9.9+built'\n")
    info = site / "torch-9.9.9+built.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9+built\n")
    (info / "RECORD").write_text("")
    (info / "INSTALLER").write_text("pip\n")
    return env


def _upgrading_install(tree: Path, house: Path) -> None:
    """An install.py that asks pip for the newest torch (with --upgrade) from a directory
    holding torch 10.0: without a constraint, pip replaces the built torch with it."""
    make_wheel(house, "torch", "10.0", module="torch")
    tree.mkdir()
    (tree / "install.py").write_text(
        "import subprocess, sys\n"
        f"sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'install', '--no-index', '--find-links', {str(house)!r}, '--upgrade', 'torch']))\n"
    )


def test_without_the_constraint_that_install_would_replace_torch(tmp_path, fake_torch_venv):
    """The stand-in's own behaviour: what bench protects against really happens without it."""
    tree = tmp_path / "bench"
    _upgrading_install(tree, tmp_path / "house")
    subprocess.run(
        [str(fake_torch_venv / "bin" / "python"), "install.py"],
        cwd=tree,
        env=isolated_pip_env(),
        check=True,
        capture_output=True,
    )
    assert benchmod.pinned_packages(fake_torch_venv / "bin" / "python")["torch"]["version"] == "10.0"


def test_bench_install_keeps_the_built_torch_when_torchbench_asks_for_the_newest(tmp_path, fake_torch_venv):
    tree = tmp_path / "bench"
    _upgrading_install(tree, tmp_path / "house")
    out = io.StringIO()
    result = benchmod.bench(benchmod.Request(venv=str(fake_torch_venv), benchmark=str(tree)), out=out)
    assert benchmod.pinned_packages(fake_torch_venv / "bin" / "python")["torch"]["version"] == "9.9.9+built"
    assert "Requirement already satisfied: torch" in out.getvalue()
    assert (fake_torch_venv / "torchbuild-constraints.txt").read_text() == "torch===9.9.9+built\n"
    assert result["torch"]["version"] == "9.9.9+built" and "install_s" in result


def test_bench_refuses_an_install_that_needs_another_torch(tmp_path, fake_torch_venv, monkeypatch):
    tree = tmp_path / "bench"
    tree.mkdir()
    make_wheel(tmp_path / "house", "torch", "10.0", module="torch")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # torch 10.0 is offered from the directory only
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "house"))
    (tree / "requirements.txt").write_text("torch>=10\n")
    out = io.StringIO()
    with pytest.raises(BenchFailed, match=r"requirements.txt failed"):
        benchmod.bench(benchmod.Request(venv=str(fake_torch_venv), benchmark=str(tree)), out=out)
    assert benchmod.pinned_packages(fake_torch_venv / "bin" / "python")["torch"]["version"] == "9.9.9+built"


def test_bench_runs_the_script_with_the_arguments_given(tmp_path, fake_torch_venv):
    tree = tmp_path / "bench"
    tree.mkdir()
    (tree / "run.py").write_text("import sys, torch; print('ran', sys.argv[1:], torch.__version__)\n")
    req = benchmod.Request(venv=str(fake_torch_venv), benchmark=str(tree), args=("resnet50", "-d", "cpu"))
    out = io.StringIO()
    result = benchmod.bench(req, out=out)
    assert "ran ['resnet50', '-d', 'cpu'] 9.9.9+built" in out.getvalue()
    assert result["torch"]["version"] == "9.9.9+built" and json.dumps(result)


def test_bench_without_a_venv_or_torch_is_named(tmp_path):
    with pytest.raises(BenchFailed, match=r"not a venv"):
        benchmod.bench(benchmod.Request(venv=str(tmp_path), benchmark=str(tmp_path)))
    env = tmp_path / "empty"
    venv.create(env, with_pip=False)
    with pytest.raises(BenchFailed, match=r"has no torch"):
        benchmod.bench(benchmod.Request(venv=str(env), benchmark=str(tmp_path)))


# --------------------------------------------------------------------------- invoke build's path


def _minitorch(tmp_path: Path) -> Path:
    import shutil

    from helpers import FIXTURES

    tree = tmp_path / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    return tree


def test_build_refuses_a_companion_of_another_line_before_compiling_torch(tmp_path):
    from torchbuild.builder import host as runner
    from torchbuild.runtime.backends import Options, choose

    archive, _ = _archive(tmp_path, "vision-0.20.0", "0.20.0")
    spec = resolve(
        "cpu",
        [
            TEST_TORCH,
            "companions=[torchvision]",
            f'companion_repos={{"torchvision": "{archive}"}}',
            f"cache_dir={tmp_path / 'cache'}",
        ],
    )
    tree = _minitorch(tmp_path)
    where = runner.Places(str(tree), tmp_path / "out", tmp_path / "cache")
    with pytest.raises(CompanionError, match=r"torchvision 0.20.0 does not go with torch 2.6.0"):
        runner.build(spec, choose(spec, "native", Options()), where, out=io.StringIO())
    assert not (tree / "build").exists(), "torch was compiled although the companion could never pair with it"
    assert not list((tmp_path / "out").glob("*.whl"))


def test_build_runs_the_companions_after_the_wheel_and_before_verify(tmp_path, monkeypatch):
    from torchbuild.builder import host as runner
    from torchbuild.runtime.backends import Options, choose

    archive, _ = _archive(tmp_path, "vision-0.21.0", "0.21.0")
    spec = resolve(
        "cpu",
        [
            TEST_TORCH,
            "companions=[torchvision]",
            f'companion_repos={{"torchvision": "{archive}"}}',
            f"cache_dir={tmp_path / 'cache'}",
            "patches=none",
        ],
    )
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(runner, "companions_with", lambda *a, **k: calls.append(("companions", a[3])) or [])
    monkeypatch.setattr(runner, "verify_with", lambda *a, **k: calls.append(("verify", k.get("wheel"))))
    where = runner.Places(str(_minitorch(tmp_path)), tmp_path / "out", tmp_path / "cache")
    outcome = runner.build(spec, choose(spec, "native", Options()), where, out=io.StringIO())
    assert outcome.wheel is not None and outcome.wheel.is_file()
    assert calls == [("companions", outcome.wheel), ("verify", outcome.wheel)]


def test_the_check_installs_only_the_runtime_requirements_this_interpreter_lacks(tmp_path):
    """torchvision's import needs pillow, which an image with torch may lack; torch itself (the
    built one), companions, extras, false markers and what is importable here are never fetched."""
    info = tmp_path / "torchvision-0.21.0+x.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.21.0+x\n"
        "Requires-Dist: packaging\nRequires-Dist: torch==2.6.0+x\nRequires-Dist: pillow-not-here>=5.3.0\n"
        'Requires-Dist: torchaudio\nRequires-Dist: scipy; extra == "scipy"\n'
        'Requires-Dist: nothere2; python_version < "3"\n'
    )
    assert companions.missing_requirements(tmp_path) == ["pillow-not-here>=5.3.0"]


def test_source_update_brings_torch_and_every_companion_to_the_head_of_main(tmp_path):
    """What Quansight's torch-update.sh does for its libraries (git fetch, then main at
    origin/main, submodules), `invoke source --update` does for the tree and each companion
    checkout of a profile on main (fast-forward only: torchbuild rebases no local commits)."""
    from helpers import run_invoke, set_args

    for name in ("torch", "vision"):
        repo = tmp_path / name
        repo.mkdir()
        _git("init", "-q", "-b", "main", cwd=repo)
        (repo / "version.txt").write_text("2.7.0a0\n")
        (repo / "setup.py").write_text("")
        _git("add", "-A", cwd=repo)
        _git("commit", "-qm", "one", cwd=repo)
    sets = set_args(
        [
            "patches=none", "torch_ref=main", "companions=[torchvision]", f"cache_dir={tmp_path / 'cache'}",
            f'companion_repos={{"torchvision": "file://{tmp_path}/vision/.git"}}',
        ]
    )  # fmt: skip
    tree = tmp_path / "tree"
    res = run_invoke("source", *sets, "--source", f"file://{tmp_path}/torch/.git", "--dest", str(tree))
    assert res.returncode == 0, res.stderr
    for name in ("torch", "vision"):
        (tmp_path / name / f"{name}-new.txt").write_text("x")
        _git("add", "-A", cwd=tmp_path / name)
        _git("commit", "-qm", "two", cwd=tmp_path / name)
    res = run_invoke("source", *sets, "--update", "--dest", str(tree))
    assert res.returncode == 0, res.stderr
    assert (tree / "torch-new.txt").is_file()
    assert (tmp_path / "cache" / "src" / "vision-main" / "vision-new.txt").is_file()
    assert "torchvision: " in res.stdout
