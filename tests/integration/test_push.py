"""--push against a real registry (Debian's docker-registry on loopback): per-arch images and a
multi-arch manifest list that names amd64 and arm64. The per-arch images are one-file stand-ins
whose configs name their architecture (tests/helpers.tiny_image): what is pushed is the point,
not what runs in it, so no arm64 base is debootstrapped under qemu for it (about 3 minutes on a
new machine; tests/slow's aarch64 tests build that base)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time

import pytest
from helpers import tiny_image

from torchbuild.core.arch import Arch
from torchbuild.image.host import push_images
from torchbuild.profile.config import resolve

pytestmark = [pytest.mark.docker]


@pytest.fixture
def registry(tmp_path):
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.fail("the push test needs Debian's docker-registry (apt-get install docker-registry)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen([exe, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_push_publishes_a_multi_arch_manifest_list(engine, registry):
    image_name = f"{registry}/tb/toolchain"
    specs = [resolve("cpu", [f"image_name={image_name}"], arch=a.value) for a in Arch]
    # stand-ins for the per-arch toolchain images: one file each, the right architecture
    for spec in specs:
        tiny_image(engine, spec.image_tag, spec.arch.docker_arch)
        assert engine.image_attrs(spec.image_tag)["Architecture"] == spec.arch.docker_arch
    try:
        target = push_images(engine, specs)
    finally:
        for spec in specs:
            engine.client.api.remove_image(spec.image_tag)
    assert target == f"{image_name}:cpu-{specs[0].torch_version}"  # the manifest list: the tag without its arch
    raw = subprocess.run(
        ["docker", "manifest", "inspect", "--insecure", target], capture_output=True, text=True, check=True
    ).stdout
    platforms = {(m["platform"]["os"], m["platform"]["architecture"]) for m in json.loads(raw)["manifests"]}
    assert platforms == {("linux", "amd64"), ("linux", "arm64")}
