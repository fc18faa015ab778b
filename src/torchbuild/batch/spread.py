"""`invoke submit --nodes N`: the build's compiles spread over the allocation's N nodes with distcc.

The job runs on the allocation's first node (Slurm's batch host, PBS's mother superior). Its
script (scheduler.render, with the lines of spread_lines):

1. lists the allocation's nodes: `scontrol show hostnames "$SLURM_JOB_NODELIST"` on Slurm,
   the unique lines of $PBS_NODEFILE on PBS; each name resolved to its IPv4 address once, on
   the first node (another node that resolves to loopback is left out, with a warning: its
   daemon would listen where no compile reaches it; the first node's own name mapped to
   loopback, as Debian's /etc/hosts does, is replaced by its other addresses, `hostname -I`);
2. starts one distccd on each of the other nodes through the scheduler (Slurm: one `srun
   --overlap --nodelist` step, one task per node, `--cpus-per-task` asked again; PBS: `pbsdsh
   -n I` per node), in the SIF (the same compilers as the build's; apptainer, else singularity,
   as the build finds it) or, natively, the node's own; each daemon listens on the address the
   first node resolved for it only, accepts only the allocation's addresses (--allow ADDR/32
   each), on a port derived from the job id's number, and lives at most the job's walltime
   (`timeout`). distccd has no per-user authentication: the job asks for whole nodes (Slurm
   --exclusive, PBS place=scatter:excl), so no other user's process shares an allowed address.
   A pbsdsh task appends its own output to the daemons' log (pbsdsh passes none back) and finds
   the runtime by the path resolved on the first node (it gets the job's starting PATH);
3. runs the build with ccache in front of distcc (CCACHE_PREFIX=distcc: a cache hit never
   leaves the node, a miss is preprocessed here and compiled on a free slot), DISTCC_HOSTS
   naming localhost and each node with its slots, and MAX_JOBS sized to all of them (--jobs);
   distcc links and preprocesses locally, and never ships what it cannot (nvcc's .cu files);
4. stops every daemon when the build ends, fails or the job is cancelled (a trap on EXIT,
   TERM and INT; the scheduler ends the step's processes with the job in any case), then says
   how many units the other nodes compiled (their logs' COMPILE_OK lines), with a warning
   when none.

Why distcc, plain mode (not pump mode, not icecream), measured on PyTorch 2.6's own units
(this machine's g++ 12, the preflight's flags; 2 loaded cores): c10/core/TensorImpl.cpp
preprocesses in 1.1 s to 3.2 MB (0.55 MB compressed) and then compiles in 26.4 s; a unit
including ATen/ATen.h preprocesses in 13.5 s to 11.5 MB (1.3 MB compressed) and compiles in
52.1 s. Preprocessing, which plain mode keeps on the job's node, is 4 to 26% of a unit's
compile, and what travels is a few MB compressed (distcc's lzo) per unit: one node
preprocessing for N compiling ones is worth it up to ~4 to 20 nodes of the same cores. Pump
mode would move preprocessing too, but it needs its include server around the whole build
(`pump make`), re-ships the headers torchgen writes during the build, and gains nothing
behind ccache, which preprocesses every miss here anyway to look it up. icecream ships the
toolchain itself and schedules through a central scheduler daemon (icecc-scheduler) that
would have to run in the job too; with the SIF on every node the toolchain is already the
same, so icecream's advantage is moot and its scheduler is one more daemon to bound and secure.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from torchbuild.core.errors import UsageError
from torchbuild.profile.config import BuildSpec

DISTRIBUTOR = "distcc"
MAX_NODES = 4096
PORT_BASE = 20000  # the daemons' port: PORT_BASE + job id modulo PORT_SPAN
PORT_SPAN = 20000
GIB_MB = 1024


def hosts_command(scheduler: str) -> str:
    """The shell command that prints the allocation's nodes, one per line, the job's own first."""
    if scheduler == "slurm":
        return 'scontrol show hostnames "$SLURM_JOB_NODELIST"'
    return "awk '!seen[$0]++' \"$PBS_NODEFILE\""  # PBS lists a node once per rank: unique, in order


def slots_per_node(spec: BuildSpec, mem_mb: float, *, local: bool = False) -> int:
    """Compiles one node runs at once: its cores (the profile's cpus), fewer where its memory
    (mem_mb; 0: not asked for) over the per-job peak allows fewer. local: the build's own node,
    where a CUDA build's nvcc units stay (distcc cannot ship them), so its peak is the CUDA one
    where that is larger, as the one-node plan takes it; the other nodes get light C++ only.
    A numeric max_jobs caps each node's slots (it caps a one-node build's jobs)."""
    peak = spec.mem_per_job_gb
    if local and spec.cuda:
        peak = max(peak, spec.mem_per_cuda_job_gb)
    slots = spec.cpus if mem_mb <= 0 or peak <= 0 else min(spec.cpus, int(mem_mb / (peak * GIB_MB)))
    if spec.max_jobs != "auto":
        slots = min(slots, int(spec.max_jobs))
    return max(1, slots)


def spread_jobs(nodes: int, local_slots: int, remote_slots: int) -> int:
    """MAX_JOBS for the build over the allocation: the build's node's slots and every other's."""
    return local_slots + (nodes - 1) * remote_slots


