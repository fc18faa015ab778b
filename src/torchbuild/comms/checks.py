"""The profile's checks of the comms keys (nccl, nccl_version, aws_ofi_nccl_*, libfabric_prefix)
against what comms knows: the known-bad combinations and the plugin's build needs (table.py),
the archs an NCCL release can target (nccl_arch.py). profile/config.py runs `check` among its
rules that involve more than one key (its COMMS_CHECK slot, filled by torchbuild.tasks:
the profile layer may not import a feature), so `invoke config`, `invoke comms` and the build
refuse a profile before anything is fetched or built."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchbuild.comms import table
from torchbuild.comms.nccl_arch import nccl_cannot_target
from torchbuild.core import glibc
from torchbuild.core.arch import Arch
from torchbuild.profile.config import fail

# the plugin's configure options comms/step.py passes itself (aws_ofi_nccl_configure may not)
PLUGIN_CONFIGURE_OWN = ("--prefix", "--with-libfabric", "--with-cuda", "--disable-tests", "--disable-platform-aws")


def check(values: Mapping[str, Any], where: Mapping[str, str], arch: Arch) -> None:
    """The comms keys against each other, the CUDA build and the tables; the first problem is a
    ProfileError naming where its key was set."""
    _check_nccl(values, where)
    _check_known_bad(values, where, arch)
    _check_plugin_build(values, where)


def _check_nccl(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    cuda = bool(values["cuda_version"])
    if "nccl" in values["distributed"] and not cuda:
        fail(where, "distributed", "nccl needs a CUDA build", "drop nccl from distributed or set cuda_version")
    if values["nccl"] != "bundled" and "nccl" not in values["distributed"]:
        fail(where, "nccl", f"{values['nccl']}, but nccl is not in distributed", "add nccl to distributed")
    for key in ("nccl_source", "nccl_sha256"):
        if values[key] and values["nccl"] != "source":
            problem = f"only applies with nccl: source (nccl is {values['nccl']})"
            fail(where, key, problem, f"set nccl: source or remove {key}")
    plugin = values["aws_ofi_nccl_version"]
    for key in ("aws_ofi_nccl_source", "aws_ofi_nccl_sha256", "aws_ofi_nccl_configure", "libfabric_prefix"):
        if values[key] and not plugin:
            problem = "set, but aws_ofi_nccl_version is empty (no plugin is built)"
            fail(where, key, problem, "set aws_ofi_nccl_version, e.g. 1.17.1")
    taken = sorted({o.split("=", 1)[0] for o in values["aws_ofi_nccl_configure"]} & set(PLUGIN_CONFIGURE_OWN))
    if taken:
        problem = f"{', '.join(taken)} is passed by torchbuild itself"
        fail(where, "aws_ofi_nccl_configure", problem, "leave it out (libfabric_prefix and cuda_home set them)")
    if plugin and "nccl" not in values["distributed"]:
        fail(where, "aws_ofi_nccl_version", "the NCCL plugin needs nccl in distributed", "add nccl to distributed")
    if values["nccl"] == "source":
        bad = nccl_cannot_target(values["nccl_version"], values["cuda_arch_list"])
        if bad:
            fail(where, "nccl_version", bad, "choose a newer nccl_version, or drop that arch from cuda_arch_list")


def _comms_of(values: Mapping[str, Any], arch: Arch) -> table.Stack:
    """What the profile says of its NCCL, plugin and libfabric, as the known-bad table reads it."""
    return table.Stack(
        nccl=values["nccl_version"] if values["nccl"] == "source" else "",
        plugin=values["aws_ofi_nccl_version"],
        libfabric=table.libfabric_of_prefix(values["libfabric_prefix"]),
        arch=arch.value,
        cuda_arch_list=tuple(values["cuda_arch_list"]),
        runtime_env=values["runtime_env"],
    )


def _stack_text(entry: table.KnownBad, stack: table.Stack) -> str:
    """The parts of the profile's stack the entry is about: "NCCL 2.29.2-1 on aarch64"."""
    parts = [f"NCCL {stack.nccl}"] if entry.nccl else []
    parts += [f"aws-ofi-nccl {stack.plugin}"] if entry.plugin else []
    parts += [f"libfabric {stack.libfabric}"] if entry.libfabric else []
    text = " with ".join(parts)
    if entry.arch:
        text += f" on {entry.arch}"
    if entry.gpus:
        text += f" for sm_{'/'.join(entry.gpus)}x (cuda_arch_list)"
    return text


def _check_known_bad(values: Mapping[str, Any], where: Mapping[str, str], arch: Arch) -> None:
    """A combination table.KNOWN_BAD names (it builds, then hangs or corrupts at run time):
    refused here, so `invoke config`, `invoke comms` and the build stop before anything is fetched."""
    stack = _comms_of(values, arch)
    entry = table.known_bad(stack)
    if entry is None:
        return
    problem = f"{_stack_text(entry, stack)} is known-bad ({entry.name}): {entry.reason}; see {entry.source}"
    if entry.unless_no_ll128:
        problem += " (runtime_env sets neither NCCL_PROTO without LL128 nor NCCL_LL128_C2C=0)"
    fail(where, entry.key, problem, entry.instead)


def _check_plugin_build(values: Mapping[str, Any], where: Mapping[str, str]) -> None:
    """What the plugin's configure requires that the profile shows: a libfabric_prefix naming an
    older libfabric than it accepts, a GCC (compiler_version, else the known base's) older than
    its C++ standard needs. Found here, not after the download, in autogen and configure."""
    plugin = values["aws_ofi_nccl_version"]
    if not plugin:
        return
    prefix, low = values["libfabric_prefix"], table.plugin_libfabric_min(plugin)
    found = table.libfabric_of_prefix(prefix)
    if table.older(found, low):
        problem = (
            f"{prefix} is libfabric {found}; aws-ofi-nccl {plugin}'s configure needs libfabric >= {low} "
            f"({table.PLUGIN_LIBFABRIC_SOURCE})"
        )
        fail(where, "libfabric_prefix", problem, f"point libfabric_prefix at a libfabric {low} or newer")
    std, gcc_min = table.plugin_cxx(plugin)
    key = "compiler_version" if values["compiler_version"] else "base_image"
    gcc = str(values["compiler_version"]) or glibc.base_gcc(values["base_image"])
    if values["compiler"] == "gcc" and table.older(gcc, gcc_min):
        of = "" if key == "compiler_version" else f" (the gcc of {values['base_image']})"
        problem = f"GCC {gcc}{of} is older than aws-ofi-nccl {plugin} needs: C++{std}, GCC >= {gcc_min}"
        hint = f"set compiler_version to {gcc_min} or newer where the base has it, or a newer base_image"
        older_plugin = "; or aws_ofi_nccl_version 1.20.0, the last that needs only C++17" if std == "20" else ""
        fail(where, key, problem, hint + older_plugin)
