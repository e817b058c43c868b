"""A small, real DDP training script for trying ddptop, with fault injection.

Runs on CPU with the gloo backend (nccl when CUDA is present).  Prints
``step N loss X`` from every rank.

    torchrun --nproc-per-node 2 examples/train_ddp.py --steps 200
    ddptop torchrun --nproc-per-node 2 examples/train_ddp.py --steps 200

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
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import signal
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    p.add_argument("--step-time", type=float, default=0.05, help="extra seconds per step (default 0.05)")
    p.add_argument("--first-step-time", type=float, default=0.0, help="extra seconds before the first step (model load)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--fault", choices=["none", "hang", "p2p-hang", "segv", "straggler", "mismatch"], default="none")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--fault-step", type=int, default=10)
    p.add_argument("--backend", default=None, help="process-group backend (default: nccl with CUDA, else gloo)")
    p.add_argument("--eval-every", type=int, default=0, help="run a fake evaluation every N steps (0: never)")
    p.add_argument("--eval-time", type=float, default=3.0, help="seconds one evaluation takes")
    p.add_argument("--fail", action="store_true", help="raise an exception at the end (non-zero exit)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.nn as nn

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
    model = nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, 1)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    if args.first_step_time:
        time.sleep(args.first_step_time)

    g = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        if rank == args.fault_rank and step == args.fault_step:
            if args.fault == "segv":
                print(f"rank {rank} segfaults now (injected fault)", flush=True)
                ctypes.string_at(0)  # SIGSEGV
                os.kill(os.getpid(), signal.SIGSEGV)
        x = torch.randn(64, 32, generator=g).to(device)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(ddp(x), y)
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


if __name__ == "__main__":
    sys.exit(main())