def check_nodes(nodes: int, engine: str, apptainer: str) -> None:
    """UsageError for a --nodes no spread can use: out of range, or with the docker engine
    (the daemons run in the SIF through apptainer, or natively)."""
    if not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes {nodes} is out of range", hint=f"e.g. --nodes 2 (at most {MAX_NODES})")
    if nodes > 1 and (engine == "docker" or apptainer == "docker"):
        raise UsageError(
            "--nodes spreads compiles over the nodes with distccd in the SIF or the node's own: not through docker",
            hint="use --engine apptainer with the node's apptainer (--apptainer auto or host), or --engine native",
        )


def daemon_argv(sif: str) -> list[str]:
    """How a node starts distccd: in the SIF (the build's compilers, through the container
    runtime the script found on the build's node, "$tb_runtime") or, natively, its own."""
    if sif:
        return [RUNTIME, "exec", "--cleanenv", sif, "distccd"]
    return ["distccd"]


RUNTIME = "$tb_runtime"  # in daemon_argv: apptainer or singularity's path, as the script found it

# run on each other node: $1 is "name=addr ...", the addresses resolved once on the build's node;
# a Slurm task takes its own node's (SLURMD_NODENAME), a pbsdsh one its one pair
_LISTEN = (
    'tb_me=""; for tb_p in $1; do [ -n "${SLURMD_NODENAME:-}" ] && [ "${tb_p%%=*}" != "$SLURMD_NODENAME" ] '
    "&& continue; tb_me=${tb_p#*=}; done; "
    'if [ -z "$tb_me" ]; then echo "torchbuild: no address for node $(hostname) in: $1" >&2; exit 1; fi; '
    'shift; exec "$@" --listen "$tb_me"'
)
# a pbsdsh task's own output into the daemons' log ($1): pbsdsh passes none of it back (it only
# spawns and waits), so a redirection of pbsdsh's would capture nothing
_TO_LOG = 'exec >>"$1" 2>&1; shift; exec "$@"'


def _words(argv: Sequence[str]) -> str:
    """argv as shell words, RUNTIME left for the script to expand."""
    return " ".join(f'"{RUNTIME}"' if a == RUNTIME else shlex.quote(a) for a in argv)


