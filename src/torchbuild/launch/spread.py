"""`invoke submit --nodes N`: the build's compiles spread over the allocation's N nodes with distcc.

The job runs on the allocation's first node (Slurm's batch host, PBS's mother superior). Its
script (scheduler.render, with the lines of spread_lines):

1. lists the allocation's nodes: `scontrol show hostnames "$SLURM_JOB_NODELIST"` on Slurm,
   the unique lines of $PBS_NODEFILE on PBS; each name resolved to its IPv4 address;
2. starts one distccd on each of the other nodes through the scheduler (Slurm: one `srun
   --overlap` step, one task per node; PBS: `pbsdsh -n I` per node), in the SIF (the same
   compilers as the build's) or, natively, the node's own; each daemon listens on its node's
   address only, accepts only the allocation's addresses (--allow ADDR/32 each), on a port
   derived from the job id, and lives at most the job's walltime (`timeout`);
3. runs the build with ccache in front of distcc (CCACHE_PREFIX=distcc: a cache hit never
   leaves the node, a miss is preprocessed here and compiled on a free slot), DISTCC_HOSTS
   naming localhost and each node with its slots, and MAX_JOBS sized to all of them (--jobs);
   distcc links and preprocesses locally, and never ships what it cannot (nvcc's .cu files);
4. stops every daemon when the build ends, fails or the job is cancelled (a trap on EXIT,
   TERM and INT; the scheduler ends the step's processes with the job in any case).

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
from torchbuild.inputs.config import BuildSpec

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


def slots_per_node(spec: BuildSpec, mem_mb: float) -> int:
    """Compiles one node runs at once: its cores (the profile's cpus), fewer where its memory
    (mem_mb; 0: not asked for) over the profile's per-job peak allows fewer."""
    if mem_mb <= 0 or spec.mem_per_job_gb <= 0:
        return max(1, spec.cpus)
    return max(1, min(spec.cpus, int(mem_mb / (spec.mem_per_job_gb * GIB_MB))))


def spread_jobs(nodes: int, slots: int) -> int:
    """MAX_JOBS for the build over the allocation: every node's slots (the local one's too)."""
    return nodes * slots


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
    """How a node starts distccd: in the SIF (the build's compilers) or, natively, its own."""
    if sif:
        return ["apptainer", "exec", "--cleanenv", sif, "distccd"]
    return ["distccd"]


_LISTEN = 'tb_addr=$(getent ahostsv4 "$(hostname)" | awk \'NR==1 {print $1}\'); exec "$@" --listen "$tb_addr"'


def _start_lines(scheduler: str, nodes: int, walltime_s: int, daemon: Sequence[str], slots: int) -> list[str]:
    """Start distccd on nodes 2..N in the background; their pids in tb_daemons."""
    args = [*daemon, "--no-detach", "--daemon", "--jobs", str(slots), "--log-stderr", "--log-level", "info"]
    bounded = ["timeout", "--kill-after=30", str(walltime_s), "bash", "-c", _LISTEN, "distccd", *args]
    tail = f'{shlex.join(bounded)} --port "$tb_port" "${{tb_allow[@]}}"'
    if scheduler == "slurm":
        steps = f"--nodes={nodes - 1} --ntasks={nodes - 1} --ntasks-per-node=1 --relative=1"
        return [
            "tb_srun_log=${tb_log//%/%%}  # srun expands %-patterns in --output: the path's own doubled",
            f'srun --overlap {steps} --kill-on-bad-exit=0 --output="$tb_srun_log" {tail} &',
            "tb_daemons+=($!)",
        ]
    return [
        f"for ((tb_i = 1; tb_i < {nodes}; tb_i++)); do",
        f'  pbsdsh -n "$tb_i" -- {tail} >>"$tb_log" 2>&1 &',
        "  tb_daemons+=($!)",
        "done",
    ]


def spread_lines(
    scheduler: str, nodes: int, *, slots: int, walltime_s: int, sif: str, log_dir: str, id_variable: str
) -> list[str]:
    """The job script's lines that start the daemons on nodes 2..N, point the build at them,
    and stop them when the script exits (the build's command follows, not exec'd)."""
    job_id = f"${{{id_variable}:-0}}"
    hosts = f"{DISTRIBUTOR}-{job_id}"
    return [
        f"# the compiles spread over the allocation's {nodes} nodes (distcc; README: invoke submit --nodes)",
        f"mapfile -t tb_hosts < <({hosts_command(scheduler)})",
        f'if [ "${{#tb_hosts[@]}}" -lt {nodes} ]; then',
        f'  echo "torchbuild: the allocation lists ${{#tb_hosts[@]}} nodes, not {nodes}" >&2; exit 1',
        "fi",
        f"tb_port=$(( {PORT_BASE} + ${{{id_variable}:-0}} % {PORT_SPAN} ))",
        f"tb_log={shlex.quote(log_dir)}/{hosts}-daemons.log",
        "tb_allow=() tb_remote=() tb_daemons=()",
        'for tb_h in "${tb_hosts[@]}"; do',
        "  tb_a=$(getent ahostsv4 \"$tb_h\" | awk 'NR==1 {print $1}')",
        '  if [ -z "$tb_a" ]; then echo "torchbuild: node $tb_h has no IPv4 address" >&2; exit 1; fi',
        '  tb_allow+=(--allow "$tb_a/32")',
        f'  [ "$tb_h" = "${{tb_hosts[0]}}" ] || tb_remote+=("$tb_a:$tb_port/{slots},lzo")',
        "done",
        "tb_stop() {",
        '  [ "${#tb_daemons[@]}" -eq 0 ] && return 0',
        '  kill -TERM "${tb_daemons[@]}" 2>/dev/null || true',
        '  wait "${tb_daemons[@]}" 2>/dev/null || true',
        "  tb_daemons=()",
        '  [ -z "${tb_distcc_dir:-}" ] || rm -rf "$tb_distcc_dir"',
        "}",
        "trap tb_stop EXIT",
        "trap 'tb_stop; exit 143' TERM INT",
        *_start_lines(scheduler, nodes, walltime_s, daemon_argv(sif), slots),
        f'export DISTCC_HOSTS="localhost/{slots} ${{tb_remote[*]}}" CCACHE_PREFIX={DISTRIBUTOR}',
        # distcc's locks, node-local; distcc makes no directory of its own (it compiles locally then)
        f"export DISTCC_DIR=/tmp/torchbuild-{hosts} DISTCC_BACKOFF_PERIOD=0",
        'mkdir -p "$DISTCC_DIR"',
        "tb_distcc_dir=$DISTCC_DIR",
        'export APPTAINERENV_DISTCC_HOSTS="$DISTCC_HOSTS" APPTAINERENV_CCACHE_PREFIX="$CCACHE_PREFIX"',
        'export APPTAINERENV_DISTCC_DIR="$DISTCC_DIR" APPTAINERENV_DISTCC_BACKOFF_PERIOD=0',
        'echo "torchbuild: distccd on ${tb_remote[*]:-no other node}; DISTCC_HOSTS=$DISTCC_HOSTS"',
    ]
