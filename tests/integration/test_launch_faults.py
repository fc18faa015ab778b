"""Faults of the launch path, with the real parts: a native build of the minitorch fixture on
this host, the real Docker engine (or none at all), real file systems (tmpfs mounts)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO, TEST_TORCH, run_invoke, set_args

NATIVE = pytest.mark.skipif(
    not all(__import__("shutil").which(t) for t in ("g++", "cmake", "ninja", "ccache")),
    reason="native builds need g++, cmake, ninja and ccache on PATH",
)


def tree_digest(root: Path) -> str:
    """Paths, modes and contents of every file under root."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(f"{p.relative_to(root)}\0{p.lstat().st_mode}\0".encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def tree(tmp_path):
    import shutil

    t = tmp_path / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", t, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    return t


@pytest.fixture
def series(tmp_path, tree):
    """A patch series that applies to the fixture (so a premature patch would change the tree)."""
    d = tmp_path / "series"
    d.mkdir()
    ops = (tree / "csrc" / "ops.cpp").read_text().splitlines(keepends=True)
    patch = ["--- a/csrc/ops.cpp\n", "+++ b/csrc/ops.cpp\n", f"@@ -1,{len(ops)} +1,{len(ops) + 1} @@\n"]
    patch += [" " + line for line in ops] + ["+// patched\n"]
    (d / "01-mark.patch").write_text("".join(patch))
    return d


# --------------------------------------------------------------------------- 2: check first


@pytest.mark.docker
@pytest.mark.parametrize(
    ("case", "extra", "env", "code", "words"),
    [
        ("engine unreachable", [], {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}, 3, "EngineUnavailable"),
        ("image missing", ["--set", "image_name=torchbuild/never-built"], {}, 7, "ImageNotFound"),
        ("no apptainer on this host", ["--engine", "apptainer", "--apptainer", "host"], {}, 5, "ToolMissing"),
    ],
)
def test_in_container_checks_the_runtime_before_touching_the_tree(
    tree, series, tmp_path, case, extra, env, code, words
):
    before = tree_digest(tree)
    res = run_invoke(
        "build",
        "--in-container",
        "--source",
        str(tree),
        "--out",
        str(tmp_path / "out"),
        *set_args([TEST_TORCH, f"cache_dir={tmp_path / 'cache'}", f"patches={series}"]),
        *extra,
        env=env,
    )
    assert res.returncode == code, res.stdout[-2000:] + res.stderr
    assert words in res.stderr and "Traceback" not in res.stderr
    assert tree_digest(tree) == before, f"{case}: the tree changed before the runtime was checked"
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- 3: stop the group


def _processes_with(argv: list[str]) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")[:-1]
            except OSError:
                continue
            if [c.decode(errors="replace") for c in cmd] == argv:
                found.append(int(d.name))
    return found


@NATIVE
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_invoke_alone_stops_every_build_process(tree, tmp_path, sig):
    seconds = str(170 + int(sig))  # a sleep no other test runs, so its processes can be found
    out, cache = tmp_path / "out", tmp_path / "cache"
    env = {**os.environ, "MINITORCH_SLOW_SECONDS": seconds}
    cmd = [sys.executable, "-m", "invoke", "build", "--no-verify", "--source", str(tree), "--out", str(out)]
    cmd += set_args([TEST_TORCH, f"cache_dir={cache}", "patches=none"])
    # its own session, like a batch system's job: the signal goes to invoke's pid only
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not _processes_with(["sleep", seconds]):
            assert proc.poll() is None and time.monotonic() < deadline, "the slow step never started"
            time.sleep(0.5)
        os.kill(proc.pid, sig)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, output[-2000:]
    assert "BuildInterrupted" in output
    assert _processes_with(["sleep", seconds]) == [], "a build process outlived invoke"
    assert not list(out.glob("*.whl")) and not list(out.glob(".partial-*"))
    # cache/tmp itself is gone when this run made it and left it empty (issue 41 item 18)
    tmp = cache / "tmp"
    assert not tmp.exists() or not any(tmp.iterdir()), "pip's temporary directories were left behind"


# --------------------------------------------------------------------------- 4: reconfigure


def _native_build(tree: Path, tmp_path: Path, *sets: str, out: Path | None = None):
    return run_invoke(
        "build",
        "--no-verify",
        "--source",
        str(tree),
        "--out",
        str(out or tmp_path / "out"),
        *set_args([TEST_TORCH, f"cache_dir={tmp_path / 'cache'}", "patches=none", *sets]),
    )


@NATIVE
def test_changed_cxxflags_reconfigure_a_configured_tree(tree, tmp_path):
    first = _native_build(tree, tmp_path, "cxxflags=[-DTB_FIRST]")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    cache = tree / "build" / "CMakeCache.txt"
    assert "-DTB_FIRST" in cache.read_text()
    second = _native_build(tree, tmp_path, "cxxflags=[-DTB_SECOND]")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr
    assert "reconfiguring" in second.stdout and "CXXFLAGS changed" in second.stdout
    flags = next(ln for ln in cache.read_text().splitlines() if ln.startswith("CMAKE_CXX_FLAGS:"))
    assert "-DTB_SECOND" in flags and "-DTB_FIRST" not in flags
    third = _native_build(tree, tmp_path, "cxxflags=[-DTB_SECOND]")  # unchanged: no reconfigure
    assert third.returncode == 0 and "reconfiguring" not in third.stdout


