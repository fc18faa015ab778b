"""Which NCCL and which net plugin a process that imports torch really gets.

Run by file path in the interpreter under test (it imports nothing from torchbuild), with the
environment the install gives its users: `python ncclprobe.py SYMBOL ...` imports torch, so the
libnccl its libraries link is the one the dynamic loader picks, and reads /proc/self/maps for the
libnccl files mapped. It then opens the net plugin the way NCCL does (NCCL_NET_PLUGIN as given,
then libnccl-net-<NCCL_NET_PLUGIN>.so; libnccl-net.so when unset), and looks up each SYMBOL in it
(dlsym: the ncclNetPlugin_v* NCCL asks for). One JSON line:
{"nccl": [mapped paths], "plugin": {"name": tried, "path": mapped path, "symbols": [...],
"error": why}}; exit 3 when torch cannot be imported.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import re
import sys
from typing import Any

NCCL = re.compile(r"/libnccl\.so(\.\d+)*$")


def mapped(pattern: re.Pattern[str]) -> list[str]:
    """The files mapped into this process whose path matches pattern (the kernel's own, resolved paths)."""
    found: list[str] = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split(maxsplit=5)
            path = parts[5].strip() if len(parts) == 6 else ""
            if path.startswith("/") and pattern.search(path) and path not in found:
                found.append(path)
    return found


def plugin_names(env: dict[str, str]) -> list[str]:
    """The names NCCL dlopens for its net plugin, in its order (NCCL 2.21, 2.22: net.cc)."""
    name = env.get("NCCL_NET_PLUGIN", "")
    if not name:
        return ["libnccl-net.so"]
    return [name, f"libnccl-net-{name}.so"]


def open_plugin(symbols: list[str]) -> dict[str, Any]:
    """The plugin as NCCL would open it: which name loaded, the file mapped, the symbols found."""
    errors = []
    for name in plugin_names(dict(os.environ)):
        before = set(mapped(re.compile(r"\.so")))
        try:
            lib = ctypes.CDLL(name, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            errors.append(str(exc))
            continue
        new = [p for p in mapped(re.compile(r"\.so")) if p not in before]
        base = os.path.basename(name)
        path = os.path.realpath(name) if os.sep in name else next((p for p in new if os.path.basename(p) == base), "")
        found = [s for s in symbols if hasattr(lib, s)]
        return {"name": name, "path": path or (new[0] if new else ""), "symbols": found}
    return {"name": plugin_names(dict(os.environ))[0], "path": "", "symbols": [], "error": "; ".join(errors)}


def main(argv: list[str]) -> int:
    try:
        importlib.import_module("torch")  # loads libtorch_cuda and the libnccl it links
    except Exception as exc:  # any failure to import is the answer
        print(json.dumps({"error": f"import torch failed: {exc}"}))
        return 3
    print(json.dumps({"nccl": mapped(NCCL), "plugin": open_plugin(argv)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
