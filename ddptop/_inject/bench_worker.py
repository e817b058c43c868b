"""The torch side of ``ddptop bench p2p``: one measurement per process
(``python -m ddptop._inject.bench_worker KIND ...``), its result as one JSON
line on stdout.  ``ddptop.core.tools.p2p_bench`` starts it under a timeout; only
this module imports torch.
"""

from __future__ import annotations

import json
import os
import sys
import time


def _sync(torch):
    """Wait for every GPU: a copy between two GPUs runs on the source's stream."""
    if torch.cuda.is_available():
        for d in range(torch.cuda.device_count()):
            torch.cuda.synchronize(d)


def _timed(torch, fn, reps: int, target: float = 0.1, most: int = 2000) -> tuple[float, int]:
    """(seconds per call of ``fn``, calls timed): at least ``reps`` calls, and
    as many more as fill about ``target`` seconds (judged from the quickest of
    three timed calls after a warm-up), so the first launch and the final
    synchronisation are a small part of the time even on links that move
    256 MiB in a tenth of a millisecond."""
    fn()  # warm-up: the first call pays for set-up (peer access, allocator, caches)
    _sync(torch)
    one = float("inf")
    for _ in range(3):  # the estimate: the quickest of three calls (one may be preempted)
        t0 = time.perf_counter()
        fn()
        _sync(torch)
        one = min(one, time.perf_counter() - t0)
    reps = max(reps, min(most, int(target / one) if one > 0 else most))
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(torch)
    return (time.perf_counter() - t0) / reps, reps


def _worker_main(args: list[str]) -> dict:
    import torch

    kind = args[0]
    if kind == "probe":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        peer = [[bool(i != j and torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]
        dev = ", ".join(torch.cuda.get_device_name(i) for i in range(n)) if n else "CPU (no CUDA GPU)"
        buses = []
        for i in range(n):
            pr = torch.cuda.get_device_properties(i)
            bus = getattr(pr, "pci_bus_id", None)
            buses.append(f"{getattr(pr, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(pr, 'pci_device_id', 0):02x}.0"
                         if bus is not None else None)
        return {"gpus": n, "peer": peer, "buses": buses, "device": f"{n} x {torch.cuda.get_device_name(0)}" if n else dev,
                "why": "" if n else f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}"}
    if kind == "allreduce":
        return _allreduce(int(args[1]), args[2], int(args[3]))
    i, j, mb = int(args[1]), int(args[2]), int(args[3])
    nbytes = mb << 20
    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}")
    if kind == "d2d":
        b = torch.empty_like(a)
        s = _timed(torch, lambda: b.copy_(a), 10)[0]
        return {"bytes": 2 * nbytes, "seconds": s}  # read plus written, as p2pBandwidthLatencyTest counts
    if kind in ("h2d", "d2h"):
        h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        s = _timed(torch, (lambda: a.copy_(h, non_blocking=True)) if kind == "h2d" else
                   (lambda: h.copy_(a, non_blocking=True)), 10)[0]
        return {"bytes": nbytes, "seconds": s}
    if kind == "p2p":
        b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{j}")
        s = _timed(torch, lambda: b.copy_(a, non_blocking=True), 10)[0]
        return {"bytes": nbytes, "seconds": s}
    if kind == "staged":
        h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{j}")

        def staged():
            h.copy_(a, non_blocking=True)
            torch.cuda.synchronize(i)
            b.copy_(h, non_blocking=True)

        s = _timed(torch, staged, 10)[0]
        return {"bytes": nbytes, "seconds": s}
    if kind == "bidir":
        b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{j}")
        a2 = torch.empty_like(a)
        b2 = torch.empty_like(b)
        si, sj = torch.cuda.Stream(i), torch.cuda.Stream(j)

        def both():
            with torch.cuda.stream(si):
                b2.copy_(a, non_blocking=True)
            with torch.cuda.stream(sj):
                a2.copy_(b, non_blocking=True)

        s = _timed(torch, both, 10)[0]
        return {"bytes": 2 * nbytes, "seconds": s}
    if kind == "latency":
        small = torch.empty(4, dtype=torch.uint8, device=f"cuda:{i}")
        dst = torch.empty(4, dtype=torch.uint8, device=f"cuda:{j}")

        def one():
            dst.copy_(small)
            torch.cuda.synchronize(j)

        return {"seconds": _timed(torch, one, 200)[0]}
    raise SystemExit(f"unknown worker kind {kind!r}")


def _allreduce(nranks: int, backend: str, nbytes: int) -> dict:
    import queue
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, nranks, backend, nbytes, port, q), daemon=True)
             for r in range(nranks)]
    for p in procs:
        p.start()
    res: dict[int, dict] = {}

    def dead() -> list[tuple[int, int]]:  # ranks gone without a word (SIGSEGV, the OOM killer)
        return [(r, p.exitcode) for r, p in enumerate(procs) if r not in res and p.exitcode not in (None, 0)]

    while len(res) < nranks:
        try:
            r = q.get(timeout=0.5)
            res[r["rank"]] = r
        except queue.Empty:
            pass
        errs = [r for r in res.values() if "error" in r]
        if not errs and not dead():
            continue
        if errs and not dead():
            time.sleep(1.0)  # a peer's error ("connection closed") often means a rank just died: name that one
        gone = dead()
        for p in procs:  # the others would wait in the collective until their own timeout
            p.kill()
        if gone:
            r, code = gone[0]
            how = f"killed by {_signame(-code)}" if code < 0 else f"exit code {code}"
            raise SystemExit(f"rank {r} died ({how}) during the all-reduce")
        raise SystemExit(f"rank {errs[0]['rank']}: {errs[0]['error']}")
    for p in procs:
        p.join()
    return {"seconds": max(r["seconds"] for r in res.values())}


def _signame(num: int) -> str:
    import signal

    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _allreduce_rank(rank: int, n: int, backend: str, nbytes: int, port: int, q) -> None:
    done = False
    try:
        import datetime

        import torch
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group(backend, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=300))
        dev = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(dev)
        if os.environ.get("DDPTOP_BENCH_HANG_RANK") == str(rank):
            time.sleep(10 ** 6)  # a test's stand-in for a rank that never joins
        if os.environ.get("DDPTOP_BENCH_FAIL_RANK") == str(rank):
            raise RuntimeError("injected failure (a test's stand-in for an NCCL error)")
        if os.environ.get("DDPTOP_BENCH_CRASH_RANK") == str(rank):
            import signal

            os.kill(os.getpid(), signal.SIGSEGV)  # a test's stand-in for a rank that crashes in NCCL
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=dev)
        reps = 20 if nbytes <= 1 << 20 else 5
        dist.all_reduce(x)  # warm-up
        dist.barrier()
        _sync(torch)
        t0 = time.perf_counter()
        for _ in range(reps):
            dist.all_reduce(x)
        _sync(torch)
        q.put({"rank": rank, "seconds": (time.perf_counter() - t0) / reps})
        q.close()
        q.join_thread()  # the result is with the parent before a crash in the teardown could lose it
        done = True
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - the worker process's boundary: reported, never a silent hang of the parent
        if not done:
            q.put({"rank": rank, "error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    print(json.dumps(_worker_main(sys.argv[1:])))
    sys.stdout.flush()
    os._exit(0)
