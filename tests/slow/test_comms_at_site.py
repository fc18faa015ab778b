"""The plugin at the site without Docker (issue 29): in the apptainer-builder container standing
in for a Derecho node (Apptainer, no Docker engine, a non-root user), `torchbuild comms
--in-container --engine apptainer` builds the real aws-ofi-nccl 1.6.0 (Derecho's pin) in a SIF
that carries no comms, against a real libfabric 1.x bound read-only at a Cray-style prefix:
Debian bookworm's libfabric 1.17 (libfabric1 and libfabric-dev, and the libraries it links,
unpacked as they are, with no RUNPATH, under .../cray/libfabric/1.15.2.0/lib, as a site's
libfabric module puts its directory on LD_LIBRARY_PATH). The step copies libfabric and what it
links that the SIF's system does not have into the plugin's deps/lib. A rerun is up to date;
`apptainer exec` with the runtime binds `invoke comms` prints finds NCCL_NET_PLUGIN naming the
plugin, which dlopens and exports ncclNetPlugin_v*, with the prefix alone bound too (the
site's libraries come from deps/lib); without them the SIF says so on stderr and names no
plugin that exists.

The SIF: the SIF definition `invoke sif` writes (its %environment, labels, runscript), on a
small trixie image with the comms tools (make, autotools, hwloc, gcc-13), torchbuild's venv and
Debian's CUDA 12.4 headers and runtime from the cuda-offline image (nccl: system, as that
profile has): a few minutes, where converting the 8.7 GB cuda-offline image would take ten.

In tests/slow since the integration suite's measured new-machine run: its setup (the two
images, the SIF built by `apptainer build --fakeroot`: about 5 minutes on 2 cores) was the
suite's longest after the real preflights. The integration suite keeps the plugin built by
`invoke comms` in the cuda-offline image (tests/integration/test_comms.py); the apptainer
route's binds, keys and carried libraries are unit-tested with stand-ins (tests/unit/comms/test_comms.py)."""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

import pytest
from helpers import TEST_TORCH, ApptainerNode, set_args, shared_dir

from torchbuild import __version__
from torchbuild.profile.config import resolve
from torchbuild.runtime.apptainer import SIF_COMMS
from torchbuild.runtime.engine import LABEL_PREFIX
from torchbuild.sif.host import definition, ensure_builder, remove_tree, write_oci_layout

pytestmark = [pytest.mark.docker, pytest.mark.apptainer, pytest.mark.slow]

PLUGIN = "1.6.0"  # Derecho's pin; it does not compile against libfabric 2.x
FABRIC_DEBS = "libfabric1 libfabric-dev libibverbs1 librdmacm1 ibverbs-providers libpsm2-2 libpsm-infinipath1"
FABRIC_DEBS += " libnl-3-200 libnl-route-3-200 libnuma1"
TAG = "torchbuild-test/comms-at-site:trixie"
FABRIC_TAG = "torchbuild-test/comms-at-site:fabric"

FABRIC_DOCKERFILE = """\
FROM {base}
# the stand-in site libfabric: bookworm's 1.17 and what it links, as a site prefix (include/, lib/)
RUN echo 'deb http://deb.debian.org/debian bookworm main' > /etc/apt/sources.list.d/bookworm.list \\
 && apt-get -o Acquire::Check-Valid-Until=false update \\
 && mkdir -p /debs /x /site/include /site/lib && cd /debs \\
 && for p in {debs}; do apt-get download "$p/bookworm" || exit 1; done \\
 && for d in /debs/*.deb; do dpkg -x "$d" /x || exit 1; done \\
 && cp -a /x/usr/include/rdma /site/include/ \\
 && cp -a /x/usr/lib/x86_64-linux-gnu/*.so* /x/lib/x86_64-linux-gnu/*.so* /site/lib/ \\
 && cp -a /x/usr/lib/libpsm1/libpsm_infinipath.so.1.16 /site/lib/ \\
 && ln -s libpsm_infinipath.so.1.16 /site/lib/libpsm_infinipath.so.1
"""

DOCKERFILE = """\
FROM {cuda} AS cuda

FROM {base}
RUN apt-get -o Acquire::Check-Valid-Until=false update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
    python3 gcc-13 g++-13 libc6-dev make autoconf automake libtool libhwloc-dev binutils file ccache \\
 && rm -rf /var/lib/apt/lists/*
COPY --from=cuda /usr/include/ /usr/include/
COPY --from=cuda /usr/lib/cuda/ /usr/lib/cuda/
COPY --from=cuda /usr/lib/x86_64-linux-gnu/libcudart.so.12.4.127 /usr/lib/x86_64-linux-gnu/
RUN cd /usr/lib/x86_64-linux-gnu && ln -s libcudart.so.12.4.127 libcudart.so.12 && ln -s libcudart.so.12 libcudart.so
COPY --from=cuda /opt/venv/ /opt/venv/
CMD ["/opt/venv/bin/torchbuild"]
"""


