"""Shared test helpers (tests/ is on sys.path through pytest's pythonpath)."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Suite of the local base images the integration tests build on (no registry here).
SUITE = os.environ.get("TORCHBUILD_TEST_SUITE", "trixie")
SUITE_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}[SUITE]
FIXTURES = REPO / "tests" / "fixtures"
# the aws-ofi-nccl release the cuda-offline test image is made for (it builds against libfabric 2.x)
OFI_PLUGIN = "1.17.1"
# Debian trixie's python3-torch 2.6 (with Open MPI, pybind11 and setuptools to build against it)
TORCH_PROFILE = str(FIXTURES / "profiles" / "debian-torch-installed.yaml")
CALLER = f"{os.getuid()}:{os.getgid()}"
# the fixture project's two shapes: with a setup.py (PyTorch up to the scikit-build-core switch)
# and with a scikit-build-core pyproject.toml (PyTorch main's, pytorch/pytorch#189758)
TREE_KINDS = ("setup.py", "scikit-build-core")
# The line the tests build: Debian's PyTorch 2.6 (the only real source here; Debian's packaged
# CUDA 12.4 is the only toolkit, older than 2.15's floor of 12.6). The default profile builds the
# current release (torch_version's default): a test that builds, pairs the cpu profile with
# Debian's CUDA, or checks what goes with a torch version, pins this one.
TEST_TORCH = "torch_version=2.6.0"


def fixture_tree(dest: Path, kind: str = "setup.py") -> Path:
    """A fresh copy of the minitorch fixture at dest: as it is for "setup.py"; for
    "scikit-build-core" without its setup.py and with tests/fixtures/minitorch-skbuild laid over
    it (pyproject.toml, cmake/EnvVarForwarding.cmake, tools/metadata): the same C++ sources."""
    skip = ["build", "*.so", "_version.py", *(["setup.py"] if kind != "setup.py" else [])]
    shutil.copytree(FIXTURES / "minitorch", dest, ignore=shutil.ignore_patterns(*skip))
    if kind != "setup.py":
        shutil.copytree(
            FIXTURES / "minitorch-skbuild", dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    return dest


def run_invoke(*args: str, env: dict[str, str] | None = None, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    """Run `invoke ARGS` from the repository root the way a user does; capture both streams."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def set_args(overrides: list[str]) -> list[str]:
    """["k=v", ...] -> ["--set", "k=v", ...]"""
    return [arg for item in overrides for arg in ("--set", item)]


def manifest_of(stdout: str) -> dict:
    """The manifest named by the `manifest: PATH` line `invoke build` prints at the end."""
    import json

    line = next(ln for ln in stdout.splitlines() if ln.startswith("manifest: "))
    return json.loads(Path(line.split(": ", 1)[1]).read_text())


