"""The all-reduce test: runs ON the host, sent as source on stdin to `PYTHON -`, like host/probe.py.

The controller appends one call, `main(SPEC)`, where the spec says what this node runs:

    {"nproc": 2, "rank_offset": 0, "world_size": 2, "node_rank": 0, "nnodes": 1,
     "master_addr": "127.0.0.1", "master_port": 29500, "env": {"NCCL_NVLS_ENABLE": "0", ...},
     "sizes": [1048576, ...], "iters": 20, "warmup": 5, "timeout": 300, "backend": "nccl"}

It starts one process per local GPU the way torchrun does (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT in each process's environment, on top of `env`), each process all-reduces float32 buffers of
every size with torch.distributed, and it prints one JSON document:

    {"python": "3.12.3", "node_rank": 0,
     "ranks": [{"rank": 0, "local_rank": 0, "exit": 0, "timed_out": false, "device": "NVIDIA H200",
                "log": "...NCCL INFO..."}],
     "result": {"torch": "2.11.0+cu130", "nccl": "2.28.9", "world_size": 2, "dtype": "float32",
                "timing": "cuda-events",
                "rows": [{"bytes": 1048576, "count": 262144, "seconds": 1.4e-05, "wrong": 0}]}}

`result` comes from global rank 0 only (the head node); `seconds` is the slowest rank's mean time of one
all-reduce in a batch of `iters` back to back (HOLD_* below says how it is taken; a row marked
`"late": true` has the host's pace in it). The result is checked on a separate all-reduce before the
batch, on ones (`wrong`: elements that are not the number of ranks). Each process's stdout and stderr
(NCCL's INFO log with NCCL_DEBUG=INFO) go to a file that comes back as `log`; the controller reads the
transport NCCL chose from it.

Workers are forked before anything imports torch or touches CUDA, so each starts clean. The parent
waits at most `timeout` seconds and kills only its own children. Secrets in `env` (the service
environment may hold a token) arrive on stdin, never in argv. Standard library only at import time.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from typing import Any

MAX_LOG = 1 << 20  # per rank; NCCL's INFO log of a 2-node, 16-rank init stays far below


# How a batch is timed, as nccl-tests does: `iters` all-reduces queued back to back between two
# timestamps, one synchronize at the end, the time divided by `iters`. nccl-tests queues one in a few us
# from C, ahead of the GPU; torch.distributed takes 40-50 us from Python, slower than NVLink moves 1-2 MiB,
# so a batch timed as Python queues it times Python. Here the stream waits behind a spin kernel (the
# hold) while the host queues the batch, and CUDA events on the stream time the GPU's part alone. The
# hold lasts HOLD_PER_CALL of host time per all-reduce at a clock of at most HOLD_CLOCK; a batch that the
# GPU reached before the host had queued it all is run again behind a hold HOLD_GROWTH times longer, up
# to HOLD_TRIES runs, and is marked `late` if it never was.
HOLD_PER_CALL = 200e-6
HOLD_CLOCK = 3e9
HOLD_GROWTH = 4
HOLD_TRIES = 3


def _benchmark(spec: dict[str, Any], rank: int, local_rank: int, world_size: int, result_path: str,
               device_path: str) -> None:
    """One rank: join the group, check one all-reduce per size, then time `iters` of them."""
    import datetime

    import torch
    import torch.distributed as dist

    backend = spec.get("backend", "nccl")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:  # gloo on CPU: the same program on a machine without GPUs (the unit tests use it)
        device = torch.device("cpu")
    with open(device_path, "w") as handle:
        handle.write(torch.cuda.get_device_name(device) if backend == "nccl" else "cpu")
    options = {"backend": backend, "init_method": "env://", "rank": rank, "world_size": world_size,
               "timeout": datetime.timedelta(seconds=spec.get("init_timeout", 120))}
    if backend == "nccl":
        try:  # torch >= 2.3: create the communicator now, so a failing transport shows at init
            dist.init_process_group(device_id=device, **options)
        except TypeError:
            dist.init_process_group(**options)
    else:
        dist.init_process_group(**options)

    def synchronize() -> None:
        if backend == "nccl":
            torch.cuda.synchronize(device)

    iters = int(spec["iters"])
    hold = getattr(torch.cuda, "_sleep", None) if backend == "nccl" else None
    hold_cycles = int(HOLD_PER_CALL * (iters + 1) * HOLD_CLOCK)

    def timed_batch(buffer: Any) -> tuple[float, bool]:
        """Seconds of `iters` back-to-back all-reduces on this rank, and whether the GPU reached them
        before the host had queued them all (then the host's pace is in the time)."""
        if hold is not None:
            hold(hold_cycles)
        # Lines the ranks up: the batch starts on every GPU as this all-reduce ends on all of them.
        dist.all_reduce(buffer)
        if backend != "nccl":  # gloo: the host does the work, its clock times it
            started = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buffer)
            return time.perf_counter() - started, False
        event: Any = torch.cuda.Event  # untyped in torch: Any keeps mypy --strict quiet
        start, end = event(enable_timing=True), event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(buffer)
        end.record()
        late = bool(start.query())
        end.synchronize()
        return start.elapsed_time(end) / 1e3, late

    rows = []
    for size in spec["sizes"]:
        count = max(1, int(size) // 4)
        buffer = torch.ones(count, dtype=torch.float32, device=device)
        dist.all_reduce(buffer)  # correctness: every element must now equal the number of ranks
        synchronize()
        wrong = int((buffer != float(world_size)).sum().item())
        buffer.zero_()  # timing on zeros: a sum that never overflows, whatever the iteration count
        for _ in range(spec["warmup"]):
            dist.all_reduce(buffer)
        synchronize()
        for attempt in range(HOLD_TRIES):
            dist.barrier()
            synchronize()
            seconds, late = timed_batch(buffer)
            # The slowest rank's time is the collective's time. Every rank learns whether any was
            # late, so that all of them run the batch again or none does.
            stats = torch.tensor([seconds / iters, float(late)], dtype=torch.float64, device=device)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            late = bool(stats[1].item())
            if not late or hold is None or attempt + 1 == HOLD_TRIES:
                break
            hold_cycles *= HOLD_GROWTH
        wrongs = torch.tensor([float(wrong)], dtype=torch.float64, device=device)
        dist.all_reduce(wrongs)
        row = {"bytes": count * 4, "count": count, "seconds": float(stats[0].item()),
               "wrong": int(wrongs.item())}
        if late:
            row["late"] = True
        rows.append(row)
        del buffer
    if rank == 0:
        nccl = None
        if backend == "nccl":
            version = torch.cuda.nccl.version()
            nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        result = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
                  "backend": backend, "world_size": world_size, "dtype": "float32", "rows": rows,
                  "timing": "cuda-events" if backend == "nccl" else "wall-clock"}
        with open(result_path, "w") as handle:
            json.dump(result, handle)
    dist.destroy_process_group()


