"""SIF logic without an engine: the definition file, the baked profile, space checks, and the
process handling that replaces spython's build()/run() (with small stand-in executables)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import stat
import sys
import tarfile
import time
from pathlib import Path

import pytest
from helpers import fake_sif

from torchbuild import __version__
from torchbuild.cli import main
from torchbuild.core.errors import ImageNotFound, InsufficientSpace, SifError, ToolMissing, UsageError
from torchbuild.profile.config import profile_text, resolve
from torchbuild.runtime.apptainer import Apptainer, HostApptainer, _stream, locate, sif_filename
from torchbuild.runtime.backends.apptainer import check_sif, run_args
from torchbuild.sif.host import (
    APPTAINER_DEFAULT_COMPRESSION,
    Compression,
    build_args,
    check_space,
    choose_compression,
    definition,
    remove_tree,
    sif_build_env,
    space_needed,
    write_oci_layout,
)


def test_definition_bootstraps_from_the_oci_layout_and_adds_metadata_only(tmp_path):
    spec = resolve("gh200")
    text = definition(
        spec,
        archive=tmp_path / "layout",
        profile_file=tmp_path / "gh200.yaml",
        image_id="sha256:abc",
        compression=Compression("zstd", 3),
    )
    assert text.startswith(f"Bootstrap: oci\nFrom: {tmp_path / 'layout'}\n")
    assert "org.torchbuild.sif.compression zstd:3" in text  # a SIF made otherwise is converted again
    assert f"{tmp_path / 'gh200.yaml'} /opt/torchbuild/profiles/gh200.yaml" in text
    assert "%post" not in text  # the recipe is never run again
    assert 'exec /opt/venv/bin/torchbuild "$@"' in text
    assert (
        "org.torchbuild.sif.image-id sha256:abc" in text
        and "org.torchbuild.sif.route image" in text
        and f"org.torchbuild.sif.profile-hash {spec.hash}" in text
    )
    # flags with spaces survive as one shell-quoted value
    cxxflags = next(line for line in text.splitlines() if "export CXXFLAGS=" in line)
    assert cxxflags.strip().startswith("export CXXFLAGS='") and "-fdata-sections -flax-vector-conversions" in cxxflags
    assert "export TORCH_CUDA_ARCH_LIST=9.0" in text and "MAX_JOBS" not in text
    assert "/src" in text.split("%help", 1)[1] and "--nv" in text.split("%help", 1)[1]


def test_definition_refuses_paths_with_whitespace(tmp_path):
    with pytest.raises(SifError, match="whitespace"):
        definition(resolve("cpu"), archive=tmp_path / "my cache" / "layout", profile_file=tmp_path / "p", image_id="x")
    # `From: DIR:TAG` and `DIR@DIGEST` are how Apptainer names an image in a layout
    for odd in ("a:b", "a@b"):
        with pytest.raises(SifError, match="':' or '@'"):
            definition(resolve("cpu"), archive=tmp_path / odd, profile_file=tmp_path / "p", image_id="x")


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
    assert args[-4:] == ["--", str(sif), "build", "--preflight"]  # the SIF's path is never an option
    nv = run_args(sif, {}, [], flags=("--userns",), nv=True)
    assert nv[:4] == ["run", "--userns", "--cleanenv", "--nv"]
    assert "sudo" not in args + nv


def test_a_path_apptainer_would_split_in_a_bind_is_refused_with_what_to_do(tmp_path):
    sif = tmp_path / "t.sif"
    for binds, kw in (
        ({Path("/w/my,cache"): "/cache"}, {}),
        ({Path("/w/src"): "/src"}, {"read_only": ["/opt/cray/libfabric:1.15"]}),
        ({}, {"host_mpi": ["/opt/mpi,x/lib"]}),
    ):
        with pytest.raises(UsageError, match=r"apptainer cannot bind /\S+: it splits --bind at ',' and ':'") as err:
            run_args(sif, binds, ["build"], **kw)
        assert "without ',' or ':'" in err.value.hint


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
    text = tmp_path / "text.sif"
    text.write_text("not a SIF\n")
    with pytest.raises(ImageNotFound, match="not a SIF"):  # named before Apptainer is asked
        check_sif(spec, _Labels({}), text)
    sif = fake_sif(tmp_path / "t.sif")
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
    from torchbuild.sif.host import link_default

    spec = resolve("cpu")
    final = tmp_path / sif_filename(spec)
    final.write_bytes(b"one")
    for _ in range(2):  # the second time the link already names the same file
        link_default(spec, final)
    final.unlink()
    final.write_bytes(b"two")  # a new conversion: a new file under the same name
    link_default(spec, final)
    assert (tmp_path / "torch-build.sif").read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([final.name, "torch-build.sif"])
    link_default(resolve("gh200", arch="aarch64"), final)  # not the default profile: no link change
    assert (tmp_path / "torch-build.sif").read_bytes() == b"two"


# --------------------------------------------------------------------------- compression


@pytest.mark.parametrize(
    ("text", "algorithm", "level"),
    [("gzip", "gzip", 6), ("zstd", "zstd", 3), ("GZIP:9", "gzip", 9), ("zstd:19", "zstd", 19), (" gzip:1 ", "gzip", 1)],
)
def test_compression_parses_algorithm_and_level(text, algorithm, level):
    c = Compression.parse(text)
    assert (c.algorithm, c.level) == (algorithm, level)
    assert str(c) == f"{algorithm}:{level}"  # the label's value
    assert c.mksquashfs_args() == f"-comp {algorithm} -Xcompression-level {level}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("xz", "unknown SIF compression 'xz'"),
        ("gzip:0", "gzip compression level must be 1 to 9"),
        ("gzip:10", "must be 1 to 9"),
        ("zstd:23", "zstd compression level must be 1 to 22"),
        ("zstd:-1", "must be 1 to 22"),
        ("zstd:3; rm -rf /", "must be 1 to 22"),
    ],
)
def test_compression_refuses_what_mksquashfs_would_not_take(text, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        Compression.parse(text)


def test_build_args_pass_the_compression_as_argv_items(tmp_path):
    sif, deffile = tmp_path / "my dir" / "t.sif", tmp_path / "t.def"
    args = build_args(sif, deffile, Compression.parse("zstd:19"))
    assert args == [
        "build",
        "--force",
        "--mksquashfs-args",
        "-comp zstd -Xcompression-level 19",  # one item: Apptainer splits it into mksquashfs's argv
        "--",
        str(sif),
        str(deffile),
    ]
    assert "--disable-cache" not in args  # the OCI layout is the blob cache (build_sif)
    assert args[args.index("--mksquashfs-args") + 1].split() == ["-comp", "zstd", "-Xcompression-level", "19"]
    assert all(isinstance(a, str) for a in args) and str(sif) in args  # never joined into a shell string
    # an Apptainer before 1.4 has no --mksquashfs-args: only its own default can be made there
    assert build_args(sif, deffile, APPTAINER_DEFAULT_COMPRESSION, flags=()) == [
        "build",
        "--force",
        "--",
        str(sif),
        str(deffile),
    ]
    with pytest.raises(SifError, match=r"needs Apptainer 1\.4"):
        build_args(sif, deffile, Compression.parse("gzip"), flags=())


def test_default_compression_is_gzip_6_and_falls_back_where_it_cannot_be_set():
    flags = ("--mksquashfs-args",)
    assert choose_compression(None, flags) == Compression("gzip", 6)
    assert choose_compression(Compression("zstd", 3), flags) == Compression("zstd", 3)
    assert choose_compression(None, ()) == Compression("gzip", 9) == APPTAINER_DEFAULT_COMPRESSION
    assert choose_compression(Compression("gzip", 9), ()) == APPTAINER_DEFAULT_COMPRESSION
    with pytest.raises(SifError, match=r"cannot make a zstd:3 SIF: --mksquashfs-args needs Apptainer 1\.4") as exc:
        choose_compression(Compression("zstd", 3), ())
    assert "--apptainer docker" in exc.value.hint


@pytest.mark.parametrize(
    ("help_text", "flags"),
    [("--mksquashfs-args string   extra arguments", {"--mksquashfs-args"}), ("--fakeroot", set())],
)
def test_build_flags_are_read_from_build_help_once(tmp_path, help_text, flags):
    calls = tmp_path / "calls"
    fake = _script(
        tmp_path,
        "apptainer",
        f"import sys\nopen({str(calls)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\nprint({help_text!r})\n",
    )
    apptainer = HostApptainer(str(fake))
    assert apptainer.build_flags() == flags
    assert apptainer.build_flags() == flags
    assert calls.read_text().splitlines() == ["build --help"]


# --------------------------------------------------------------------------- docker save -> OCI layout


def _tar(members: list[tuple[str, bytes | str]]) -> bytes:
    """A tar of (name, data) files and (name, "->target") symlinks, as docker save writes it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data.removeprefix("->")
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _layer(*files: tuple[str, bytes]) -> bytes:
    return _tar(list(files))