def image_ok(profile: str, sets: list[str], timeout: int = 3600) -> None:
    """`invoke image --profile PROFILE SETS`, which must succeed."""
    res = run_invoke("image", "--profile", profile, *sets, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr


def preflight_ok(profile: str, source: Path, out: Path, sets: list[str], *extra: str, timeout: int = 3600):
    """`invoke build --in-container --preflight ...`, which must succeed: (stdout, manifest)."""
    res = run_invoke(
        "build",
        "--in-container",
        "--preflight",
        "--profile",
        profile,
        "--source",
        str(source),
        "--out",
        str(out),
        *extra,
        *sets,
        timeout=timeout,
    )
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr
    return res.stdout, manifest_of(res.stdout)


# A wheel's tag for this platform's CPython 3.13 (the images' Python), for names only.
TORCH_TAG = "cp313-cp313-linux_x86_64"


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    tag: str = "py3-none-any",
    *,
    module: str = "",
    salt: str = "",
    code: str = "",
) -> Path:
    """A minimal wheel: dist-info METADATA, WHEEL and RECORD, and module/__init__.py (with
    __version__, then code) when module is given; salt changes the content, not the name."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}"
    files = {}
    if module:
        files[f"{module}/__init__.py"] = f'__version__ = "{version}"\n# {salt}\n{code}'
    files[f"{dist}.dist-info/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n{salt}\n"
    files[f"{dist}.dist-info/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}.dist-info/RECORD"] = "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n"
    wheel = directory / f"{dist}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            # a fixed date: two calls with the same arguments give the same bytes, however far
            # apart (writestr of a name stamps the current time, at 2 s granularity)
            info = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o600 << 16  # what writestr gives a name
            zf.writestr(info, text)
    return wheel


def isolated_pip_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """env (default os.environ) as pip sees no configuration: no PIP_* variable and no
    configuration file (PIP_CONFIG_FILE=os.devnull makes pip read none), for tests about
    pip's choice on a machine whose site pip.conf sets find-links or a constraint."""
    base = os.environ if env is None else env
    return {**{k: v for k, v in base.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}


def run_in(engine, tag: str, script: str, mounts: dict[str, str], env: dict[str, str] | None = None) -> str:
    """bash -c script in a fresh container of tag as the caller; stdout+stderr. Fails the test on
    a non-zero exit, showing the output."""
    container = engine.client.containers.run(
        tag,
        ["bash", "-c", script],
        volumes={h: {"bind": c, "mode": "rw"} for h, c in mounts.items()},
        user=CALLER,
        environment={"HOME": "/tmp", **(env or {})},
        detach=True,
    )
    try:
        status = container.wait(timeout=900)
        logs = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 0, logs[-4000:]
    return logs


def invoke_here(*argv: str) -> int:
    """Run `invoke ARGV` through invoke's own parser in this process (the tasks' collection); its exit status."""
    from invoke.program import Program

    from torchbuild.tasks import ns

    try:
        Program(namespace=ns).run(["invoke", *argv])
    except SystemExit as done:
        return int(done.code or 0)
    return 0


class ApptainerNode:
    """The apptainer-builder container standing in for an HPC node: Apptainer, no Docker engine,
    a non-root user (NODE_UID, with the subordinate ids the image's entrypoint gives it) and
    torchbuild from this checkout on PYTHONPATH. paths are bound at their own paths."""

    NODE_UID = 1000

    def __init__(self, engine, tag: str, home: Path, paths: list[Path]) -> None:
        self.engine, self.tag, self.home, self.paths = engine, tag, home, list(paths)

    def run(self, *command: str) -> tuple[int, str]:
        """command in a fresh container as NODE_UID; (exit status, stdout and stderr)."""
        import io

        from torchbuild.runtime.apptainer import BUILDER_CAPS, BUILDER_DEVICES, BUILDER_SECURITY

        buf = io.StringIO()
        rc = self.engine.run(
            self.tag,
            list(command),
            mounts={str(p): str(p) for p in {REPO, self.home, *self.paths}},
            user="0:0",  # the entrypoint drops to TORCHBUILD_UID at once
            environment={
                "TORCHBUILD_UID": str(self.NODE_UID),
                "TORCHBUILD_GID": str(self.NODE_UID),
                "HOME": str(self.home),
                "PYTHONPATH": str(REPO / "src"),
            },
            workdir=str(self.home),
            out=buf,
            cap_add=BUILDER_CAPS,
            devices=BUILDER_DEVICES,
            security_opt=BUILDER_SECURITY,
        )
        return rc, buf.getvalue()


def shared_dir(path: Path) -> Path:
    """path, made and opened to every uid (a node user other than the caller writes there)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


def fake_sif(path: Path) -> Path:
    """A file with a SIF's global header (the launch line, then SIF_MAGIC at byte 32), enough
    for torchbuild's check that --sif names a SIF; Apptainer itself would refuse it."""
    path.write_bytes(b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0") + b"SIF_MAGIC\x0001\x00" + bytes(100))
    return path


def bridge_gateway(network_attrs: dict) -> str:
    """The host's address on a Docker bridge network (its gateway), from the network's attrs.
    IPAM lists a Gateway for networks made with `docker network create`, but a freshly started
    Docker 28 leaves it out for the default bridge ({"Subnet": "172.17.0.0/16"} alone): the
    engine then gives docker0 the subnet's first address."""
    import ipaddress

    config = network_attrs["IPAM"]["Config"][0]
    if config.get("Gateway"):
        return str(config["Gateway"])
    return str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


def tiny_image(engine, tag: str, arch: str) -> str:
    """A one-file image whose config names linux/<arch> (a Docker architecture: amd64, arm64),
    loaded with `docker load` from an archive made here: a per-arch stand-in that needs neither
    a registry nor emulation (the push test's; arm64 bases debootstrapped under qemu are in
    tests/slow). Returns tag."""
    import io
    import json
    import tarfile

    def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        add(tar, "stand-in", f"a {arch} stand-in image for torchbuild's tests\n".encode())
    diff_id = hashlib.sha256(layer.getvalue()).hexdigest()
    config = json.dumps(
        {
            "architecture": arch,
            "os": "linux",
            "config": {"Labels": {"org.torchbuild.test": "stand-in"}},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
            "history": [{"created_by": "tests/helpers.py tiny_image"}],
        }
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        add(tar, f"{diff_id}/layer.tar", layer.getvalue())
        add(tar, config_name, config)
        manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [f"{diff_id}/layer.tar"]}]
        add(tar, "manifest.json", json.dumps(manifest).encode())
    engine.client.images.load(archive.getvalue())
    return tag
