"""NCCL, aws-ofi-nccl and libfabric: the combinations known to be bad, each with its reason and
its source, and what the plugin's build needs (no imports from the rest of torchbuild: config
refuses profiles against it, `invoke config` and `invoke comms` alike, before anything is
fetched or built).

Only combinations a public source names are here, and only as far as a profile says what is
built: torchbuild knows the NCCL release when it builds it (nccl: source, nccl_version), not
PyTorch's bundled copy or the site's; it knows the plugin release (aws_ofi_nccl_version) and
where that plugin runs (arch, cuda_arch_list); it knows libfabric's release at config only where
libfabric_prefix names it (Cray's /opt/cray/libfabric/1.15.2.0), and reads it from rdma/fabric.h
at `invoke comms`.

Sources (checked 2026-11-28): the NVIDIA/nccl and aws/aws-ofi-nccl issues named per entry; the
NCCL sources at their tags (src/proxy.cc, src/graph/tuning.cc); aws-ofi-nccl's configure.ac,
m4/ax_cxx_compile_stdcxx.m4, m4/check_pkg_libfabric.m4 and RELEASENOTES.md at v1.14.0-v1.21.1.
The table is data, kept by hand as torch_lines and companion_table are: no package or API
publishes it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

_NUMBERS = re.compile(r"\d+")


def version_tuple(version: str) -> tuple[int, ...]:
    """(2, 28, 9, 1) of NCCL's "2.28.9-1", (1, 17, 1) of "1.17.1", (1, 15, 2, 0) of "1.15.2.0"."""
    return tuple(int(n) for n in _NUMBERS.findall(version))


@dataclasses.dataclass(frozen=True)
class Range:
    """Releases from `low` (inclusive) to `below` (exclusive); '' leaves that end open."""

    low: str = ""
    below: str = ""

    def has(self, version: str) -> bool:
        v = version_tuple(version)
        if not v:
            return False
        return (not self.low or v >= version_tuple(self.low)) and (not self.below or v < version_tuple(self.below))


@dataclasses.dataclass(frozen=True)
class KnownBad:
    """A combination that builds but fails at run time. None: the entry does not look at that part
    (any NCCL, with or without a plugin...); a Range: the profile's release must be in it, and a
    profile that does not say (no nccl: source, no plugin) does not match."""

    name: str
    reason: str  # one line: what goes wrong
    source: str  # the URL that shows it
    instead: str  # what to do: the fixed release, or the runtime setting
    key: str  # the profile key the fix changes (named in the error)
    nccl: Range | None = None
    plugin: Range | None = None
    libfabric: Range | None = None
    arch: str = ""  # "aarch64": only there; "": any
    gpus: tuple[str, ...] = ()  # cuda_arch_list majors ("9" is 9.0 and 9.0a); (): any
    # a runtime fault the profile's runtime_env can avoid: NCCL without LL128 over C2C
    unless_no_ll128: bool = False