@NATIVE
def test_a_configure_that_did_not_finish_is_redone(tree, tmp_path):
    """What an interrupted configure leaves: a cache and a half-written build.ninja."""
    build = tree / "build"
    build.mkdir()
    (build / "CMakeCache.txt").write_text("CMAKE_CXX_FLAGS:STRING=\n")
    (build / "build.ninja").write_text("rule cc\n  command = $\n")  # ninja: "bad $-escape"
    res = _native_build(tree, tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    assert "bad $-escape" not in res.stdout
    assert "reconfiguring" in res.stdout and "without a torchbuild record" in res.stdout


# --------------------------------------------------------------------------- 5: OS faults


@pytest.fixture
def mount_tmpfs(tmp_path):
    """mount_tmpfs(name, options) -> a tmpfs mounted at tmp_path/name (root only; unmounted after)."""
    mounted: list[Path] = []

    def mount(name: str, options: str) -> Path:
        target = tmp_path / name
        target.mkdir()
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True, text=True
        )
        assert res.returncode == 0, f"these tests mount a tmpfs (root): {res.stderr}"
        mounted.append(target)
        return target

    yield mount
    for target in reversed(mounted):
        subprocess.run(["umount", "-l", str(target)], check=False)


@NATIVE
def test_out_on_a_read_only_file_system_is_named(tree, tmp_path, mount_tmpfs):
    out = mount_tmpfs("ro", "ro,size=1m")
    res = _native_build(tree, tmp_path, out=out / "wheels")
    assert res.returncode == 15, res.stdout[-2000:] + res.stderr
    assert "PathError" in res.stderr and "read-only" in res.stderr and "Traceback" not in res.stderr


@NATIVE
def test_out_on_a_full_file_system_is_insufficient_space(tree, tmp_path, mount_tmpfs):
    out = mount_tmpfs("full", "size=256k")
    filler = out / "filler"
    with filler.open("wb", buffering=0) as f:  # fill it: the build can create its log, then no byte fits
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    res = _native_build(tree, tmp_path, out=out)
    assert res.returncode == 12, res.stdout[-2000:] + res.stderr
    assert "InsufficientSpace" in res.stderr and str(out) in res.stderr and "Traceback" not in res.stderr
    assert not list(out.glob("*.whl")) and not list(out.glob(".partial-*"))


# --------------------------------------------------------------------------- the engine goes away


class EngineProxy:
    """A unix socket that forwards every connection to the real engine until cut(): then it
    closes them all and stops listening, as an engine that was stopped or restarted does to
    its clients (the real build met this: docker-py's ConnectionError, named a path fault)."""

    def __init__(self, path: Path, engine_socket: str) -> None:
        import socket
        import threading

        self.path, self.engine_socket, self.socks = path, engine_socket, []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.engine_socket)
            with self.lock:
                self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        import socket

        with self.lock:
            self.listener.close()
            self.path.unlink(missing_ok=True)
            for s in self.socks:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


@pytest.mark.docker
def test_an_engine_that_goes_away_mid_run_is_engine_unavailable(engine, local_base, tmp_path, monkeypatch):
    """The engine stopped during a containerised build: EngineUnavailable (exit 3) with the
    hint to start it and rerun, not `PathError: invoke build: .: ConnectionError`."""
    import io

    from torchbuild.core.errors import EngineUnavailable
    from torchbuild.runtime.engine import Engine, engine_address

    real = engine_address().removeprefix("unix://")
    proxy = EngineProxy(tmp_path / "engine.sock", real)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{proxy.path}")
    via_proxy = Engine.connect(timeout=60)

    class CutWhenStarted(io.StringIO):
        def write(self, text: str) -> int:
            if "started" in text:
                proxy.cut()
            return super().write(text)

    with pytest.raises(EngineUnavailable) as caught:
        via_proxy.run(
            local_base,
            ["sh", "-c", "echo started; sleep 30"],
            mounts={},
            user="0:0",
            environment={},
            workdir="/",
            out=CutWhenStarted(),
        )
    err = caught.value
    assert "went away while container torchbuild-" in err.message and str(proxy.path) in err.message
    assert "rerun the same command" in err.hint and err.exit_code == 3
    name = err.message.split("container ", 1)[1].split(" ", 1)[0]
    left = engine.client.containers.list(all=True, filters={"name": name})
    for c in left:  # the proxy cut the client off, not the engine: its container lives on
        c.remove(force=True)


@pytest.mark.docker
def test_a_run_after_the_engine_came_back_removes_the_exited_containers_of_the_cut_run(engine, local_base):
    """The container of a run the engine's stop cut off stays, exited (the real build left one):
    the next run removes it. Another program's exited container stays."""
    from torchbuild.runtime.engine import Engine

    ours = engine.client.containers.create(local_base, ["true"], labels={"org.torchbuild.run": "1"})
    theirs = engine.client.containers.create(local_base, ["true"])
    try:
        for c in (ours, theirs):
            c.start()
            c.wait()
        assert Engine(engine.client).run(local_base, ["true"], mounts={}, user="0:0", environment={}, workdir="/") == 0
        names = {c.id for c in engine.client.containers.list(all=True)}
        assert ours.id not in names and theirs.id in names
    finally:
        theirs.remove(force=True)
        with contextlib.suppress(Exception):
            ours.remove(force=True)
