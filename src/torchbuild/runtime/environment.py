"""The environment a PyTorch build sees, computed once from the BuildSpec, for each backend.

`build_env` is the whole of it: the variables the backend sets when it starts the step
(`launch_env`: HOME in the cache and git's safe.directory in a container) and the build's own
(compilers, CUDA, BLAS, distributed, flags, ccache and pip caches, the profile's switches and
env). The build, the SIF's %environment and `invoke config` all call it, so what is printed is
what the build gets. The image sets no build variable of its own.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torchbuild.core.process import run_captured
from torchbuild.profile import remote_cache
from torchbuild.profile.config import BuildSpec
from torchbuild.runtime.jobs import JobPlan

# PyTorch's BLAS variable (cmake/Dependencies.cmake) for each blas choice
BLAS_NAMES = {
    "mkl": "MKL",
    "openblas": "OpenBLAS",
    "nvpl": "NVPL",
    "blis": "BLIS",
    "eigen": "Eigen",
    "generic": "Generic",
}

CCACHE_SLOPPINESS = "pch_defines,time_macros,include_file_mtime,include_file_ctime"


def compilers(spec: BuildSpec) -> tuple[str, str]:
    """(CC, CXX) executable names of the profile's compiler family (compiler, compiler_version):
    what the image installs. The build runs compiler_commands, which the compilers key may change."""
    suffix = f"-{spec.compiler_version}" if spec.compiler_version else ""
    if spec.compiler == "clang":
        return f"clang{suffix}", f"clang++{suffix}"
    return f"gcc{suffix}", f"g++{suffix}"


def compiler_commands(spec: BuildSpec, backend: str = "native") -> dict[str, str]:
    """CC, CXX (and FC when the profile names one) as the build runs them: natively the profile's
    compilers key ({cc: cc, cxx: CC, fc: ftn} for Cray's wrappers), each role it leaves out
    from the compiler family; in the image or the SIF the family's, which the image installs
    (the site's wrappers, like its modules, exist on its own nodes only)."""
    cc, cxx = compilers(spec)
    if backend != "native":
        return {"CC": cc, "CXX": cxx}
    chosen = {"CC": spec.compilers.get("cc", cc), "CXX": spec.compilers.get("cxx", cxx)}
    if "fc" in spec.compilers:
        chosen["FC"] = spec.compilers["fc"]
    return chosen


def _flag(on: bool) -> str:
    return "1" if on else "0"


BACKENDS = ("native", "docker", "apptainer")


def launch_env(backend: str, cache_root: str) -> dict[str, str]:
    """What a backend sets when it starts a step: unbuffered output everywhere; in a container
    HOME inside the cache (the image has no home for the caller's uid) and git's safe.directory
    (the tree belongs to the caller, not to the container's user table)."""
    env = {"PYTHONUNBUFFERED": "1"}
    if backend != "native":
        env.update(
            {
                "HOME": f"{cache_root}/home",
                "GIT_CONFIG_COUNT": "1",
                "GIT_CONFIG_KEY_0": "safe.directory",
                "GIT_CONFIG_VALUE_0": "*",
            }
        )
    return env


def allocation_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The batch allocation's variables (cores, memory, job id) a container is started with:
    the planner inside sees the node, and must keep to the job's share of it."""
    from torchbuild.runtime.jobs import ALLOCATION_ENV

    env = os.environ if environ is None else environ
    return {k: env[k] for k in ALLOCATION_ENV if env.get(k)}


def build_env(
    spec: BuildSpec,
    *,
    cache_root: str,
    jobs: int,
    nvcc_threads: int | None = None,
    backend: str = "native",
    cuda: str = "",
) -> dict[str, str]:
    """Every variable the build sees beyond the runtime's own, in the order they are printed.

    ``cache_root`` is where the cache directory is seen by the build (``/cache`` in the image or
    the SIF, the host cache_dir natively); ``jobs`` and ``nvcc_threads`` come from the jobs
    planner (None: the profile's nvcc_threads); ``cuda``: CUDA_HOME as the host chose it
    (cuda_home()), "": chosen here.
    """
    home = cuda or cuda_home(spec, backend)[0]
    return {**launch_env(backend, cache_root), **_compile_env(spec, cache_root, jobs, nvcc_threads, backend, home)}


def profile_sets(spec: BuildSpec, key: str) -> bool:
    """Whether the profile asked for sets key itself (in its own file, or --set), rather than
    leaving it to defaults.yaml or a profile it extends. A spec rebuilt from a step's request
    carries no origins: its values are taken as set (the host decided before handing it over)."""
    origin = spec.origins.get(key)
    if origin is None:
        return True
    own = spec.origins.get("profile", "")
    return origin == "--set" or (bool(own) and origin.rsplit(":", 1)[0] == own)


def cuda_home(
    spec: BuildSpec, backend: str = "native", which: Callable[[str], str | None] | None = None
) -> tuple[str, str]:
    """(CUDA_HOME, where it came from). In an image or SIF, the profile's cuda_home (where the
    image has CUDA). Natively, the CUDA loaded here (a module's: the directory above the `bin/`
    of the `nvcc` on PATH) unless the profile sets cuda_home itself; the profile's when there is
    no nvcc on PATH. A profile that only inherits /usr/local/cuda (from cuda.yaml or the defaults)
    does not overwrite what `module load cuda` set."""
    if backend != "native" or not spec.cuda:
        return spec.cuda_home, "the profile's cuda_home"
    if profile_sets(spec, "cuda_home"):
        return spec.cuda_home, f"cuda_home ({spec.origins.get('cuda_home', 'the profile')})"
    nvcc = (which or shutil.which)("nvcc")
    if nvcc and Path(nvcc).parent.name == "bin":
        return str(Path(nvcc).parent.parent), f"nvcc on PATH ({nvcc})"
    return spec.cuda_home, "the profile's cuda_home (no nvcc on PATH)"


def ccache_launcher(backend: str, which: Callable[[str], str | None] | None = None) -> bool:
    """Whether the build compiles through ccache: always in the image and the SIF (they install
    it); natively only where `ccache` is on PATH (a login node may have none)."""
    return backend != "native" or (which or shutil.which)("ccache") is not None


NO_CCACHE = (
    "torchbuild: warning: no ccache on PATH: compiling without a compiler cache "
    "(load or install ccache to reuse objects across builds)"
)


def jobs_env(jobs: int) -> dict[str, str]:
    """How many compile jobs a step may run, said the same way to every build system: MAX_JOBS
    (PyTorch's setup.py, the companions' and editable trees' extensions) and
    CMAKE_BUILD_PARALLEL_LEVEL (`cmake --build`, the CMake-built extensions). Set from the
    plan, and again with fewer on each out-of-memory resume."""
    return {"MAX_JOBS": str(jobs), "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}


def compile_env(
    spec: BuildSpec,
    plan: JobPlan,
    cache_root: str,
    extra: Mapping[str, str] | None = None,
    *,
    backend: str = "native",
    cuda: str = "",
) -> dict[str, str]:
    """What a compile step sets (torch's build, a companion, an editable tree, NCCL): the
    build's environment for the planned jobs (build_env), jobs_env of the plan, then extra
    (the step's own: NCCL_ROOT, a companion's BUILD_VERSION...), which wins; the profile's env
    values that name ${VAR} filled in where the step runs (with_job_values). cuda: as build_env."""
    env = build_env(
        spec,
        cache_root=cache_root,
        jobs=plan.jobs,
        nvcc_threads=plan.nvcc_threads or None,
        backend=backend,
        cuda=cuda,
    )
    return with_job_values({**env, **jobs_env(plan.jobs), **(extra or {})}, spec.env)


def _compile_env(
    spec: BuildSpec, cache_root: str, jobs: int, nvcc_threads: int | None, backend: str, home: str
) -> dict[str, str]:
    launcher = ccache_launcher(backend)
    env: dict[str, str] = {
        "PYTORCH_BUILD_VERSION": spec.build_version,
        "PYTORCH_BUILD_NUMBER": "1",
        "MAX_JOBS": str(jobs),
        **compiler_commands(spec, backend),
        **({"CMAKE_C_COMPILER_LAUNCHER": "ccache", "CMAKE_CXX_COMPILER_LAUNCHER": "ccache"} if launcher else {}),
        "USE_CUDA": _flag(spec.cuda),
    }
    if spec.cuda:
        env.update(_cuda_env(spec, nvcc_threads, home, launcher=launcher))
    env["BLAS"] = BLAS_NAMES[spec.blas]
    if spec.mkl_threading:
        env["MKL_THREADING"] = spec.mkl_threading
    env.update(_distributed_env(spec))
    for var, flags in (("CFLAGS", spec.cflags), ("CXXFLAGS", spec.cxxflags), ("LDFLAGS", spec.ldflags)):
        if flags:
            env[var] = shlex.join(flags)
    env.update(
        {
            "CCACHE_DIR": f"{cache_root}/ccache",
            "CCACHE_MAXSIZE": spec.ccache_size,
            "CCACHE_COMPRESS": "1",
            "CCACHE_SLOPPINESS": CCACHE_SLOPPINESS,
            "PIP_CACHE_DIR": f"{cache_root}/pip",
        }
    )
    env.update(remote_cache.storage_env(spec.ccache_remote, spec.ccache_remote_readonly))
    env.update(spec.switches)  # explicit switches win over derived values
    env.update(spec.env)
    return env


def _cuda_env(spec: BuildSpec, nvcc_threads: int | None, home: str, *, launcher: bool) -> dict[str, str]:
    """_compile_env's CUDA variables: the toolkit at home, the arch list, ccache for nvcc (with launcher) and
    nvcc's flags (with --threads: nvcc_threads, else the profile's)."""
    nvcc_flags = list(spec.cuda_flags)
    threads = spec.nvcc_threads if nvcc_threads is None else nvcc_threads
    if threads:
        nvcc_flags += ["--threads", str(threads)]
    env = {
        "CUDA_HOME": home,
        "CUDACXX": f"{home}/bin/nvcc",
        "TORCH_CUDA_ARCH_LIST": ";".join(spec.cuda_arch_list),
        **({"CMAKE_CUDA_COMPILER_LAUNCHER": "ccache"} if launcher else {}),
    }
    if nvcc_flags:
        env["TORCH_NVCC_FLAGS"] = shlex.join(nvcc_flags)
    return env


def _distributed_env(spec: BuildSpec) -> dict[str, str]:
    """_compile_env's USE_DISTRIBUTED, a USE_<backend> for each backend, and USE_SYSTEM_NCCL with NCCL."""
    env = {"USE_DISTRIBUTED": _flag(bool(spec.distributed))}
    for backend in ("gloo", "nccl", "mpi", "ucc"):
        env[f"USE_{backend.upper()}"] = _flag(backend in spec.distributed)
    if "nccl" in spec.distributed:
        env["USE_SYSTEM_NCCL"] = _flag(spec.nccl != "bundled")
    return env


def format_env(env: dict[str, str]) -> str:
    """``KEY=value`` lines, shell-quoted where needed, so they can be pasted into a shell."""
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in env.items())


# Variables a shell will not take from `export NAME=value` in bin/activate or a modulefile's
# shell code ("readonly variable", which stops a `set -e` job): bash's read-only variables,
# asked of bash itself where it is installed (`readonly_shell_variables`), and these as well
# (bash's where there is no bash, and zsh's read-only specials).
READONLY_FALLBACK = frozenset(
    {
        "BASHOPTS",
        "BASH_VERSINFO",
        "EUID",
        "PPID",
        "SHELLOPTS",
        "UID",
        "ARGC",
        "HISTCMD",
        "TTYIDLE",
        "ZSH_ARGZERO",
        "ZSH_EVAL_CONTEXT",
        "ZSH_SUBSHELL",
    }
)
_DECLARED_READONLY = re.compile(r"^declare -[A-Za-z]*r[A-Za-z]* ([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def readonly_shell_variables() -> frozenset[str]:
    """The names runtime_env cannot set: bash's `readonly -p` in a clean shell, and
    READONLY_FALLBACK."""
    names = set(READONLY_FALLBACK)
    bash = shutil.which("bash")
    if bash:
        try:
            proc = run_captured(
                [bash, "--norc", "--noprofile", "-c", "readonly -p"], env={"PATH": os.defpath}, timeout=10
            )
            if proc.returncode is not None:
                names.update(_DECLARED_READONLY.findall(proc.stdout))
        except OSError:
            pass
    return frozenset(names)


def runtime_env(spec: BuildSpec) -> dict[str, str]:
    """The profile's runtime_env: what jobs that run torch need (NCCL_*, FI_*, MPICH_*...), set
    by the install's activate script and modulefiles and by the SIF's %environment. It is kept
    apart from the build's: a variable the build also sets must have the same value in both,
    or the SIF would build with the runtime's (ProfileError); a read-only shell variable (UID,
    SHELLOPTS...) is a ProfileError too."""
    from torchbuild.core.errors import ProfileError

    readonly = sorted(set(spec.runtime_env) & readonly_shell_variables())
    if readonly:
        raise ProfileError(
            f"{spec.origins.get('runtime_env', 'runtime_env')}: key 'runtime_env': {', '.join(readonly)} "
            "is a read-only shell variable: sourcing bin/activate (or loading the module) would fail",
            hint=f"leave {readonly[0]} out of runtime_env (the shell sets it itself)",
        )
    build = _compile_env(spec, "/cache", 1, None, "apptainer", spec.cuda_home)  # as the SIF sets both
    clash = sorted(k for k, v in spec.runtime_env.items() if k in build and build[k] != v)
    if clash:
        k = clash[0]
        raise ProfileError(
            f"{spec.origins.get('runtime_env', 'runtime_env')}: key 'runtime_env': {k}={spec.runtime_env[k]!r} "
            f"differs from the build's {k}={build[k]!r}",
            hint="a SIF sets both; give the build's value in env (or switches), or leave it out of runtime_env",
        )
    return dict(spec.runtime_env)


def prepend_path_lines(var: str, dirs: Sequence[str], *, only_if_present: bool = False) -> list[str]:
    """POSIX sh lines that put dirs first on the colon list var (each quoted; with
    only_if_present, only the directories that exist where the lines run)."""
    lines = []
    for d in reversed(dirs):
        q = shlex.quote(d)
        line = f'{var}={q}"${{{var}:+:${var}}}"; export {var}'
        lines.append(f"if [ -d {q} ]; then {line}; fi" if only_if_present else line)
    return lines


# where the comms step copies the plugin's site dependencies (libfabric and what it links that
# is not a system library), relative to the comms prefix: after the plugin's lib/ at run time
COMMS_DEPS = "deps/lib"


def comms_deps_dir(prefix: str, manifest: Mapping[str, Any]) -> list[str]:
    """[prefix/deps/lib] when the manifest's plugin carries site dependencies, else []."""
    return [f"{prefix}/{COMMS_DEPS}"] if (manifest.get("plugin") or {}).get("deps") else []


def comms_runtime_env(prefix: str, manifest: Mapping[str, Any]) -> dict[str, str]:
    """What a job needs to load the NCCL `invoke comms` built at prefix and to find its plugin
    the way the plugin's release needs: prefix/lib first on LD_LIBRARY_PATH (NCCL dlopens
    libnccl-net.so by default, which aws-ofi-nccl 1.6 installs), then the plugin's site
    dependencies (prefix/deps/lib) when it carries any, and NCCL_NET_PLUGIN naming the file
    when the release installs libnccl-net-ofi.so (1.17; NCCL 2.21+ takes a path)."""
    env = {"LD_LIBRARY_PATH": ":".join([f"{prefix}/lib", *comms_deps_dir(prefix, manifest)])}
    plugin = manifest.get("plugin") or {}
    if str(plugin.get("library", "")).endswith("libnccl-net-ofi.so"):
        env["NCCL_NET_PLUGIN"] = f"{prefix}/lib/libnccl-net-ofi.so"
    return env


def comms_install_env(prefix: str, manifest: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    """What an install carrying the comms stack of `invoke comms` at prefix gives its users:
    (the directories to put first on LD_LIBRARY_PATH: the built NCCL's, then the plugin's, each
    once, then the plugin's site dependencies (deps/lib) when it carries any; the variables:
    NCCL_NET_PLUGIN naming the plugin library by its path, which NCCL 2.21+ opens as given).
    manifest is the comms manifest (its libraries relative to prefix)."""
    dirs: list[str] = []
    env: dict[str, str] = {}
    for part in ("nccl", "plugin"):
        library = str((manifest.get(part) or {}).get("library", ""))
        if not library:
            continue
        path = f"{prefix}/{library}"
        if os.path.dirname(path) not in dirs:
            dirs.append(os.path.dirname(path))
        if part == "plugin":
            env["NCCL_NET_PLUGIN"] = path
    return dirs + comms_deps_dir(prefix, manifest), env


# ${NAME} in a value of the profile's env: the variable of the environment the build step runs
# in (a module's MKLROOT on the compute node), filled in by Python, never by a shell
_JOB_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def with_job_values(
    env: Mapping[str, str], profile_env: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """env with each of the profile's env values that names ${NAME} (INTEL_MKL_DIR: ${MKLROOT})
    filled in from environ (default: this process's, the step's). A value naming a variable
    that is unset there is left out, so the build's own default applies (as a shell's empty
    expansion would leave it). Only ${NAME} is read: no other expansion, no command."""
    source = os.environ if environ is None else environ
    out = dict(env)
    for key, value in profile_env.items():
        if out.get(key) != value or "${" not in value:
            continue
        names = _JOB_REFERENCE.findall(value)
        if any(not source.get(n) for n in names):
            del out[key]
        else:
            out[key] = _JOB_REFERENCE.sub(lambda m: source[m[1]], value)
    return out