KNOWN_BAD: tuple[KnownBad, ...] = (
    KnownBad(
        # src/proxy.cc of v2.28.9-1 and v2.29.2-1 retries a weak CAS on the wrong condition; v2.29.3-1
        # retries on the CAS result ("Fixed CAS usage in case of weak failure which was causing a hang
        # on ARM", its release notes, which add "when compiled with gcc versions prior to 10"; the
        # bisect in the issue does not say which gcc, so every aarch64 build is refused)
        name="nccl-2.28.9-aarch64-hang",
        reason="NCCL 2.28.9-1 to 2.29.2-1 leak proxy operations on aarch64 (Grace: GH200, GB200) and hang "
        "silently (a weak compare-and-swap retried on the wrong condition)",
        source="https://github.com/NVIDIA/nccl/issues/2353",
        instead="set nccl_version to 2.29.3-1 or newer (the fix), or 2.28.7-1",
        key="nccl_version",
        nccl=Range("2.28.9", "2.29.3"),
        arch="aarch64",
    ),
    KnownBad(
        # reported with the plugin's main branch between v1.17.2 and v1.18.0 (~1.17.x) on EFA, NCCL
        # 2.27.7 working; closed without a stated fix. No release before 1.20.0 lists 2.28.9 as
        # tested (1.18 and 1.19 list 2.28.7); 1.20.0's RELEASENOTES.md lists 2.28.9-1
        name="ofi-1.17-nccl-2.28.9-deadlock",
        reason="NCCL 2.28.9-1 with aws-ofi-nccl 1.17.x to 1.19.x deadlocks at the first collective "
        "(reported on EFA with GIN disabled; NCCL 2.27.7 worked)",
        source="https://github.com/aws/aws-ofi-nccl/issues/1055",
        instead="set aws_ofi_nccl_version to 1.20.0 or newer (the first release tested with NCCL 2.28.9-1), "
        "or nccl_version to 2.27.7-1",
        key="aws_ofi_nccl_version",
        nccl=Range("2.28.9", "2.28.10"),
        plugin=Range("1.17.0", "1.20.0"),
    ),
    KnownBad(
        # NCCL 2.27.3 added NCCL_LL128_C2C (default 1): LL128 on Hopper and Blackwell up to the PCIe-C2C
        # path of a GH200's NIC (src/graph/tuning.cc), still the default in 2.30.7; the two halves of a
        # 128-byte line arrive separately over PCIe then C2C (NVIDIA/nccl PR #2053). CSCS sets
        # NCCL_PROTO=^LL128 (docs.cscs.ch/software/communication/nccl). Open: no fixed release.
        name="nccl-2.27-gh200-ll128",
        reason="NCCL 2.27.3-1 and newer use LL128 over GH200's PCIe-to-C2C NIC path by default, which corrupts "
        "collectives (occasional #wrong results) on GH200 with Slingshot; no fixed release yet",
        source="https://github.com/NVIDIA/nccl/issues/2001",
        instead='set NCCL_PROTO: "^LL128" in the profile\'s runtime_env (or --set runtime_env.NCCL_PROTO=^LL128), '
        'as CSCS does, or NCCL_LL128_C2C: "0" there; or nccl_version 2.26.6-1',
        key="nccl_version",
        nccl=Range("2.27.3"),
        plugin=Range(),
        arch="aarch64",
        gpus=("9",),
        unless_no_ll128=True,
    ),
)


@dataclasses.dataclass(frozen=True)
class Stack:
    """What a profile says of its communication stack ('' where it does not say)."""

    nccl: str = ""  # the NCCL release built (nccl: source), else ""
    plugin: str = ""  # aws_ofi_nccl_version
    libfabric: str = ""  # the libfabric release, where known
    arch: str = ""
    cuda_arch_list: Sequence[str] = ()
    runtime_env: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _applies(part: Range | None, version: str) -> bool:
    return part is None or (bool(version) and part.has(version))


def _gpu_matches(entry: KnownBad, cuda_arch_list: Sequence[str]) -> bool:
    majors = {a.split(".", 1)[0] for a in cuda_arch_list}
    return not entry.gpus or bool(majors & set(entry.gpus))


def matches(entry: KnownBad, stack: Stack) -> bool:
    """Whether the profile's stack is the entry's combination (its runtime_env not avoiding it)."""
    return (
        _applies(entry.nccl, stack.nccl)
        and _applies(entry.plugin, stack.plugin)
        and _applies(entry.libfabric, stack.libfabric)
        and (not entry.arch or entry.arch == stack.arch)
        and _gpu_matches(entry, stack.cuda_arch_list)
        and not (entry.unless_no_ll128 and excludes_ll128(stack.runtime_env))
    )


def known_bad(stack: Stack) -> KnownBad | None:
    """The first KNOWN_BAD entry the stack is, None when it is none."""
    return next((entry for entry in KNOWN_BAD if matches(entry, stack)), None)


