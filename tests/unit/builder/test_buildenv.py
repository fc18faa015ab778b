"""The native build venv (builder/buildenv.py): what goes in, its key, made once and published
whole, reused, and a pip that cannot install is a named error with what to do."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from torchbuild.builder import buildenv
from torchbuild.core.errors import BuildFailed, SourceError
from torchbuild.core.progress import Tee
from torchbuild.profile.config import resolve


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    tree = tmp_path / "tree"
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    tree.mkdir(parents=True, exist_ok=True)
    return tree


PYPROJECT = '[build-system]\nrequires = ["setuptools", "cmake", "typing-extensions>=4.10"]\n'


def test_the_trees_requirements_with_includes_and_pyproject(tmp_path):
    tree = _tree(
        tmp_path,
        {
            "requirements.txt": "# deps\nastunparse\n-r requirements-build.txt\n--index-url https://x\n"
            'sympy==1.13.1 ; python_version >= "3.9"  # pinned\n',
            "requirements-build.txt": "ninja\npyyaml\n",
            "pyproject.toml": PYPROJECT,
        },
    )
    reqs, digests = buildenv.tree_requirements(str(tree))
    assert reqs[:4] == ["astunparse", "ninja", "pyyaml", 'sympy==1.13.1 ; python_version >= "3.9"']
    assert reqs[4:] == ["setuptools", "cmake", "typing-extensions>=4.10"]
    assert set(digests) == {"requirements.txt", "requirements-build.txt", "pyproject.toml"}
    assert buildenv.tree_requirements(str(_tree(tmp_path / "none", {}))) == ([], {})


def test_pyproject_is_read_before_python_3_11_too(tmp_path, monkeypatch):
    """Python 3.9 and 3.10 have no tomllib: tomli (a dependency there, the same parser) reads
    pyproject.toml, whose build requirements were left out before. Run by a 3.9 or 3.10, the
    real tomli reads it (pyproject's `tomli; python_version < '3.11'` installed it); by a newer
    Python, a 3.10 is played: no tomllib, and tomllib standing in for tomli (the same API)."""
    if sys.version_info >= (3, 11):
        import tomllib

        monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
        monkeypatch.setitem(sys.modules, "tomllib", None)  # import tomllib fails, as on 3.10
        monkeypatch.setitem(sys.modules, "tomli", tomllib)  # tomli's API is tomllib's
    reqs, digests = buildenv.tree_requirements(str(_tree(tmp_path, {"pyproject.toml": PYPROJECT})))
    assert reqs == ["setuptools", "cmake", "typing-extensions>=4.10"]
    assert set(digests) == {"pyproject.toml"}


def test_the_lock_beside_the_venv_is_open_to_a_group_sharing_the_cache(tmp_path):
    old = os.umask(0o002)
    try:
        with buildenv._locked(tmp_path / "k.lock"):
            assert (tmp_path / "k.lock").stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(old)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("numpy\nthis is not a requirement!\n", "requirements.txt:2"),
        ("-r ../outside.txt\n", "not a requirements file inside the tree"),
        ("-r missing.txt\n", "not a requirements file inside the tree"),
    ],
)
def test_a_bad_requirements_line_is_named(tmp_path, text, named):
    tree = _tree(tmp_path, {"requirements.txt": text})
    with pytest.raises(SourceError, match=named.replace(".", r"\.")):
        buildenv.tree_requirements(str(tree))


def test_cmake_and_ninja_pins_unless_the_tree_wants_another_version_and_mkl_where_asked():
    cpu = resolve("cpu", ["arch=x86_64"])
    assert buildenv.pinned(cpu, ["cmake", "ninja>=1.11"]) == [
        buildenv.CMAKE,
        buildenv.NINJA,
        "setuptools",
        "wheel",
        "cmake",
        "ninja>=1.11",
    ]
    assert buildenv.CMAKE not in buildenv.pinned(cpu, ["cmake<3.20"])  # the tree's wins
    mkl = buildenv.pinned(resolve("cpu", ["arch=x86_64", "blas=mkl"]), [])
    assert set(buildenv.MKL) <= set(mkl) and not set(buildenv.MKL) & set(buildenv.pinned(cpu, []))


def test_the_key_follows_what_decides_the_venv():
    cpu = resolve("cpu", ["arch=x86_64"])
    key = buildenv.venv_key(cpu, sys.executable, "3.11.7", {"requirements.txt": "a"})
    assert key == buildenv.venv_key(cpu, sys.executable, "3.11.7", {"requirements.txt": "a"})
    others = {
        buildenv.venv_key(cpu, sys.executable, "3.11.7", {"requirements.txt": "b"}),
        buildenv.venv_key(cpu, sys.executable, "3.11.8", {"requirements.txt": "a"}),
        buildenv.venv_key(
            resolve("cpu", ["arch=x86_64", "blas=mkl"]), sys.executable, "3.11.7", {"requirements.txt": "a"}
        ),
        buildenv.venv_key(cpu, "/usr/bin/false", "3.11.7", {"requirements.txt": "a"}),
    }
    assert key not in others and len(others) == 4
    # a key that leaves the profile's other keys out: another local version reuses the venv
    assert key == buildenv.venv_key(
        resolve("cpu", ["arch=x86_64", "local_version=x"]), sys.executable, "3.11.7", {"requirements.txt": "a"}
    )


class FakeRun:
    """buildenv._run without pip: `-m venv DIR` makes DIR/bin/python; pip install records what it
    was asked, or fails when told to."""

    def __init__(self) -> None:
        self.installs: list[list[str]] = []
        self.fail = False

    def __call__(self, cmd, log, what, hint, cache, error=BuildFailed):
        if cmd[1:3] == ["-m", "venv"]:
            (Path(cmd[3]) / "bin").mkdir(parents=True)
            os.symlink(sys.executable, Path(cmd[3]) / "bin" / "python")
            return
        if self.fail:
            raise error(f"{what} failed (exit 1): no network", hint=hint)
        assert cmd[3:6] == ["install", "--no-input", "--"], cmd  # the tree's requirements after --
        self.installs.append(list(cmd[6:]))


def _tee(tmp_path: Path) -> Tee:
    return Tee(tmp_path / "logs" / "build.log", io.StringIO())


def test_made_once_published_whole_then_reused(tmp_path, monkeypatch):
    fake = FakeRun()
    monkeypatch.setattr(buildenv, "_run", fake)
    tree = _tree(tmp_path, {"requirements.txt": "pyyaml\n"})
    spec, cache = resolve("cpu", ["arch=x86_64"]), tmp_path / "cache"
    first = buildenv.ensure(spec, str(tree), str(cache), sys.executable, _tee(tmp_path))
    assert first.created and fake.installs == [[buildenv.CMAKE, buildenv.NINJA, "setuptools", "wheel", "pyyaml"]]
    assert first.path == cache / "buildenv" / first.key and first.path.is_symlink()
    assert Path(first.python).exists()
    again = buildenv.ensure(spec, str(tree), str(cache), sys.executable, _tee(tmp_path))
    assert not again.created and again.key == first.key and len(fake.installs) == 1
    # another requirements file: another venv beside it
    (tree / "requirements.txt").write_text("pyyaml\nnumpy\n")
    other = buildenv.ensure(spec, str(tree), str(cache), sys.executable, _tee(tmp_path))
    assert other.created and other.key != first.key


def test_a_failed_creation_leaves_nothing_to_reuse(tmp_path, monkeypatch):
    fake = FakeRun()
    fake.fail = True
    monkeypatch.setattr(buildenv, "_run", fake)
    tree, cache = _tree(tmp_path, {}), tmp_path / "cache"
    spec = resolve("cpu", ["arch=x86_64"])
    with pytest.raises(BuildFailed, match="no network") as err:
        buildenv.ensure(spec, str(tree), str(cache), sys.executable, _tee(tmp_path))
    assert "build_venv: false" in (err.value.hint or "")
    assert sorted(p.name for p in (cache / "buildenv").iterdir() if not p.name.endswith(".lock")) == []
    fake.fail = False  # the next build makes it afresh
    assert buildenv.ensure(spec, str(tree), str(cache), sys.executable, _tee(tmp_path)).created


def test_an_interrupted_creation_is_cleared_not_reused(tmp_path, monkeypatch):
    monkeypatch.setattr(buildenv, "_run", FakeRun())
    tree, cache = _tree(tmp_path, {}), tmp_path / "cache"
    spec = resolve("cpu", ["arch=x86_64"])
    key = buildenv.venv_key(spec, sys.executable, buildenv._python_version(sys.executable), {})
    stale = cache / "buildenv" / f"{key}.abc123"
    (stale / "bin").mkdir(parents=True)  # half a venv, no marker, never published
    made = buildenv.ensure(spec, str(tree), str(cache), sys.executable, _tee(tmp_path))
    assert made.created and not stale.exists()


def test_pip_that_cannot_install_is_a_named_error_with_what_to_do(tmp_path, monkeypatch):
    """A real venv and a real pip, offline (no index, an empty find-links): BuildFailed naming
    pip's complaint and the way out, and no venv left to reuse."""
    for k in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(k)
    empty = tmp_path / "wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    cache = tmp_path / "cache"
    with pytest.raises(BuildFailed) as err:
        buildenv.ensure(resolve("cpu"), str(_tree(tmp_path, {})), str(cache), sys.executable, _tee(tmp_path))
    assert "pip installing cmake, ninja" in err.value.message and "cmake==" in err.value.message
    assert "PIP_INDEX_URL" in (err.value.hint or "") and "build_venv: false" in (err.value.hint or "")
    assert not [p for p in (cache / "buildenv").iterdir() if not p.name.endswith(".lock")]
    assert "No matching distribution" in (tmp_path / "logs" / "build.log").read_text()


def test_the_venv_env_puts_its_bin_first_and_mkl_where_cmake_looks(tmp_path):
    venv = buildenv.BuildVenv(tmp_path / "k", "k", True, 1.0, {"cmake": "3.31.6"})
    env = venv.env({"PATH": "/usr/bin", "CMAKE_PREFIX_PATH": "/opt/x"}, blas_mkl=True)
    assert env["PATH"] == f"{tmp_path}/k/bin:/usr/bin" and env["VIRTUAL_ENV"] == f"{tmp_path}/k"
    assert env["CMAKE_PREFIX_PATH"] == f"{tmp_path}/k:/opt/x" and env["INTEL_MKL_DIR"] == f"{tmp_path}/k"
    assert "INTEL_MKL_DIR" not in venv.env({"INTEL_MKL_DIR": "/opt/intel/mkl"}, blas_mkl=True)  # the site's wins
    assert "INTEL_MKL_DIR" not in venv.env({}, blas_mkl=False)
    assert json.loads(json.dumps(venv.record()))["cmake"] == "3.31.6"


def test_concurrent_builds_make_it_once(tmp_path, monkeypatch):
    """Two builds at once with the same key: the second waits on the lock and reuses the first's."""
    import threading
    import time

    fake = FakeRun()

    def slow(cmd, *a, **kw):
        if "pip" in cmd:
            time.sleep(0.5)
        return fake(cmd, *a, **kw)

    monkeypatch.setattr(buildenv, "_run", slow)
    tree, cache = _tree(tmp_path, {}), tmp_path / "cache"
    spec = resolve("cpu", ["arch=x86_64"])
    made: list[buildenv.BuildVenv] = []

    def one(i: int) -> None:
        made.append(buildenv.ensure(spec, str(tree), str(cache), sys.executable, _tee(tmp_path / str(i))))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(v.created for v in made) == [False, True] and len(fake.installs) == 1
    assert made[0].path.resolve() == made[1].path.resolve()


def test_a_lock_held_by_another_process_makes_the_build_wait(tmp_path, monkeypatch):
    """Another process (another build on the node, or on another node of a shared cache) holds
    the venv's lock with flock(2): this build installs nothing until that process lets it go."""
    import subprocess
    import time

    fake = FakeRun()
    started: list[float] = []  # CLOCK_MONOTONIC: one clock for every process of the machine

    def timed(cmd, *a, **kw):
        started.append(time.monotonic())
        return fake(cmd, *a, **kw)

    monkeypatch.setattr(buildenv, "_run", timed)
    tree, spec = _tree(tmp_path, {}), resolve("cpu", ["arch=x86_64"])
    key = buildenv.ensure(spec, str(tree), str(tmp_path / "probe"), sys.executable, _tee(tmp_path / "p")).key
    started.clear()
    lock = tmp_path / "cache" / "buildenv" / f"{key}.lock"
    lock.parent.mkdir(parents=True)
    hold = (
        "import fcntl, sys, time\n"
        "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
        "time.sleep(1.5); print(time.monotonic(), flush=True); f.close()\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        made = buildenv.ensure(spec, str(tree), str(tmp_path / "cache"), sys.executable, _tee(tmp_path / "c"))
        released = float(holder.stdout.readline())
    finally:
        holder.kill()
        holder.wait()
    assert made.created and started and min(started) >= released
