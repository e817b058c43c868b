"""A small, real DDP training script for trying ddptop, with fault injection.

Runs on CPU with the gloo backend (nccl when CUDA is present).  Prints
``step N loss X`` from every rank.

    torchrun --nproc-per-node 2 examples/train_ddp.py --steps 200
    ddptop torchrun --nproc-per-node 2 examples/train_ddp.py --steps 200
    torchrun --nproc-per-node 2 examples/train_ddp.py --sim-cuda on --gpu-step-time 0.2:0.5 --fault hang
    torchrun --nproc-per-node 2 examples/train_ddp.py --sim-cuda on --sim-cuda-sync blocking --fault driver-lock

Faults (``--fault KIND --fault-rank R --fault-step S``):

  p2p-hang   like hang, unless NCCL_P2P_DISABLE=1 is set (a stand-in for the
             broken-P2P hang, testable on CPU: the p2p-off profile fixes it)
  hang       rank R stops at step S; the others wait in the all-reduce
             *spinning* (busy-polling the pending work, as NCCL kernels spin
             on a GPU), so their CPU (or simulated GPU) reads ~100%
  segv       rank R dies of SIGSEGV at step S
  straggler  rank R becomes 5x slower from step S
  mismatch   rank R builds a model with a different shape (DDP parameter
             mismatch at start-up)
  unused-param
             from step S the model's second head gets no gradient on any rank
             (DDP without find_unused_parameters fails at the next step)
  worker-killed
             at step S, rank R's data-loader worker is killed with SIGKILL,
             as the kernel's OOM killer does when workers exhaust host memory
             (uses a data loader with --workers, at least 1)
  die        rank R exits at once (exit code 1) at step S
  other-collective
             rank R all-gathers a metric at step S while the others all-reduce
             (a collective only one rank enters; 3 ranks or more)
  driver-lock
             --sim-cuda only (below)

--sim-cuda on|auto (default off) runs the NCCL form of these faults on a CPU,
with a stand-in for the CUDA runtime (sim_cuda.py, built with gcc on first
use; auto: the plain gloo form when there is no C compiler).  As with NCCL,
collectives are asynchronous: each gradient's all-reduce (gloo, async_op) is
a "kernel" on a CUDA stream that keeps the (simulated) GPU busy until it
completes, the optimizer step runs on the stream after them, and the rank
waits for the stream at its synchronisation line (cudaStreamSynchronize,
where loss.item() waits on a GPU) inside libcudart.so.12.  No DDP wrapper
(DDP's reducer blocks in backward under gloo, NCCL's does not).  A collective
that fails (a dead peer, a mismatch) never completes, as an NCCL kernel spins
until the watchdog.

--sim-cuda-sync spin|blocking (default spin) is how a rank waits there:
  spin       cudaDeviceScheduleSpin, CUDA's default: the waiting thread
             busy-polls, ~100% CPU, "active" to py-spy
  blocking   cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync), and the
             metrics event made blocking (torch.cuda.Event(blocking=True)):
             the waiting thread sleeps in pthread_cond_wait under the CUDA
             call, 0% CPU, "idle" to py-spy, while its GPU reads busy

There the faults are:

  hang       rank R is stuck in data loading at step S, before its
             all-reduce; the others wait at the sync line
  other-collective
             rank R all-gathers a metric and waits at the metrics sync line;
             the others all-reduce and wait at the usual sync line
  p2p-hang   every rank's collective of step S never completes (unless
             NCCL_P2P_DISABLE=1), all ranks wait at the sync; with
             --fault-step 1, the broken-P2P start-up hang (no step printed)
  die        rank R exits at step S; the others wait at the sync line
             (until torchrun stops them: see --monitor-interval)
  driver-lock
             rank R deadlocks in the CUDA driver at step S, before its
             all-reduce: a host function written in Python runs on the
             stream (holding the driver's lock, it needs the GIL) while the
             rank, holding the GIL, releases a CUDA event through a call that
             keeps the GIL (cudaEventDestroy waits for the driver's lock);
             the others wait at the sync line (--sim-cuda only)
  straggler, segv, worker-killed   as above
  --gpu-step-time MIN[:MAX]   each step's "GPU work" takes MIN..MAX seconds
             (random, the same on every rank): a kernel that keeps the
             simulated GPU busy while the rank waits at the sync
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import functools
import os
import random
import signal
import sys
import threading
import time

import torch
import torch.nn as nn


def learning_rate(hidden: int) -> float:
    """0.01 at the default width, less for wider layers (a fixed 0.01 diverges to nan from about 1,024)."""
    return 0.01 * min(1.0, 64 / hidden)


class TwoHeads(nn.Module):
    """A small MLP with two heads, added (one is left out by --fault unused-param)."""

    def __init__(self, hidden):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 1)
        self.head2 = nn.Linear(hidden, 1)

    def forward(self, x, both=True):
        h = self.body(x)
        return self.head(h) + self.head2(h) if both else self.head(h)


class Batches(torch.utils.data.IterableDataset):
    """Random batches, different on every rank; with data-loader workers, each
    worker makes every n-th batch."""

    def __init__(self, rank, steps):
        self.rank, self.steps = rank, steps

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, n = (info.id, info.num_workers) if info else (0, 1)
        g = torch.Generator()
        for i in range(worker, self.steps, n):
            g.manual_seed(self.rank * 1_000_003 + i)
            x = torch.randn(64, 32, generator=g)
            # as plain numbers: a tensor would travel as a file descriptor the
            # worker serves, and --fault worker-killed would race that transfer
            yield x.tolist() if info else x


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    p.add_argument("--step-time", type=float, default=0.05, help="extra seconds per step (default 0.05)")
    p.add_argument("--first-step-time", type=float, default=0.0, help="extra seconds before the first step (model load)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--fault", choices=["none", "hang", "p2p-hang", "segv", "straggler", "mismatch",
                                           "unused-param", "worker-killed", "die", "other-collective", "driver-lock"],
                   default="none")
    p.add_argument("--workers", type=int, default=0, help="data-loader worker processes per rank (default 0)")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--backend", default=None, help="process-group backend (default: nccl with CUDA, else gloo)")
    p.add_argument("--eval-every", type=int, default=0, help="run a fake evaluation every N steps (0: never)")
    p.add_argument("--eval-time", type=float, default=3.0, help="seconds one evaluation takes")
    p.add_argument("--fail", action="store_true", help="raise an exception at the end (non-zero exit)")
    p.add_argument("--sim-cuda", choices=["off", "auto", "on"], default="off",
                   help="NCCL-like asynchronous collectives on a stand-in CUDA runtime (default off; see above)")
    p.add_argument("--sim-cuda-sync", choices=["spin", "blocking"], default="spin",
                   help="with --sim-cuda: how a rank waits at its CUDA sync (default spin; see above)")
    p.add_argument("--gpu-step-time", type=gpu_step_time, default=None, metavar="MIN[:MAX]",
                   help="with --sim-cuda: seconds of simulated GPU work per step")
    args = p.parse_args(argv)
    if args.sim_cuda == "off" and args.gpu_step_time:
        p.error("--gpu-step-time needs --sim-cuda auto or on")
    if args.sim_cuda == "off" and args.sim_cuda_sync != "spin":
        p.error("--sim-cuda-sync needs --sim-cuda auto or on")
    if args.sim_cuda == "off" and args.fault == "driver-lock":
        p.error("--fault driver-lock needs --sim-cuda auto or on (a CUDA runtime stand-in)")
    if args.sim_cuda != "off" and args.fault in ("mismatch", "unused-param"):
        p.error(f"--fault {args.fault} trips a DDP check; --sim-cuda runs without DDP")
    return args


def gpu_step_time(text):
    lo, _, hi = text.partition(":")
    try:
        lo, hi = float(lo), float(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not MIN[:MAX] in seconds: {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"need 0 <= MIN <= MAX: {text!r}")
    return lo, hi


def main(argv=None):
    args = parse_args(argv)
    if args.sim_cuda != "off":
        import sim_cuda

        cudart, why = sim_cuda.load()
        if cudart is not None:
            return train_sim_cuda(args, sim_cuda, cudart)
        if args.sim_cuda == "on" or args.fault == "driver-lock":
            sys.exit(f"--sim-cuda {args.sim_cuda}: no CUDA runtime stand-in: {why}")
        print(f"--sim-cuda auto: no CUDA runtime stand-in ({why}); running the gloo (blocking) form instead", flush=True)
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    backend = args.backend or ("nccl" if cuda else "gloo")
    device = torch.device(f"cuda:{local_rank}" if cuda and backend == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    print(f"rank {rank}/{world} up on {device} (backend {backend}, pid {os.getpid()})", flush=True)

    torch.manual_seed(0)
    hidden = args.hidden
    if args.fault == "mismatch" and rank == args.fault_rank:
        hidden += 1
    model = TwoHeads(hidden).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=learning_rate(args.hidden))
    if args.first_step_time:
        time.sleep(args.first_step_time)

    workers = max(args.workers, 1 if args.fault == "worker-killed" else 0)
    batches = iter(torch.utils.data.DataLoader(Batches(rank, args.steps), batch_size=None, num_workers=workers))
    for step in range(1, args.steps + 1):
        if rank == args.fault_rank and step == args.fault_step:
            if args.fault == "die":
                print(f"rank {rank} exits now (injected fault)", flush=True)
                os._exit(1)
            if args.fault == "segv":
                print(f"rank {rank} segfaults now (injected fault)", flush=True)
                ctypes.string_at(0)  # SIGSEGV
                os.kill(os.getpid(), signal.SIGSEGV)
            if args.fault == "worker-killed":
                import psutil

                for w in psutil.Process().children():
                    print(f"rank {rank} kills its data-loader worker {w.pid} (injected fault)", flush=True)
                    w.kill()
        x = torch.as_tensor(next(batches)).to(device)
        y = x.sum(dim=1, keepdim=True)
        both = not (args.fault == "unused-param" and step >= args.fault_step)
        loss = nn.functional.mse_loss(ddp(x, both), y)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        p2p_hang = args.fault == "p2p-hang" and os.environ.get("NCCL_P2P_DISABLE") != "1"
        if (args.fault == "hang" or p2p_hang) and rank == args.fault_rank and step == args.fault_step:
            # the others finish this step's backward with us, then wait for us
            # in the all-reduce below, spinning
            print(f"rank {rank} hangs now (injected fault)", flush=True)
            while True:
                time.sleep(3600)
        # a small explicit collective every step, polled busily like a GPU kernel
        t = torch.tensor([loss.item()], device=device)
        if args.fault == "other-collective" and rank == args.fault_rank and step == args.fault_step:
            print(f"rank {rank} all-gathers a metric alone now (injected fault)", flush=True)
            work = dist.all_gather([torch.zeros_like(t) for _ in range(world)], t, async_op=True)
        else:
            work = dist.all_reduce(t, async_op=True)
        if device.type == "cpu":
            while not work.is_completed():
                pass
        work.wait()
        mean = t.item() / world
        print(f"step {step} loss {loss.item():.4f} mean_loss {mean:.4f}", flush=True)
        if args.eval_every and step % args.eval_every == 0:
            # a pause in training that shows other progress: an eval bar updating in place
            n = 20
            for i in range(1, n + 1):
                time.sleep(args.eval_time / n)
                end = "\n" if i == n else "\r"
                print(f"Evaluating: {100 * i // n:3d}%| {i}/{n} [00:0{i % 10}<00:00, 6.67it/s]", end=end, file=sys.stderr, flush=True)
            dist.barrier()
        delay = args.step_time
        if args.fault == "straggler" and rank == args.fault_rank and step >= args.fault_step:
            delay *= 5
        if delay:
            time.sleep(delay)
    dist.barrier()
    if rank == 0:
        print("training done", flush=True)
    dist.destroy_process_group()
    if args.fail:
        raise RuntimeError("failing on purpose (--fail)")


def next_batch(batches, stuck=False):
    """The next batch.  ``stuck`` (--sim-cuda --fault hang): it never comes, as
    with a read from a file system that stopped answering."""
    while stuck:
        time.sleep(86400)
    return torch.as_tensor(next(batches))


def host_callback(started):
    """A host function written in Python (``cudaLaunchHostFunc`` through a ctypes
    callback, as numba's ``Stream.add_callback`` and CuPy's ``launch_host_func``
    run one): the driver runs it on its own thread, holding its lock, and every
    Python line of it needs the GIL.  It takes a while (host-side bookkeeping,
    in slices: the GIL is given back and taken again after each)."""
    started.set()
    for _ in range(200):
        time.sleep(0.01)


def deadlock_on_the_driver_lock(sim_cuda, cudart, stream):
    """--sim-cuda --fault driver-lock: the GIL and the CUDA driver's lock taken in
    opposite orders by two threads.  A Python host function runs on the stream
    (the driver's thread holds the driver's lock, then needs the GIL); this
    thread, holding the GIL, frees a CUDA event through a call that keeps the GIL
    (a C extension that does not release it: torch.cuda.Event's destructor did
    so before pytorch#119393), and cudaEventDestroy waits for the driver's lock.
    Neither thread can go on: this one blocks in pthread_rwlock_wrlock inside
    cudaEventDestroy for good.  (Unless this thread lost the CPU for the host
    function's whole 2 s between the two lines: then it tries again.)"""
    cudart_gil = sim_cuda.with_gil(cudart)  # ctypes.PyDLL: its calls keep the GIL
    while True:
        timer = ctypes.c_void_p()
        cudart.cudaEventCreateWithFlags(ctypes.byref(timer), sim_cuda.cudaEventDisableTiming)
        started = threading.Event()
        stream.enqueue(functools.partial(host_callback, started))
        started.wait()
        cudart_gil.cudaEventDestroy(timer)  # = `del timer` of a torch.cuda.Event: the driver's lock, with the GIL


def train_sim_cuda(args, sim_cuda, cudart):
    """The training loop as on GPUs with NCCL (--sim-cuda): collectives are
    asynchronous kernels on a CUDA stream, and the rank waits (spinning, or asleep
    with --sim-cuda-sync blocking) at its synchronisation lines, here on the CUDA
    runtime stand-in (see sim_cuda.py)."""
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=30))
    print(f"rank {rank}/{world} up on cpu (backend gloo, simulated CUDA stream, pid {os.getpid()})", flush=True)

    cudart.cudaSetDevice(local_rank)  # = torch.cuda.set_device(local_rank)
    blocking = args.sim_cuda_sync == "blocking"
    cudart.cudaSetDeviceFlags(sim_cuda.cudaDeviceScheduleBlockingSync if blocking else sim_cuda.cudaDeviceScheduleSpin)
    torch.manual_seed(0)
    model = TwoHeads(args.hidden)  # the same weights on every rank, so no DDP wrapper
    opt = torch.optim.SGD(model.parameters(), lr=learning_rate(args.hidden))
    params = list(model.parameters())
    stream = sim_cuda.Stream(cudart)
    metrics_done = ctypes.c_void_p()  # = torch.cuda.Event(blocking=blocking)
    cudart.cudaEventCreateWithFlags(ctypes.byref(metrics_done), sim_cuda.cudaEventDisableTiming
                                    | (sim_cuda.cudaEventBlockingSync if blocking else 0))
    if args.first_step_time:
        time.sleep(args.first_step_time)

    def optimizer_step():  # a kernel after the all-reduces: average the summed gradients, step
        for p in params:
            p.grad.div_(world)
        opt.step()

    p2p_broken = args.fault == "p2p-hang" and os.environ.get("NCCL_P2P_DISABLE") != "1"
    workers = max(args.workers, 1 if args.fault == "worker-killed" else 0)
    batches = iter(torch.utils.data.DataLoader(Batches(rank, args.steps), batch_size=None, num_workers=workers))
    for step in range(1, args.steps + 1):
        fault = args.fault if rank == args.fault_rank and step == args.fault_step else None
        if fault == "die":
            print(f"rank {rank} exits now (injected fault)", flush=True)
            os._exit(1)
        if fault == "segv":
            print(f"rank {rank} segfaults now (injected fault)", flush=True)
            ctypes.string_at(0)  # SIGSEGV
            os.kill(os.getpid(), signal.SIGSEGV)
        if fault == "worker-killed":
            import psutil

            for w in psutil.Process().children():
                print(f"rank {rank} kills its data-loader worker {w.pid} (injected fault)", flush=True)
                w.kill()
        if fault == "hang":
            print(f"rank {rank} hangs now (injected fault)", flush=True)
        x = next_batch(batches, stuck=fault == "hang")
        if args.gpu_step_time:  # this step's forward and backward kernels, as long on every rank
            stream.run(random.Random(step).uniform(*args.gpu_step_time))
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if fault == "driver-lock":
            print(f"rank {rank} deadlocks on the CUDA driver's lock now (injected fault)", flush=True)
            deadlock_on_the_driver_lock(sim_cuda, cudart, stream)
        if fault == "other-collective":
            # a metric gathered on this rank alone: its all-gather meets the others' all-reduce
            print(f"rank {rank} all-gathers a metric alone now (injected fault)", flush=True)
            metric = loss.detach().reshape(1)
            gathered = [torch.zeros_like(metric) for _ in range(world)]
            stream.collective(dist.all_gather(gathered, metric, async_op=True))
            cudart.cudaEventRecord(metrics_done, stream.handle)
            cudart.cudaEventSynchronize(metrics_done)  # = metric.item() on a GPU
            print(f"step {step} gathered {[round(g.item(), 4) for g in gathered]}", flush=True)
        mean = loss.detach().reshape(1).clone()
        works = [dist.all_reduce(p.grad, async_op=True) for p in params] + [dist.all_reduce(mean, async_op=True)]
        if p2p_broken and step == args.fault_step:  # the broken P2P transport: this collective's kernel never ends
            stream.hang()
        for work in works:
            stream.collective(work)
        stream.enqueue(optimizer_step)
        cudart.cudaStreamSynchronize(stream.handle)  # = loss.item() on a GPU: waits for the step's kernels
        print(f"step {step} loss {loss.item():.4f} mean_loss {mean.item() / world:.4f}", flush=True)
        if args.eval_every and step % args.eval_every == 0:
            time.sleep(args.eval_time)  # a pause in training
            dist.barrier()
        delay = args.step_time
        if args.fault == "straggler" and rank == args.fault_rank and step >= args.fault_step:
            delay *= 5  # in Python, between steps: a slow rank, not a slow GPU
        if delay:
            time.sleep(delay)
    dist.barrier()
    if rank == 0:
        print("training done", flush=True)
    stream.destroy()
    dist.destroy_process_group()
    if args.fail:
        raise RuntimeError("failing on purpose (--fail)")


if __name__ == "__main__":
    sys.exit(main())
