"""SIF logic without an engine: the definition file, the baked profile, space checks, and the
process handling that replaces spython's build()/run() (with small stand-in executables)."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from torchbuild import __version__
from torchbuild.backends.apptainer import check_sif, run_args
from torchbuild.cli import main
from torchbuild.config import profile_text, resolve
from torchbuild.errors import ImageNotFound, InsufficientSpace, SifError, ToolMissing
from torchbuild.sif import (
    Apptainer,
    HostApptainer,
    _stream,
    check_space,
    definition,
    locate,
    sif_build_env,
    sif_filename,
    space_needed,
)


def test_definition_bootstraps_from_the_archive_and_adds_metadata_only(tmp_path):
    spec = resolve("gh200")
    text = definition(spec, archive=tmp_path / "image.tar", profile_file=tmp_path / "gh200.yaml", image_id="sha256:abc")
    assert text.startswith(f"Bootstrap: docker-archive\nFrom: {tmp_path / 'image.tar'}\n")
    assert f"{tmp_path / 'gh200.yaml'} /opt/torchbuild/profiles/gh200.yaml" in text
    assert "%post" not in text  # the recipe is never run again
    assert 'exec /opt/venv/bin/torchbuild "$@"' in text
    assert "org.torchbuild.sif.image-id sha256:abc" in text and f"org.torchbuild.sif.profile-hash {spec.hash}" in text
    # flags with spaces survive as one shell-quoted value
    cxxflags = next(line for line in text.splitlines() if "export CXXFLAGS=" in line)
    assert cxxflags.strip().startswith("export CXXFLAGS='") and "-fdata-sections -flax-vector-conversions" in cxxflags
    assert "export TORCH_CUDA_ARCH_LIST=9.0" in text and "MAX_JOBS" not in text
    assert "/src" in text.split("%help", 1)[1] and "--nv" in text.split("%help", 1)[1]


def test_definition_refuses_paths_with_whitespace(tmp_path):
    with pytest.raises(SifError, match="whitespace"):
        definition(
            resolve("cpu"), archive=tmp_path / "my cache" / "image.tar", profile_file=tmp_path / "p", image_id="x"
        )


@pytest.mark.parametrize(
    ("profile", "sets"), [("cpu", []), ("gh200", []), ("derecho", ["switches.USE_MAGMA=0", "cache_dir=/scratch/tb"])]
)
def test_baked_profile_resolves_to_the_same_hash(tmp_path, profile, sets):
    spec = resolve(profile, sets)
    path = tmp_path / f"{spec.profile}.yaml"
    path.write_text(profile_text(spec))
    again = resolve(str(path))
    assert again.hash == spec.hash and again.profile == spec.profile


def test_runtime_env_is_the_build_env_with_the_cache_at_slash_cache():
    env = sif_build_env(resolve("cpu"))
    assert env["TORCHBUILD_PROFILE"] == "/opt/torchbuild/profiles/cpu.yaml"
    assert env["CCACHE_DIR"] == "/cache/ccache" and env["PIP_CACHE_DIR"] == "/cache/pip"
    assert "MAX_JOBS" not in env  # planned where the build runs


def test_sif_names():
    assert sif_filename(resolve("cpu", arch="aarch64")) == "torch-build-cpu-aarch64.sif"


def test_space_is_summed_per_file_system_and_refused_up_front(tmp_path):
    gib = 2**30
    needs = space_needed(10 * gib, tmp_path / "cache" / "apptainer", tmp_path / "out")
    assert list(needs) == [tmp_path]  # both on one file system: one entry, the sum
    assert needs[tmp_path] == int(10 * gib * 2.6) + int(10 * gib * 0.6)
    check_space(needs, free=lambda p: 40 * gib)
    with pytest.raises(InsufficientSpace, match=r"needs 32\.0 GiB free .* has 5\.0 GiB"):
        check_space(needs, free=lambda p: 5 * gib)


def test_run_args_clean_environment_binds_and_nv(tmp_path):
    sif = tmp_path / "t.sif"
    args = run_args(sif, {Path("/w/src"): "/src", Path("/w/cache"): "/cache"}, ["build", "--preflight"])
    assert args[:2] == ["run", "--cleanenv"] and "--nv" not in args
    assert args[args.index("--bind") + 1] == "/w/src:/src,/w/cache:/cache"
    assert args[-3:] == [str(sif), "build", "--preflight"]
    nv = run_args(sif, {}, [], flags=("--userns",), nv=True)
    assert nv[:4] == ["run", "--userns", "--cleanenv", "--nv"]
    assert "sudo" not in args + nv


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


class _Watch(io.StringIO):
    """An output stream that reacts to a line: spython reads stderr only at the end, so a
    child that waits for its stderr to be seen would hang forever there."""

    def __init__(self, trigger: str, action) -> None:
        super().__init__()
        self.trigger, self.action = trigger, action

    def write(self, text: str) -> int:
        n = super().write(text)
        if self.trigger in text:
            self.action()
        return n


def test_stream_merges_stderr_live(tmp_path):
    flag = tmp_path / "seen"
    child = _script(
        tmp_path,
        "child",
        f"""import sys, time, pathlib