_NCCL_FUNCTIONS = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce", "sendrecv", "send", "recv")


def excludes_ll128(runtime_env: Mapping[str, str]) -> bool:
    """Whether NCCL, run with these variables, uses no LL128 over C2C: NCCL_LL128_C2C=0 (LL128 then
    stops at PCIe switches, src/graph/tuning.cc), or an NCCL_PROTO whose every entry leaves LL128
    out, read as NCCL's parseList reads it ("^LL128", "LL,Simple", "^LL128;allreduce:^LL,LL128":
    ';' between entries, an optional "function:" before each list but the first, ',' between
    protocols, '^' for all but these, case-insensitive)."""
    if str(runtime_env.get("NCCL_LL128_C2C", "")).strip() == "0":
        return True
    proto = str(runtime_env.get("NCCL_PROTO", ""))
    if not proto:
        return False
    entries = proto.split(";")
    if ":" in entries[0]:  # the first list names one function: the others keep LL128
        return False
    return all(_leaves_out_ll128(entry.split(":", 1)[-1]) for entry in entries)


def _leaves_out_ll128(protocols: str) -> bool:
    negated = protocols.startswith("^")
    named = {p.lower() for p in protocols.removeprefix("^").split(",")}
    return ("ll128" in named) == negated


# --------------------------------------------------------------------------- the plugin's build

# every tag from v1.14.0 to v1.21.1: m4/check_pkg_libfabric.m4 fails "for Libfabric 1.11.0 or
# later" (FI_VERSION_LT(..., FI_VERSION(1,11))); 1.19.0's release notes: "requires at least
# Libfabric v1.11.0" (INSTALL.md asks for 1.18, a recommendation configure does not enforce)
PLUGIN_LIBFABRIC_MIN = ((Range("1.14.0"), "1.11"),)
PLUGIN_LIBFABRIC_SOURCE = "aws-ofi-nccl m4/check_pkg_libfabric.m4 (v1.14.0-v1.21.1)"

# configure.ac's AX_CXX_COMPILE_STDCXX([17|20], [noext], [mandatory]): C++17 from 1.15.0 (the port
# from C), C++20 from 1.21.0 (commit a615420c "c++: Require c++20 in the plugin"). The macro's
# test fails below __cplusplus 201703L / 202002L: GCC 7 is the first with 201703L for -std=c++17,
# GCC 11 the first with 202002L for -std=c++20 (GCC 8-10 give 201709L)
PLUGIN_CXX = ((Range("1.21.0"), "20", "11"), (Range("1.15.0", "1.21.0"), "17", "7"))


def plugin_libfabric_min(plugin: str) -> str:
    """The oldest libfabric (major.minor) the plugin's configure accepts, '' where not known."""
    return next((low for span, low in PLUGIN_LIBFABRIC_MIN if plugin and span.has(plugin)), "")


def plugin_cxx(plugin: str) -> tuple[str, str]:
    """(C++ standard, oldest GCC) the plugin's configure requires, ('', '') for a C plugin (< 1.15)."""
    return next(((std, gcc) for span, std, gcc in PLUGIN_CXX if plugin and span.has(plugin)), ("", ""))


# a prefix that names its release: Cray's /opt/cray/libfabric/1.15.2.0, a spack-like
# /opt/libfabric-2.1.0 (the release right after a component named libfabric, or in it)
_PREFIX_RELEASE = re.compile(r"(?:^|/)libfabric[/-](\d+\.\d+(?:\.\d+)*)(?:/|$)")


def libfabric_of_prefix(prefix: str) -> str:
    """The libfabric release libfabric_prefix's path names ("1.15.2.0"), '' when it names none."""
    found = _PREFIX_RELEASE.search(prefix.rstrip("/"))
    return found[1] if found else ""


def older(found: str, floor: str) -> bool:
    return bool(found and floor) and version_tuple(found) < version_tuple(floor)