def _start_lines(scheduler: str, walltime_s: int, daemon: Sequence[str], slots: int) -> list[str]:
    """Start distccd on the other nodes kept (tb_nodes) in the background; their pids in tb_daemons."""
    args = [*daemon, "--no-detach", "--daemon", "--jobs", str(slots), "--log-stderr", "--log-level", "info"]
    bounded = _words(["timeout", "--kill-after=30", str(walltime_s), "bash", "-c", _LISTEN, "distccd"])
    rest = f'{_words(args)} --port "$tb_port" "${{tb_allow[@]}}"'
    if scheduler == "slurm":
        # -c: srun does not pass the job's --cpus-per-task on to a step (Slurm 22.05 to 23.02), and
        # with ConstrainCores each daemon's compiles would share one core; --export=ALL: under
        # sbatch --export=NONE (export_env false) the job has SLURM_EXPORT_ENV=NONE, which srun
        # takes as its own --export, and the step would lack the script's PATH and module loads
        steps = '--nodes="${#tb_nodes[@]}" --ntasks="${#tb_nodes[@]}" --ntasks-per-node=1 --nodelist="$tb_list"'
        steps += " --export=ALL"
        return [
            'if [ "${#tb_nodes[@]}" -gt 0 ]; then',
            '  tb_list=$(IFS=,; echo "${tb_nodes[*]}")',
            "  tb_srun_log=${tb_log//%/%%}  # srun expands %-patterns in --output: the path's own doubled",
            f'  srun --overlap {steps} --cpus-per-task="${{SLURM_CPUS_PER_TASK:-{slots}}}" --kill-on-bad-exit=0 \\',
            f'    --output="$tb_srun_log" {bounded} "${{tb_pairs[*]}}" {rest} &',
            "  tb_daemons+=($!)",
            "fi",
        ]
    logged = _words(["bash", "-c", _TO_LOG, DISTRIBUTOR])
    return [
        'for tb_k in "${!tb_nodes[@]}"; do',
        f'  pbsdsh -n "${{tb_index[tb_k]}}" -- {logged} "$tb_log" {bounded} "${{tb_pairs[tb_k]}}" {rest} &',
        "  tb_daemons+=($!)",
        "done",
    ]


def _address_lines(scheduler: str, nodes: int, remote_slots: int) -> list[str]:
    """The allocation's nodes resolved to IPv4 addresses once, here: every address the daemons
    accept (tb_allow; this node's own where its name maps to loopback, as Debian's /etc/hosts
    does: its other addresses) and the other nodes a daemon starts on (tb_nodes, their index
    tb_index, "name=addr" tb_pairs, DISTCC_HOSTS's tb_remote), none on a loopback address, whose
    compiles would silently stay on this node."""
    return [
        f"mapfile -t tb_hosts < <({hosts_command(scheduler)})",
        f'if [ "${{#tb_hosts[@]}}" -lt {nodes} ]; then',
        f'  echo "torchbuild: the allocation lists ${{#tb_hosts[@]}} nodes, not {nodes}" >&2; exit 1',
        "fi",
        "tb_allow=() tb_nodes=() tb_index=() tb_pairs=() tb_remote=() tb_daemons=()",
        'for tb_i in "${!tb_hosts[@]}"; do',
        "  tb_h=${tb_hosts[tb_i]}",
        '  tb_a=$(getent ahostsv4 "$tb_h" | awk \'NR==1 {print $1}\') || tb_a=""',
        '  if [ -z "$tb_a" ]; then echo "torchbuild: node $tb_h has no IPv4 address" >&2; exit 1; fi',
        '  if [ "$tb_i" -eq 0 ] && [[ $tb_a == 127.* ]]; then',
        "    for tb_a in $(hostname -I 2>/dev/null || true); do",
        '      [[ $tb_a == 127.* || $tb_a == *:* ]] || tb_allow+=(--allow "$tb_a/32")',
        "    done",
        "  elif [[ $tb_a == 127.* ]]; then",
        '    echo "torchbuild: warning: node $tb_h resolves to the loopback address $tb_a here: no compiles go to it" >&2',
        "  else",
        '    tb_allow+=(--allow "$tb_a/32")',
        '    [ "$tb_i" -eq 0 ] && continue',
        '    tb_nodes+=("$tb_h") tb_index+=("$tb_i") tb_pairs+=("$tb_h=$tb_a")',
        f'    tb_remote+=("$tb_a:$tb_port/{remote_slots},lzo")',
        "  fi",
        "done",
    ]