print("progress on stderr", file=sys.stderr, flush=True)
deadline = time.time() + 20
while not pathlib.Path({str(flag)!r}).exists():
    if time.time() > deadline:
        print("stderr was not streamed", flush=True); sys.exit(3)
    time.sleep(0.05)
print("done on stdout", flush=True)
""",
    )
    out = _Watch("progress on stderr", flag.touch)
    assert _stream([str(child)], {}, out, tmp_path / "log") == 0
    assert out.getvalue().splitlines() == ["progress on stderr", "done on stdout"]
    assert (tmp_path / "log").read_text() == out.getvalue()


def test_stream_extends_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TB_KEEP", "kept")
    child = _script(tmp_path, "child", "import os; print(os.environ['TB_KEEP'], os.environ['TB_ADD'])")
    out = io.StringIO()
    assert _stream([str(child)], {"TB_ADD": "added"}, out, None) == 0
    assert out.getvalue().strip() == "kept added"


def test_stream_stops_the_child_on_interrupt(tmp_path):
    pidfile = tmp_path / "pid"
    child = _script(
        tmp_path,
        "child",
        f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); print('up', flush=True); time.sleep(300)",
    )

    def interrupt() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _stream([str(child)], {}, _Watch("up", interrupt), None)
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_host_apptainer_reads_labels_through_spython(tmp_path, monkeypatch):
    """spython's client calls `singularity inspect ... --json`; a stand-in answers it."""
    labels = {"org.torchbuild.profile": "cpu", "org.torchbuild.version": __version__}
    fake = _script(
        tmp_path,
        "singularity",
        "import json, sys\n"
        "if sys.argv[1] == 'inspect' and '--json' in sys.argv:\n"
        f"    print(json.dumps({{'data': {{'attributes': {{'labels': {labels!r}}}}}}}))\n"
        "else:\n    sys.exit(2)\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    got = HostApptainer(str(fake)).labels(tmp_path / "x.sif")
    assert got == labels


def test_host_apptainer_has_no_memory_limit(tmp_path):
    with pytest.raises(SifError, match="--memory"):
        HostApptainer("/bin/true").call(["version"], memory_limit="8g")


def test_locate_modes(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolMissing, match="neither apptainer nor singularity"):
        locate(resolve("cpu"), "host")
    with pytest.raises(SifError, match="unknown apptainer mode"):
        locate(resolve("cpu"), "podman")
    _script(tmp_path, "apptainer", "")
    assert isinstance(locate(resolve("cpu"), "auto"), HostApptainer)


class _Labels(Apptainer):
    def __init__(self, labels: dict[str, str]) -> None:
        self._labels = labels

    def labels(self, sif: Path) -> dict[str, str]:
        return self._labels


def test_check_sif_names_a_missing_or_foreign_sif(tmp_path):
    spec = resolve("cpu", arch="x86_64")
    with pytest.raises(ImageNotFound, match="does not exist") as exc:
        check_sif(spec, _Labels({}), tmp_path / "none.sif")
    assert "invoke sif --profile cpu --arch x86_64" in exc.value.hint
    sif = tmp_path / "t.sif"
    sif.write_bytes(b"")
    good = {"org.torchbuild.profile": "cpu", "org.torchbuild.arch": "x86_64", "org.torchbuild.version": __version__}
    assert check_sif(spec, _Labels(good), sif) == good
    with pytest.raises(ImageNotFound, match="has profile 'gh200'"):
        check_sif(spec, _Labels({**good, "org.torchbuild.profile": "gh200"}), sif)
    with pytest.raises(ImageNotFound, match="has arch 'aarch64'"):
        check_sif(spec, _Labels({**good, "org.torchbuild.arch": "aarch64"}), sif)


def test_build_cli_without_a_tree_says_what_to_bind(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("APPTAINER_CONTAINER", str(tmp_path / "t.sif"))  # as in a SIF
    assert not Path("/src/setup.py").exists()
    assert main(["build", "--preflight"]) == 8
    err = capsys.readouterr().err
    assert "SourceError: no PyTorch tree at /src" in err and "--bind /path/to/pytorch:/src" in err


def test_cli_help_explains_the_binds(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "SRC:/src,CACHE:/cache" in text and "--nv" in text and "/out" in text
    json.dumps(text)  # plain text


def test_default_sif_link_is_replaced_without_leftovers(tmp_path):
    from torchbuild.sif import _link_default

    spec = resolve("cpu")
    final = tmp_path / sif_filename(spec)
    final.write_bytes(b"one")
    for _ in range(2):  # the second time the link already names the same file
        _link_default(spec, final)
    final.unlink()
    final.write_bytes(b"two")  # a new conversion: a new file under the same name
    _link_default(spec, final)
    assert (tmp_path / "torch-build.sif").read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([final.name, "torch-build.sif"])
    _link_default(resolve("gh200", arch="aarch64"), final)  # not the default profile: no link change
    assert (tmp_path / "torch-build.sif").read_bytes() == b"two"