def _child(spec: dict[str, Any], rank: int, local_rank: int, log_path: str, result_path: str,
           device_path: str) -> None:
    """In the forked process: output to the log file, torchrun's environment, then the benchmark."""
    descriptor = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    code = 1
    try:
        os.environ.update({str(k): str(v) for k, v in spec.get("env", {}).items()})
        os.environ.update({
            "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(spec["world_size"]),
            "LOCAL_WORLD_SIZE": str(spec["nproc"]), "GROUP_RANK": str(spec.get("node_rank", 0)),
            "MASTER_ADDR": str(spec["master_addr"]), "MASTER_PORT": str(spec["master_port"]),
        })
        _benchmark(spec, rank, local_rank, spec["world_size"], result_path, device_path)
        code = 0
    except BaseException:  # noqa: BLE001  the child reports any failure in its log and exits 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _read_log(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return ""
    if len(data) > MAX_LOG:  # keep the start (init, transports) and the end (the failure)
        data = data[:MAX_LOG // 2] + b"\n[... log cut ...]\n" + data[-MAX_LOG // 2:]
    return data.decode("utf-8", "replace")


def run(spec: dict[str, Any]) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="provision-nccl-")
    result_path = os.path.join(workdir, "result.json")
    children: dict[int, dict[str, Any]] = {}
    try:
        for local_rank in range(spec["nproc"]):
            rank = spec.get("rank_offset", 0) + local_rank
            log_path = os.path.join(workdir, f"rank{rank}.log")
            device_path = os.path.join(workdir, f"rank{rank}.device")
            pid = os.fork()
            if pid == 0:
                _child(spec, rank, local_rank, log_path, result_path, device_path)
            children[pid] = {"rank": rank, "local_rank": local_rank, "exit": None, "timed_out": False,
                             "log_path": log_path, "device_path": device_path}
        deadline = time.monotonic() + spec.get("timeout", 300)
        waiting = set(children)
        while waiting:
            for pid in list(waiting):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    children[pid]["exit"] = os.waitstatus_to_exitcode(status) if hasattr(
                        os, "waitstatus_to_exitcode") else status >> 8
                    waiting.discard(pid)
            if waiting and time.monotonic() > deadline:
                for pid in waiting:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    children[pid]["exit"] = 124
                    children[pid]["timed_out"] = True
                waiting.clear()
            if waiting:
                time.sleep(0.1)
        result: dict[str, Any] | None = None
        if os.path.exists(result_path):
            with open(result_path) as handle:
                result = json.load(handle)
        ranks = []
        for info in sorted(children.values(), key=lambda item: item["rank"]):
            info["log"] = _read_log(info.pop("log_path"))
            info["device"] = _read_log(info.pop("device_path")) or None
            ranks.append(info)
        return {"python": ".".join(str(part) for part in sys.version_info[:3]),
                "node_rank": spec.get("node_rank", 0), "ranks": ranks, "result": result}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(spec: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(run(spec)))
    sys.stdout.write("\n")