_STOP = [
    "tb_stop() {",
    '  if [ "${#tb_daemons[@]}" -gt 0 ]; then',
    '    kill -TERM "${tb_daemons[@]}" 2>/dev/null || true',
    '    wait "${tb_daemons[@]}" 2>/dev/null || true',
    "    tb_daemons=()",
    '    tb_ok=$(grep -c COMPILE_OK "$tb_log" 2>/dev/null) || tb_ok=0',
    '    if [ "$tb_ok" -gt 0 ]; then',
    '      echo "torchbuild: the other nodes compiled $tb_ok units (distccd\'s log: $tb_log)"',
    "    else",
    '      echo "torchbuild: warning: the other nodes compiled no unit: every compile ccache missed ran'
    " on this node (distccd's log: $tb_log)\" >&2",
    "    fi",
    "  fi",
    '  [ -z "${tb_distcc_dir:-}" ] || rm -rf "$tb_distcc_dir"',
    '  tb_distcc_dir=""',
    "}",
    "trap tb_stop EXIT",
    "trap 'tb_stop; exit 143' TERM INT",
]

# the container runtime the build will use (as runtime.apptainer.host_apptainer: apptainer, else singularity),
# as its path here: a pbsdsh task gets the job's starting environment, not this script's
# module-loaded PATH
_RUNTIME = [
    'tb_runtime=$(command -v apptainer || command -v singularity) || tb_runtime=""',
    'if [ -z "$tb_runtime" ]; then',
    '  echo "torchbuild: neither apptainer nor singularity is on PATH on $(hostname): load its module" >&2; exit 1',
    "fi",
]


def _environment_lines(sif: str, local_slots: int) -> list[str]:
    """The build's distcc settings (local_slots: its own node's), passed into the SIF by the
    runtime's own prefix."""
    lines = [
        f'export DISTCC_HOSTS="localhost/{local_slots} ${{tb_remote[*]}}" CCACHE_PREFIX={DISTRIBUTOR}',
        # distcc's locks, node-local and this job's own; without the directory it compiles locally
        "tb_distcc_dir=$(mktemp -d /tmp/torchbuild-distcc-XXXXXXXX)",
        'export DISTCC_DIR="$tb_distcc_dir" DISTCC_BACKOFF_PERIOD=0',
    ]
    if sif:
        for prefix, runtime in (("APPTAINERENV", "apptainer"), ("SINGULARITYENV", "singularity")):
            lines += [
                f'if [ "${{tb_runtime##*/}}" = {runtime} ]; then',
                f'  export {prefix}_DISTCC_HOSTS="$DISTCC_HOSTS" {prefix}_CCACHE_PREFIX="$CCACHE_PREFIX"',
                f'  export {prefix}_DISTCC_DIR="$DISTCC_DIR" {prefix}_DISTCC_BACKOFF_PERIOD=0',
                "fi",
            ]
    return lines


def job_id_lines(id_variable: str) -> list[str]:
    """tb_id: the job id's number (PBS's is NNNN.server, an array job's NNNN[I].server), for
    the daemons' port and the names derived from the id."""
    return [
        f"tb_id=${{{id_variable}:-0}}",
        "tb_id=${tb_id%%.*}",
        "tb_id=${tb_id//[!0-9]/}",
        f"tb_port=$(( {PORT_BASE} + 10#${{tb_id:-0}} % {PORT_SPAN} ))",
    ]


def spread_lines(
    scheduler: str,
    nodes: int,
    *,
    local_slots: int,
    remote_slots: int,
    walltime_s: int,
    sif: str,
    log_dir: str,
    id_variable: str,
) -> list[str]:
    """The job script's lines that start the daemons on nodes 2..N (remote_slots compiles each),
    point the build at them (local_slots on its own node), and stop them when the script exits
    (the build's command follows, not exec'd)."""
    return [
        f"# the compiles spread over the allocation's {nodes} nodes (distcc; docs: Several nodes, the compile spread)",
        *job_id_lines(id_variable),
        f'tb_log={shlex.quote(log_dir)}/{DISTRIBUTOR}-"$tb_id"-daemons.log',
        *_address_lines(scheduler, nodes, remote_slots),
        *(_RUNTIME if sif else []),
        *_STOP,
        *_start_lines(scheduler, walltime_s, daemon_argv(sif), remote_slots),
        *_environment_lines(sif, local_slots),
        'echo "torchbuild: distccd on ${tb_remote[*]:-no other node}; DISTCC_HOSTS=$DISTCC_HOSTS"',
    ]