@pytest.fixture(scope="module")
def site(engine, cuda_image, local_base, sid_base, site_certs, ofi_sources, test_cache):
    """(node, root, sets, sif): the node, its shared directory, the profile's --set values and
    the SIF, made from the small image with the definition `invoke sif` writes."""
    cuda_spec, _ = cuda_image
    root = shared_dir(Path(tempfile.mkdtemp(prefix="torchbuild-site-")))
    try:
        context, fabric_context = root / "context", root / "fabric-context"
        context.mkdir()
        fabric_context.mkdir()
        (context / "Dockerfile").write_text(DOCKERFILE.format(cuda=cuda_spec.image_tag, base=local_base))
        (fabric_context / "Dockerfile").write_text(FABRIC_DOCKERFILE.format(base=local_base, debs=FABRIC_DEBS))
        fabric = root / "opt" / "cray" / "libfabric" / "1.15.2.0"  # Cray's layout, under the shared root
        tarball, sha = ofi_sources[PLUGIN]
        source = shared_dir(root / "sources") / tarball.name
        source.write_bytes(tarball.read_bytes())
        sets = [
            TEST_TORCH,
            f"aws_ofi_nccl_version={PLUGIN}",
            f"aws_ofi_nccl_source={source}",
            f"aws_ofi_nccl_sha256={sha}",
            f"libfabric_prefix={fabric}",
            f"cache_dir={shared_dir(root / 'cache')}",
        ]
        spec = resolve("cuda-offline", sets)
        image_labels = {f"{LABEL_PREFIX}.{k}": v for k, v in
                        (("profile", spec.profile), ("arch", spec.arch.value), ("version", __version__))}  # fmt: skip
        t0 = time.monotonic()
        engine.build(context, tag=TAG, labels=image_labels, log=root / "image.log")
        image_s = time.monotonic() - t0
        engine.build(fabric_context, tag=FABRIC_TAG, log=root / "fabric.log")
        # the site's libfabric, out of its image onto the shared file system
        # and one library it links outside its prefix, in the node's own directories (as Cray's
        # libcxi is in /usr/lib64): here a directory the node's environment puts on the loader's path
        host = root / "usr" / "lib64"
        engine.run(FABRIC_TAG, ["sh", "-c", f"mkdir -p {fabric} {host} && cp -a /site/. {fabric}/ "
                                f"&& mv {fabric}/lib/libpsm_infinipath.so.1* {host}/ && chmod -R a+rX {root / 'opt'} {root / 'usr'}"],
                   mounts={str(root): str(root)}, user="0:0", environment={}, workdir="/")  # fmt: skip
        layout = root / "layout"
        write_oci_layout(engine.client.api.get_image(TAG), layout)
        profile_file = root / "cuda-offline.yaml"
        profile_file.write_text("{}\n")
        deffile = root / "site.def"
        text = definition(spec, archive=layout, profile_file=profile_file, image_id="none")
        # as a recipe SIF: no image id, so the comms key has the SIF's own ID
        deffile.write_text(re.sub(r"\n *org\.torchbuild\.sif\.image-id none", "", text))
        for p in [root, *root.rglob("*")]:
            if not p.is_symlink() and not p.is_relative_to(fabric) and not p.is_relative_to(host):
                p.chmod(0o777 if p.is_dir() else 0o666)
        tag = ensure_builder(resolve("cpu", [f"sif_builder_base={sid_base}", *site_certs]), engine)
        node = ApptainerNode(engine, tag, shared_dir(root / "home"), [root])
        sif = root / "site.sif"
        t0 = time.monotonic()
        rc, text = node.run("apptainer", "build", "--fakeroot", str(sif), str(deffile))
        assert rc == 0, text[-4000:]
        print(f"site SIF: image {image_s:.0f} s, SIF {time.monotonic() - t0:.0f} s, {sif.stat().st_size >> 20} MiB")
        yield node, root, sets, sif, fabric
    finally:
        for tag in (TAG, FABRIC_TAG):
            if engine.client.images.list(tag):
                engine.client.images.remove(tag, force=True)
        remove_tree(root)


def _comms(node, root: Path, sets: list[str], sif: Path) -> tuple[int, str]:
    cli = ["env", f"LD_LIBRARY_PATH={root / 'usr' / 'lib64'}", "/opt/venv/bin/python", "-m", "torchbuild", "comms"]
    cli += ["--profile", "cuda-offline", "--in-container", "--engine", "apptainer", "--sif", str(sif)]
    cli += ["--apptainer", "host", "--out", str(root / "out")]
    return node.run(*cli, *set_args(sets))


