"""A native `invoke install` of a wheel built with the NCCL and plugin of `invoke comms`, run for
real with stand-ins compiled here: a libnccl.so.2 (soname, ncclGetVersion), a net plugin
exporting ncclNetPlugin_v8, and a `torch` whose import loads libnccl.so.2 by its soname as
libtorch_cuda's DT_NEEDED does. The install copies the comms prefix into the environment,
puts it first on LD_LIBRARY_PATH, sets NCCL_NET_PLUGIN (activate, Lmod, Tcl), proves what
torch loads, and undoes itself when that is not the prefix's NCCL. Also the check's logic
(loaded_problems) and the modulefile and activate text."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from torchbuild.install.modulefiles import ModuleInfo, add_activate_hook, lua_modulefile, tcl_modulefile
from torchbuild.profile.config import resolve
from torchbuild.runtime import manifest as mf
from torchbuild.runtime.environment import comms_install_env
from torchbuild.runtime.libraries import loaded_problems, net_plugin_symbols
from torchbuild.runtime.manifest import INSTALL_MANIFEST, read_install

TORCHBUILD = Path(sys.executable).with_name("torchbuild")
PYVER = f"{sys.version_info[0]}.{sys.version_info[1]}"
TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}-none-any"
needs_cc = pytest.mark.skipif(
    shutil.which("cc") is None or shutil.which(f"python{PYVER}") is None,
    reason=f"needs a C compiler and python{PYVER} on PATH",
)

COMMS = {
    "key": "k" * 64,
    "nccl": {"version": "2.22.3-1", "library": "lib/libnccl.so.2.22.3"},
    "plugin": {"version": "1.17.1", "library": "lib/libnccl-net-ofi.so"},
}

# --------------------------------------------------------------------------- the check's logic and the text


def test_comms_install_env_puts_nccls_then_the_plugins_lib_first_and_names_the_plugin():
    assert comms_install_env("/p/comms", COMMS) == (
        ["/p/comms/lib"],
        {"NCCL_NET_PLUGIN": "/p/comms/lib/libnccl-net-ofi.so"},
    )
    apart = {**COMMS, "plugin": {"library": "plugin/lib/libnccl-net.so"}}
    assert comms_install_env("/p", apart) == (
        ["/p/lib", "/p/plugin/lib"],
        {"NCCL_NET_PLUGIN": "/p/plugin/lib/libnccl-net.so"},
    )
    assert comms_install_env("/p", {**COMMS, "plugin": None}) == (["/p/lib"], {})  # NCCL alone: no plugin to name


def test_loaded_problems_compares_real_paths_and_names_each_failure(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnccl.so.2.22.3").write_bytes(b"")
    (lib / "libnccl.so.2").symlink_to("libnccl.so.2.22.3")
    (lib / "libnccl-net-ofi.so").write_bytes(b"")
    nccl, plugin = lib / "libnccl.so.2.22.3", lib / "libnccl-net-ofi.so"
    good_plugin = {"name": str(plugin), "path": str(plugin), "symbols": ["ncclNetPlugin_v8"]}
    # the loader maps the soname's link target: the same file
    assert loaded_problems({"nccl": [str(lib / "libnccl.so.2")], "plugin": good_plugin}, nccl, plugin) == []
    system = "/usr/lib/x86_64-linux-gnu/libnccl.so.2.22.3"
    (other,) = loaded_problems({"nccl": [system], "plugin": good_plugin}, nccl, plugin)
    assert other == f"torch loaded {system}, not {nccl}"
    (none,) = loaded_problems({"nccl": [], "plugin": good_plugin}, nccl, plugin)
    assert none.startswith("torch loaded no libnccl at all")
    unopened = {"name": "libnccl-net.so", "path": "", "symbols": [], "error": "libnccl-net.so: cannot open"}
    (cannot,) = loaded_problems({"nccl": [str(nccl)], "plugin": unopened}, nccl, plugin)
    assert "(libnccl-net.so) cannot be opened: libnccl-net.so: cannot open" in cannot
    bare = {**good_plugin, "symbols": []}
    assert loaded_problems({"nccl": [str(nccl)], "plugin": bare}, nccl, plugin) == [
        f"the net plugin {plugin} exports no ncclNetPlugin_v* symbol"
    ]
    elsewhere = {**good_plugin, "path": "/opt/x/libnccl-net.so"}
    assert "not " + str(plugin) in loaded_problems({"nccl": [str(nccl)], "plugin": elsewhere}, nccl, plugin)[0]
    assert loaded_problems({"error": "import torch failed: x"}, nccl, plugin) == ["import torch failed: x"]
    assert loaded_problems({"nccl": []}, None, None) == []  # nothing asked, nothing wrong
    assert net_plugin_symbols()[0] == "ncclNetPlugin_v2" and "ncclNetPlugin_v8" in net_plugin_symbols()


PREPEND = {"LD_LIBRARY_PATH": ["/e/comms/lib", "/e/comms/plugin lib"]}
ENV = {"NCCL_NET_PLUGIN": "/e/comms/lib/libnccl-net-ofi.so", "NCCL_NET": "AWS Libfabric"}


def test_modulefiles_put_the_comms_dirs_first_in_order_and_quote_them():
    info = ModuleInfo(name="torch", version="2.6.0", prefix="/e", env=ENV, prepend=PREPEND)
    lua = lua_modulefile(info).splitlines()
    # each prepend_path goes in front: the last directory is written first
    assert lua[-2:] == [
        'prepend_path("LD_LIBRARY_PATH", "/e/comms/plugin lib")',
        'prepend_path("LD_LIBRARY_PATH", "/e/comms/lib")',
    ]
    assert 'pushenv("NCCL_NET_PLUGIN", "/e/comms/lib/libnccl-net-ofi.so")' in lua
    tcl = tcl_modulefile(info).splitlines()
    assert tcl[-2:] == [
        'prepend-path "LD_LIBRARY_PATH" "/e/comms/plugin lib"',
        'prepend-path "LD_LIBRARY_PATH" "/e/comms/lib"',
    ]
    assert 'pushenv "NCCL_NET_PLUGIN" "/e/comms/lib/libnccl-net-ofi.so"' in tcl


def test_activate_puts_the_comms_dirs_first_and_deactivate_restores_the_old_path(tmp_path):
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    activate = venv / "bin" / "activate"
    activate.write_text(add_activate_hook(activate.read_text(), ENV, PREPEND))
    script = f'. {activate}; printf "%s\\0" "$LD_LIBRARY_PATH" "$NCCL_NET_PLUGIN"; deactivate; '
    script += 'printf "%s\\0" "${LD_LIBRARY_PATH-unset}" "${NCCL_NET_PLUGIN-unset}"'
    for before, after in (("/site/lib", "/site/lib"), (None, "unset")):
        env = {"PATH": os.environ["PATH"], **({"LD_LIBRARY_PATH": before} if before else {})}
        out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
        active, plugin, restored, unset = out.split("\0")[:4]
        assert active == "/e/comms/lib:/e/comms/plugin lib" + (f":{before}" if before else "")
        assert plugin == ENV["NCCL_NET_PLUGIN"]
        assert (restored, unset) == (after, "unset")


# --------------------------------------------------------------------------- a real native install


def _cc(source: str, out: Path, *args: str) -> None:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True)
    src.unlink()


def _wheel(directory: Path) -> Path:
    """torch 2.6.0+comms: its import opens libnccl.so.2 by soname, as libtorch_cuda's DT_NEEDED does."""
    files = {
        "torch/__init__.py": '__version__ = "2.6.0+comms"\nimport ctypes\nctypes.CDLL("libnccl.so.2")\n',
        "torch-2.6.0+comms.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.6.0+comms\n",
        "torch-2.6.0+comms.dist-info/WHEEL": f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {TAG}\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files["torch-2.6.0+comms.dist-info/RECORD"] = "\n".join([*record, "torch-2.6.0+comms.dist-info/RECORD,,"]) + "\n"
    directory.mkdir(parents=True)
    wheel = directory / f"torch-2.6.0+comms-{TAG}.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def _site(tmp: Path) -> tuple[Path, Path]:
    """(a comms prefix with the stand-ins and its torchbuild-comms.json, the torch wheel whose manifest records it)."""
    prefix = tmp / "cache" / "comms" / "nccl-2.22.3-1-ofi-1.17.1-kkkk"
    lib = prefix / "lib"
    lib.mkdir(parents=True)
    nccl = "int ncclGetVersion(int *v) { *v = 22203; return 0; }\n"
    _cc(nccl, lib / "libnccl.so.2.22.3", "-Wl,-soname,libnccl.so.2")
    (lib / "libnccl.so.2").symlink_to("libnccl.so.2.22.3")
    _cc('struct { const char *name; } ncclNetPlugin_v8 = { "stand-in" };\n', lib / "libnccl-net-ofi.so")
    (prefix / "torchbuild-comms.json").write_text(json.dumps({**COMMS, "prefix": str(prefix)}))
    wheel = _wheel(tmp / "wheels")
    record = {"prefix": str(prefix), "key": COMMS["key"]}
    built = mf.for_build(
        resolve("cpu"), run_id="0123456789ab", provenance={"engine": "native", "comms": record},
        toolchain={"cc": "gcc"}, environment={}, jobs={"max_jobs": 1, "final_jobs": 1, "reason": "test"},
        started="2025-01-01T00:00:00+00:00", finished="2025-01-01T01:00:00+00:00", seconds=1.0,
        ccache=(0, 0, 0.0), log="build.log", report=None, wheel=wheel,
    )  # fmt: skip
    mf.write(built, Path(f"{wheel}{mf.SUFFIX}"))
    return prefix, wheel


def _install(
    tmp: Path, wheel: Path, prefix: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    run_env = {k: v for k, v in (env or os.environ).items() if not k.startswith("PIP_")}
    run_env["PIP_CONFIG_FILE"] = os.devnull
    args = [str(TORCHBUILD), "install", "--prefix", str(prefix), "--wheel", str(wheel), "--out", str(tmp / "out")]
    args += ["--set", f"python_version={PYVER}", "--set", f"cache_dir={tmp / 'cache'}", "--no-index"]
    args += ["--set", 'runtime_env={NCCL_NET: "AWS Libfabric"}']
    return subprocess.run(args, cwd=tmp, env=run_env, capture_output=True, text=True, timeout=300, check=False)


@needs_cc
def test_install_carries_the_comms_stack_and_proves_torch_loads_it(tmp_path):
    comms, wheel = _site(tmp_path)
    env = tmp_path / "env"
    done = _install(tmp_path, wheel, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    carried = env / "comms"
    m = read_install(env / INSTALL_MANIFEST)
    assert m.comms is not None and m.comms.copied and m.comms.source == str(comms)
    assert m.comms.prefix == str(carried) and m.comms.ld_library_path == (str(carried / "lib"),)
    assert m.comms.net_plugin == str(carried / "lib" / "libnccl-net-ofi.so")
    assert m.comms.nccl_loaded == str(carried / "lib" / "libnccl.so.2.22.3")
    assert m.comms.plugin_symbols == ("ncclNetPlugin_v8",)
    assert f"torch loads {carried}/lib/libnccl.so.2.22.3" in done.stdout
    # the environment no longer needs the build cache: it runs with the cache gone
    shutil.rmtree(tmp_path / "cache")
    probe = "import torch, os; print([l.split()[-1] for l in open('/proc/self/maps') if 'libnccl.so' in l][0])"
    shell = f'. {env}/bin/activate && python -c "{probe}" && echo "$NCCL_NET_PLUGIN|$NCCL_NET"'
    out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [str(carried / "lib" / "libnccl.so.2.22.3"), f"{m.comms.net_plugin}|AWS Libfabric"]
    lua = (env / m.modulefiles[0]).read_text()
    assert f'prepend_path("LD_LIBRARY_PATH", "{carried}/lib")' in lua
    assert f'pushenv("NCCL_NET_PLUGIN", "{m.comms.net_plugin}")' in lua


@needs_cc
def test_a_comms_prefix_whose_nccl_torch_does_not_load_fails_the_install_and_leaves_nothing(tmp_path):
    """The prefix's libnccl.so.2 link removed: the loader finds another libnccl.so.2 first (one
    on the caller's LD_LIBRARY_PATH), torch imports, and the check names the mismatch."""
    comms, wheel = _site(tmp_path)
    (comms / "lib" / "libnccl.so.2").unlink()
    decoy = tmp_path / "system"
    decoy.mkdir()
    _cc("int ncclGetVersion(int *v) { *v = 22105; return 0; }\n", decoy / "libnccl.so.2")
    env = tmp_path / "env"
    done = _install(tmp_path, wheel, env, {**os.environ, "LD_LIBRARY_PATH": str(decoy)})
    assert done.returncode == 22, done.stdout[-3000:] + done.stderr
    assert "error: InstallFailed" in done.stderr and "Traceback" not in done.stdout + done.stderr
    assert f"torch loaded {decoy / 'libnccl.so.2'}, not {env}/comms/lib/libnccl.so.2.22.3" in done.stderr
    assert not env.exists() and not (tmp_path / "out").exists()  # nor the --out it made (issue 41 item 18)


@needs_cc
def test_a_comms_prefix_gone_from_the_cache_is_refused_before_anything_is_made(tmp_path):
    comms, wheel = _site(tmp_path)
    (comms / "lib" / "libnccl-net-ofi.so").unlink()
    env = tmp_path / "env"
    done = _install(tmp_path, wheel, env)
    assert done.returncode == 24 and "error: CommsFailed" in done.stderr, done.stdout[-3000:] + done.stderr
    assert "libnccl-net-ofi.so (plugin of `invoke comms`) is missing" in done.stderr
    shutil.rmtree(comms)
    done = _install(tmp_path, wheel, env)
    assert done.returncode == 24 and "which is not there any more" in done.stderr
    assert not env.exists()