def _chunks(data: bytes, size: int = 1000):
    """docker-py hands the export over in chunks that cut through tar headers."""
    return (data[i : i + size] for i in range(0, len(data), size))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_layout(path: Path) -> tuple[dict, dict]:
    index = json.loads((path / "index.json").read_text())
    assert json.loads((path / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    assert len(index["manifests"]) == 1
    digest = index["manifests"][0]["digest"].removeprefix("sha256:")
    data = (path / "blobs" / "sha256" / digest).read_bytes()
    assert _sha(data) == digest and index["manifests"][0]["size"] == len(data)
    return index, json.loads(data)


def test_oci_layout_from_a_legacy_docker_save(tmp_path):
    """Docker 20.10's format: <id>/layer.tar, a repeated layer as a symlink, the config as
    <sha>.json, manifest.json last; the layers stay uncompressed and in order."""
    base, top = _layer(("etc/os-release", b"ID=debian\n")), _layer(("opt/venv/bin/torchbuild", b"#!/bin/sh\n"))
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin"]}}).encode()
    manifest = [
        {"Config": f"{_sha(config)}.json", "RepoTags": ["t:1"], "Layers": ["a/layer.tar", "b/layer.tar", "c/layer.tar"]}
    ]
    archive = _tar(
        [
            ("a/VERSION", b"1.0"),
            ("a/json", b"{}"),
            ("a/layer.tar", base),
            ("b/layer.tar", top),
            ("c/layer.tar", "->../a/layer.tar"),  # the same layer again
            (f"{_sha(config)}.json", config),
            ("manifest.json", json.dumps(manifest).encode()),
            ("repositories", b"{}"),
        ]
    )
    layout = write_oci_layout(_chunks(archive), tmp_path / "layout")
    index, image = _read_layout(layout.path)
    assert layout.manifest_digest == index["manifests"][0]["digest"]
    assert image["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert image["config"] == {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        "digest": f"sha256:{_sha(config)}",
        "size": len(config),
    }
    tar_type = "application/vnd.oci.image.layer.v1.tar"
    assert image["layers"] == [
        {"mediaType": tar_type, "digest": f"sha256:{_sha(base)}", "size": len(base)},
        {"mediaType": tar_type, "digest": f"sha256:{_sha(top)}", "size": len(top)},
        {"mediaType": tar_type, "digest": f"sha256:{_sha(base)}", "size": len(base)},
    ]
    blobs = tmp_path / "layout" / "blobs" / "sha256"
    assert (blobs / _sha(base)).read_bytes() == base  # as docker save wrote it: no compression
    # VERSION, json and repositories are not blobs of the image; no partial file is left
    names = sorted(p.name for p in blobs.iterdir())
    assert names == sorted({_sha(base), _sha(top), _sha(config), index["manifests"][0]["digest"][7:]})
    assert layout.size == sum((blobs / n).stat().st_size for n in names)


def test_oci_layout_from_an_oci_docker_save_with_compressed_layers(tmp_path):
    """Docker 25+ writes blobs/sha256/<digest> (and the containerd store may keep layers
    compressed): the media type follows what the blob is."""
    plain = _layer(("a", b"1"))
    packed = gzip.compress(_layer(("b", b"2")))
    config = b'{"architecture": "arm64", "os": "linux"}'
    manifest = [
        {
            "Config": f"blobs/sha256/{_sha(config)}",
            "Layers": [f"blobs/sha256/{_sha(plain)}", f"blobs/sha256/{_sha(packed)}"],
        }
    ]
    archive = _tar(
        [
            ("blobs/sha256/" + _sha(plain), plain),
            ("blobs/sha256/" + _sha(packed), packed),
            ("blobs/sha256/" + _sha(config), config),
            ("index.json", b'{"schemaVersion": 2, "manifests": []}'),
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("manifest.json", json.dumps(manifest).encode()),
        ]
    )
    _, image = _read_layout(write_oci_layout(_chunks(archive, 777), tmp_path / "l").path)
    assert [layer["mediaType"] for layer in image["layers"]] == [
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
    ]
    assert image["config"]["digest"] == f"sha256:{_sha(config)}"


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([("a/layer.tar", b"x")], "no manifest.json for exactly one image"),
        (
            [("manifest.json", b'[{"Config": "c.json", "Layers": ["a/layer.tar"]}]'), ("c.json", b"{}")],
            "no 'a/layer.tar'",
        ),
    ],
)
def test_oci_layout_refuses_an_archive_it_cannot_read(tmp_path, members, message):
    with pytest.raises(SifError, match=re.escape(message)):
        write_oci_layout(_chunks(_tar(members)), tmp_path / "l")


def test_remove_tree_removes_read_only_directories_and_never_raises(tmp_path):
    """What an unprivileged extraction leaves after Ctrl-C can hold read-only directories."""
    work = tmp_path / "work" / "abc"
    (work / "rootfs" / "usr" / "lib").mkdir(parents=True)
    (work / "rootfs" / "usr" / "lib" / "libx.so").write_bytes(b"x")
    (work / "rootfs" / "proc").mkdir()
    (work / "rootfs" / "usr" / "lib").chmod(0o555)
    (work / "rootfs" / "proc").chmod(0o000)
    mode = (tmp_path / "work").stat().st_mode
    remove_tree(work)
    assert not work.exists() and (tmp_path / "work").stat().st_mode == mode
    remove_tree(work)  # gone already: nothing to do