def test_the_plugin_is_built_at_the_site_in_the_sif_and_bound_in_at_run_time(site):
    node, root, sets, sif, fabric = site
    rc, text = node.run("sh", "-c", "command -v docker dockerd || echo no-docker")
    assert rc == 0 and text.split()[-1] == "no-docker", text

    t0 = time.monotonic()
    rc, text = _comms(node, root, sets, sif)
    first = time.monotonic() - t0
    assert rc == 0, text[-5000:]
    (prefix,) = (root / "cache" / "comms").glob(f"ofi-{PLUGIN}-*")
    m = json.loads((prefix / "torchbuild-comms.json").read_text())
    plugin = m["plugin"]
    assert m["engine"] == "apptainer" and m["nccl"] is None
    assert plugin["version"] == PLUGIN and plugin["libfabric_prefix"] == str(fabric)
    assert plugin["libfabric_version"].startswith("1."), plugin  # bookworm's 1.17
    assert f"--with-libfabric={fabric}" in plugin["configure"]
    assert any(s.startswith("ncclNetPlugin_v") for s in plugin["symbols"]), plugin
    # the site's libfabric and what it links from the site travel with the plugin, the SIF's own
    # system libraries (glibc, libstdc++, libatomic, CUDA's) do not
    deps = {d["name"]: d for d in plugin["deps"]}
    assert {"libfabric.so.1", "libibverbs.so.1", "librdmacm.so.1", "libnl-3.so.200"} <= set(deps), plugin["deps"]
    assert all(d["size"] > 0 for d in deps.values()), plugin["deps"]
    assert all(d["from"].startswith(f"{fabric}/") for n, d in deps.items() if n != "libpsm_infinipath.so.1"), deps
    # what libfabric takes from the node's own directories (not in the SIF) is copied from there
    # into the cache, linked against in the SIF and carried by the plugin like the rest
    (hostlibs,) = (root / "cache" / "hostlibs").iterdir()
    assert "libpsm_infinipath.so.1" in deps and (hostlibs / "libpsm_infinipath.so.1").exists(), deps
    # the host copy holds its closure outside the prefix (libuuid too); the SIF has libuuid, so
    # only what the SIF lacks is linked in and carried
    assert "libfabric takes libpsm_infinipath.so.1, libuuid.so.1 from this host" in text, text[-3000:]
    assert "libfabric links libpsm_infinipath.so.1 from the host (not in this container)" in text, text[-3000:]
    assert "libuuid.so.1" not in deps, deps
    assert not {"libc.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libcudart.so.12"} & set(deps), plugin["deps"]
    assert not [n for n in deps if n.startswith(("libcuda.", "libnvidia-"))], plugin["deps"]
    carried = sorted(p.name for p in (prefix / "deps" / "lib").iterdir())
    assert set(deps) <= set(carried) and (prefix / "deps" / "lib" / "libfabric.so.1").is_symlink(), carried
    binds = re.search(r"apptainer exec --bind (\S+) ", text)
    assert binds, text[-2000:]
    runtime = binds[1].strip("'")
    assert runtime == f"{prefix}:{SIF_COMMS}:ro,{fabric}:{fabric}:ro"

    t0 = time.monotonic()
    rc, again = _comms(node, root, sets, sif)
    assert rc == 0 and "is up to date" in again and "aws-ofi-nccl configure" not in again, again[-3000:]
    assert [p.name for p in (root / "cache" / "comms").iterdir()] == [prefix.name]
    print(f"aws-ofi-nccl {PLUGIN} against libfabric {plugin['libfabric_version']} in the SIF: {first:.0f} s, "
          f"{plugin['size_bytes'] >> 10} KiB; rerun {time.monotonic() - t0:.1f} s; deps/lib: {', '.join(sorted(deps))}")  # fmt: skip

    # run time: the SIF's %environment finds what is bound, and the plugin NCCL would load dlopens
    probe = (
        "import ctypes, os; p = os.environ['NCCL_NET_PLUGIN']; lib = ctypes.CDLL(p); "
        "print(p, [s for s in (f'ncclNetPlugin_v{v}' for v in range(2, 10)) if hasattr(lib, s)], "
        "':'.join(os.environ['LD_LIBRARY_PATH'].split(':')[:2]))"
    )
    rc, text = node.run("apptainer", "exec", "--bind", runtime, str(sif), "python3", "-c", probe)
    assert rc == 0, text[-3000:]
    assert f"{SIF_COMMS}/lib/libnccl-net.so [" in text and "ncclNetPlugin_v" in text, text
    assert f"] {SIF_COMMS}/lib:{SIF_COMMS}/deps/lib" in text and "no NCCL and aws-ofi-nccl plugin" not in text, text
    # the site's libfabric not there (not bound, nor /tmp, where the test's site is): deps/lib
    # alone loads the plugin
    alone = probe + f"; print('site-gone' if not os.path.exists({str(fabric)!r}) else 'site-there')"
    rc, text = node.run("apptainer", "exec", "--no-mount", "tmp", "--bind", f"{prefix}:{SIF_COMMS}:ro", str(sif),
                        "python3", "-c", alone)  # fmt: skip
    assert rc == 0 and f"{SIF_COMMS}/lib/libnccl-net.so [" in text and "ncclNetPlugin_v" in text, text[-3000:]
    assert text.strip().endswith("site-gone"), text[-3000:]

    # without the binds: a line on stderr says what to bind, and the plugin named is not there
    rc, text = node.run("apptainer", "exec", str(sif), "sh", "-c", 'test -e "$NCCL_NET_PLUGIN" || echo missing')
    assert rc == 0 and "no NCCL and aws-ofi-nccl plugin at /opt/torchbuild/comms" in text, text
    assert text.strip().endswith("missing") and f"{fabric}:{fabric}:ro" in text, text
