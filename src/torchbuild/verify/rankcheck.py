"""One rank of `invoke verify --nodes N`: run by file path in the install's Python on every rank
the site's launcher starts (it imports nothing of torchbuild, which the nodes may lack).

    python rankcheck.py RUN_DIR EXPECT_JSON

The ranks meet through RUN_DIR, on a file system every node shares: rank 0 opens a TCPStore
and writes its host and port to RUN_DIR/rendezvous.json; the others read it. Each rank then
runs the checks (gloo all_reduce, torch.distributed's MPI backend and mpi4py when there is an
MPI, NCCL when a GPU is visible; where one is, the MPI backend's all_reduce of a CUDA tensor
too, which only a CUDA-aware MPI takes) and writes RUN_DIR/ranks/rank-<R>.json; it exits 1 if a
check failed. A check that cannot run here (no GPU for NCCL) is "skip", with why.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

# the launchers' words for a rank's place: Slurm's srun, PMI (MPICH's Hydra, Cray PALS), Open MPI
RANK_VARS = ("SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PALS_RANKID", "PMIX_RANK")
SIZE_VARS = ("SLURM_NTASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
LOCAL_VARS = ("SLURM_LOCALID", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID")


def _first(names: tuple[str, ...], default: int) -> tuple[int, str]:
    for name in names:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value), name
    return default, ""


def check(name: str, status: str, detail: str = "", **values: Any) -> dict[str, Any]:
    return {"name": name, "status": status, "detail": detail, **values}


def guarded(name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """fn's check, or a failed one with the exception's last line."""
    try:
        return fn()
    except Exception as exc:
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return check(name, "fail", last[-400:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _store(host: str, port: int, world: int, master: bool, timeout: float) -> Any:
    """A TCPStore; without libuv where torch was built without it (Debian's)."""
    dist: Any = importlib.import_module("torch.distributed")
    delta = datetime.timedelta(seconds=timeout)
    try:
        return dist.TCPStore(host, port, world, master, delta, wait_for_workers=False)
    except RuntimeError as exc:
        if "libuv" not in str(exc):
            raise
        return dist.TCPStore(host, port, world, master, delta, wait_for_workers=False, use_libuv=False)


def _publish(spot: Path, data: dict[str, Any]) -> None:
    tmp = spot.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(spot)


def rendezvous(run_dir: Path, rank: int, world: int, timeout: float) -> Any:
    """The TCPStore every rank shares: rank 0 opens it and writes where it is (or why not)."""
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("PBS_JOBID") or ""
    spot = run_dir / f"rendezvous{'-' + job if job else ''}.json"  # the job's own: a job resubmitted by hand
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        try:
            store = _store(host, _free_port(), world, True, timeout)
        except Exception as exc:
            _publish(spot, {"error": f"rank 0 on {host}: {type(exc).__name__}: {exc}"})
            raise
        _publish(spot, {"host": host, "port": store.port})
        return store
    deadline = time.monotonic() + timeout
    while not spot.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 wrote no {spot} in {timeout:.0f} s")
        time.sleep(0.2)
    where = json.loads(spot.read_text())
    if "error" in where:
        raise RuntimeError(where["error"])
    return _store(where["host"], where["port"], world, False, timeout)


def all_reduce(backend: str, store: Any, rank: int, world: int, timeout: float, device: str = "cpu") -> dict[str, Any]:
    """all_reduce of rank+1 over the backend: the sum must be world*(world+1)/2."""
    return all_reduces(backend, store, rank, world, timeout, [(f"{backend} all_reduce", device)])[0]


def all_reduces(
    backend: str, store: Any, rank: int, world: int, timeout: float, tensors: list[tuple[str, str]]
) -> list[dict[str, Any]]:
    """One process group of the backend, an all_reduce of rank+1 in each (check name, device) of
    tensors: each sum must be world*(world+1)/2. A tensor the backend refuses is that check's
    failure (the MPI backend's "CUDA tensor detected and the MPI used doesn't have CUDA-aware
    MPI support"), not the others'."""
    torch: Any = importlib.import_module("torch")
    dist: Any = importlib.import_module("torch.distributed")

    delta = datetime.timedelta(seconds=timeout)
    if backend == "mpi":
        dist.init_process_group("mpi", timeout=delta)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        dist.init_process_group(
            backend, store=dist.PrefixStore(backend, store), rank=rank, world_size=world, timeout=delta
        )
    expected = world * (world + 1) // 2
    results = []
    try:
        for name, device in tensors:
            try:
                value = torch.tensor([float(rank + 1)], device=device)
                dist.all_reduce(value)
                total = int(value.item())
            except Exception as exc:
                results.append(check(name, "fail", f"{device}: {_last_line(exc)}", world=world))
                continue
            detail = f"sum {total} over {world} ranks (expected {expected})" + (
                "" if device == "cpu" else f" on {device}"
            )
            status = "pass" if total == expected else "fail"
            results.append(check(name, status, detail, sum=total, expected=expected, world=world))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return results


def _last_line(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()[-400:]


def visible_gpu(local: int) -> str:
    """The device this rank uses (cuda:<local rank modulo the GPUs visible>), '' where none is."""
    torch: Any = importlib.import_module("torch")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"cuda:{local % count}" if count else ""


MPI_CUDA = "mpi all_reduce (CUDA tensor)"


def torch_mpi(expect: dict[str, Any], rank: int, local: int, world: int, timeout: float) -> list[dict[str, Any]]:
    """The MPI backend's all_reduce of a CPU tensor and, where a GPU is visible, of a CUDA one:
    CUDA-aware MPI (Derecho's cray-mpich) is the reason to build torch with MPI on a GPU system."""
    dist: Any = importlib.import_module("torch.distributed")

    if not dist.is_mpi_available():
        why = "this torch was built without MPI (torch.distributed.is_mpi_available() is False)"
        return [check("mpi all_reduce", "fail" if expect.get("mpi") else "skip", why)]
    gpu = visible_gpu(local)
    if gpu:
        importlib.import_module("torch").cuda.set_device(gpu)
    results = all_reduces(
        "mpi", None, rank, world, timeout, [("mpi all_reduce", "cpu"), *([(MPI_CUDA, gpu)] if gpu else [])]
    )
    for result in results:
        if result.get("world", world) != world:
            result.update(status="fail", detail=result["detail"] + f"; MPI's world is {result['world']}, not {world}")
    if not gpu:
        results.append(check(MPI_CUDA, "skip", f"no GPU visible on {socket.gethostname()}"))
    elif results[-1]["status"] == "fail" and not expect.get("mpi_cuda"):
        results[-1].update(status="skip", detail=results[-1]["detail"] + " (the profile builds no CUDA with MPI)")
    return results


def mpi4py_check(expect: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    try:
        MPI: Any = importlib.import_module("mpi4py.MPI")
    except ImportError as exc:
        return check("mpi4py allreduce", "fail" if expect.get("mpi") else "skip", f"no mpi4py: {exc}")
    comm = MPI.COMM_WORLD
    size, total = comm.Get_size(), comm.allreduce(comm.Get_rank() + 1)
    expected = world * (world + 1) // 2
    library = MPI.Get_library_version().strip("\x00 \n").splitlines()[0]
    ok = size == world and total == expected
    detail = f"sum {total} over {size} ranks (expected {expected} over {world}); {library}"
    if size != world:
        detail += "; the launcher did not start the ranks as one MPI job (its PMI does not match the MPI)"
    return check("mpi4py allreduce", "pass" if ok else "fail", detail, sum=total, expected=expected, world=size)


def nccl(expect: dict[str, Any], store: Any, rank: int, local: int, world: int, timeout: float) -> dict[str, Any]:
    torch: Any = importlib.import_module("torch")
    dist: Any = importlib.import_module("torch.distributed")

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        return check("nccl all_reduce", "skip", f"no GPU visible on {socket.gethostname()}")
    if not dist.is_nccl_available():
        why = "this torch was built without NCCL"
        return check("nccl all_reduce", "fail" if expect.get("nccl") else "skip", why)
    device = local % count
    torch.cuda.set_device(device)
    return all_reduce("nccl", store, rank, world, timeout, device=f"cuda:{device}")


def main(argv: list[str]) -> int:
    run_dir, expect = Path(argv[1]), json.loads(argv[2])
    rank, rank_var = _first(RANK_VARS, -1)
    world, _ = _first(SIZE_VARS, int(expect["world_size"]))
    local, _ = _first(LOCAL_VARS, 0)
    result: dict[str, Any] = {
        "rank": rank, "rank_from": rank_var, "world_size": world, "local_rank": local,
        "hostname": socket.gethostname(), "python": sys.executable, "venv": os.environ.get("VIRTUAL_ENV", ""),
        "checks": [],
    }  # fmt: skip
    name = str(rank) if rank >= 0 else f"{socket.gethostname()}-{os.getpid()}"
    out = run_dir / "ranks" / f"rank-{name}.json"
    out.parent.mkdir(exist_ok=True)

    def add(item: dict[str, Any]) -> None:  # written after each check: a rank that dies keeps what it did
        result["checks"].append(item)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)

    if rank < 0:
        add(check("rank", "fail", f"none of {', '.join(RANK_VARS)} is set: not started by a launcher"))
    else:
        run_checks(run_dir, expect, result, add)
    checks = result["checks"]
    print(
        f"rank {rank} on {result['hostname']}: " + ", ".join(f"{c['name']} {c['status']}" for c in checks), flush=True
    )
    return 1 if any(c["status"] == "fail" for c in checks) else 0


def run_checks(
    run_dir: Path, expect: dict[str, Any], result: dict[str, Any], add: Callable[[dict[str, Any]], None]
) -> None:
    """import torch, the rendezvous, then each check in turn (each one's result added as it ends)."""
    rank, world, local = result["rank"], result["world_size"], result["local_rank"]
    timeout = float(expect.get("timeout", 120))
    try:
        result["torch"] = importlib.import_module("torch").__version__
    except Exception as exc:
        add(check("import torch", "fail", f"{sys.executable}: {type(exc).__name__}: {exc}"[-400:]))
        return
    try:
        store = rendezvous(run_dir, rank, world, timeout)
    except Exception as exc:
        add(check("rendezvous", "fail", f"{type(exc).__name__}: {exc}"[-400:]))
    else:
        add(guarded("gloo all_reduce", lambda: all_reduce("gloo", store, rank, world, timeout)))
        add(guarded("nccl all_reduce", lambda: nccl(expect, store, rank, local, world, timeout)))
    try:
        for item in torch_mpi(expect, rank, local, world, timeout):
            add(item)
    except Exception as exc:
        add(check("mpi all_reduce", "fail", _last_line(exc)))
    add(guarded("mpi4py allreduce", lambda: mpi4py_check(expect, rank, world)))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
