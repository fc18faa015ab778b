"""A compile cache shared by two "nodes": a real redis-server in a container the test starts on
a network it creates, and two builds of the fixture with separate local caches (two cache
directories, two copies of the tree) through `invoke build --in-container`. The second node
compiles nothing: everything comes from the remote storage. A storage that refuses writes
(redis's min-replicas-to-write with no replica: every SET answered -NOREPLICAS, reads served)
and one that is down each slow a build to local-only with one warning, never fail it.

The build containers run on Docker's default bridge (the backend's own), so they reach redis
through a port published on that bridge's gateway address only; the test removes the
container and the network itself.
"""

from __future__ import annotations

import io
import shutil
import uuid
from pathlib import Path

import pytest
from helpers import FIXTURES, TEST_TORCH, bridge_gateway, manifest_of, run_invoke, set_args

pytestmark = pytest.mark.docker

REDIS_IMAGE = "torchbuild-test/redis:trixie"
REDIS_DOCKERFILE = """FROM {base}
RUN apt-get -o Acquire::Check-Valid-Until=false update \\
 && apt-get install -y --no-install-recommends redis-server \\
 && rm -rf /var/lib/apt/lists/*
"""
WARNING = "warning: the remote compile cache (ccache_remote) failed"


def _redis_image(engine, base: str) -> str:
    """A small redis-server image from the local Debian base (built once, then reused)."""
    client = engine.client
    try:
        client.images.get(REDIS_IMAGE)
    except Exception:  # docker.errors.ImageNotFound
        dockerfile = io.BytesIO(REDIS_DOCKERFILE.format(base=base).encode())
        client.images.build(fileobj=dockerfile, tag=REDIS_IMAGE, rm=True, forcerm=True)
    return REDIS_IMAGE


@pytest.fixture(scope="module")
def redis_url(engine, local_base):
    """redis://<bridge gateway>:<published port> of a redis-server on a network made for it;
    yields (url, container); the container and the network are removed afterwards."""
    client = engine.client
    image = _redis_image(engine, local_base)
    gateway = bridge_gateway(client.networks.get("bridge").attrs)
    network = client.networks.create(f"tb-shared-cache-{uuid.uuid4().hex[:8]}", driver="bridge")
    container = None
    try:
        container = client.containers.run(
            image,
            ["redis-server", "--protected-mode", "no", "--save", "", "--appendonly", "no"],
            detach=True,
            network=network.name,
            ports={"6379/tcp": (gateway, None)},
            labels={"org.torchbuild.test": "shared-cache"},
        )
        container.reload()
        port = container.attrs["NetworkSettings"]["Ports"]["6379/tcp"][0]["HostPort"]
        yield f"redis://{gateway}:{port}", container
    finally:
        if container is not None:
            container.remove(force=True)
        network.remove()


def _node(tmp_path: Path, name: str) -> tuple[Path, Path, Path]:
    """A node's own copy of the fixture tree, output and local cache."""
    root = tmp_path / name
    tree = root / "minitorch"
    shutil.copytree(FIXTURES / "minitorch", tree, ignore=shutil.ignore_patterns("build", "*.so", "_version.py"))
    out, cache = root / "out", root / "cache"
    out.mkdir()
    cache.mkdir()
    return tree, out, cache


def _build(node: tuple[Path, Path, Path], overrides: list[str], url: str) -> tuple[str, dict]:
    tree, out, cache = node
    res = run_invoke(
        "build",
        "--in-container",
        "--profile",
        "cpu",
        "--arch",
        "x86_64",
        "--source",
        str(tree),
        "--out",
        str(out),
        *set_args(
            [
                TEST_TORCH,
                *overrides,
                f"cache_dir={cache}",
                "patches=none",
                "local_version=tbtest",
                f"ccache_remote={url}",
            ]
        ),
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr
    return res.stdout, manifest_of(res.stdout)


def _refuse_writes(container) -> None:
    """The storage emptied, then refusing every write (no replica can acknowledge one); reads
    still answer, so a build looks up each unit, misses and fails to store it."""
    for cmd in (["FLUSHALL"], ["CONFIG", "SET", "min-replicas-to-write", "1"]):
        code, output = container.exec_run(["redis-cli", *cmd])
        assert code == 0 and b"OK" in output, output
    code, output = container.exec_run(["redis-cli", "SET", "probe", "1"])
    assert b"NOREPLICAS" in output, output


def test_the_second_node_compiles_nothing_and_a_storage_that_is_down_only_slows(
    cpu_image, site_overrides, redis_url, tmp_path
):
    url, container = redis_url
    profile = tmp_path / "shared.yaml"  # what a site writes: the cpu profile with its cache
    profile.write_text(f"extends: cpu\nccache_remote: '{url}'\n")
    doctor = run_invoke("doctor", "--profile", str(profile))
    assert doctor.returncode == 0 and f"{url}: answers PING" in doctor.stdout, doctor.stdout + doctor.stderr

    first_out, first = _build(_node(tmp_path, "node-a"), site_overrides, url)
    a = first["ccache"]
    assert a["misses"] > 0 and a["remote"]["remote_misses"] == a["misses"] and a["remote"]["remote_errors"] == 0
    assert WARNING not in first_out

    second_out, second = _build(_node(tmp_path, "node-b"), site_overrides, url)
    b = second["ccache"]
    # nothing compiled on the second node: every object came from the shared storage
    assert b["misses"] == 0 and b["hits"] == a["misses"]
    assert b["remote"]["remote_hits"] == a["misses"] and b["remote"]["url"] == url
    assert WARNING not in second_out

    _refuse_writes(container)  # the storage refuses writes: a third node compiles everything here
    refused_out, refused = _build(_node(tmp_path, "node-r"), site_overrides, url)
    r = refused["ccache"]
    assert r["misses"] == a["misses"] and r["remote"]["remote_hits"] == 0
    assert r["remote"]["remote_errors"] > 0 and refused_out.count(WARNING) == 1

    container.stop(timeout=2)  # the storage goes down: a fourth node builds with its local cache
    third_out, third = _build(_node(tmp_path, "node-c"), site_overrides, url)
    c = third["ccache"]
    assert c["misses"] == a["misses"] and c["remote"]["remote_hits"] == 0
    assert c["remote"]["remote_errors"] + c["remote"]["remote_timeouts"] > 0
    assert third_out.count(WARNING) == 1
