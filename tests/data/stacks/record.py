"""Re-record the py-spy dumps in this folder (not a test; needs py-spy + ptrace).

    python tests/data/stacks/record.py [scenario ...]

Each scenario starts small real Python programs (single process, or 2 gloo
ranks on CPU), waits until they reach the point of interest, takes two
``py-spy dump`` samples >= 1 s apart per process, writes
``<scenario>.r<rank>.<n>.txt`` and kills everything it started.

The ``cuda_*`` scenarios run on the CUDA runtime stand-in
(examples/sim_cuda.py, built with gcc on first use) and are dumped with
``--native``: a rank waiting at ``cudaStreamSynchronize`` spinning (the
default) or asleep (blocking sync), and a rank deadlocked on the CUDA
driver's lock in ``cudaEventDestroy``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[2] / "examples"
TIMEOUT = 120

PROGRAMS = {
    # --- single process -------------------------------------------------
    "queue_get": """
        import queue, sys
        def wait_for_batch(q):
            ready()
            return q.get()
        wait_for_batch(queue.Queue())
    """,
    "lock_acquire": """
        import threading, time
        lock = threading.Lock()
        def holder():
            with lock:
                time.sleep(600)
        def update_shared_state():
            ready()
            with lock:
                pass
        t = threading.Thread(target=holder, name="holder", daemon=True)
        t.start()
        time.sleep(0.2)
        update_shared_state()
    """,
    "busy_loop": """
        import math
        def crunch(n):
            total = 0.0
            i = 0
            ready()
            while True:
                i += 1
                total += math.sqrt(i)
                if i % 3 == 0:
                    total -= 1.0
                for j in range(50):
                    total += j * 0.5
        crunch(10)
    """,
    "busy_steps": """
        def score(batch):
            return sum(x * x for x in batch)
        def normalise(batch):
            total = score(batch)
            return [x / total for x in batch]
        def epoch_loop():
            batch = list(range(1, 2000))
            ready()
            while True:
                batch = normalise(batch)
                batch = [x + 1.0 for x in batch]
        epoch_loop()
    """,
    "sleep_callback": """
        import time
        class Callback:
            def on_train_batch_start(self, trainer, batch_idx):
                pass
        class HangAt(Callback):
            def __init__(self, step):
                self.step = step
            def on_train_batch_start(self, trainer, batch_idx):
                if batch_idx == self.step:
                    ready()
                    time.sleep(3600)
        class Trainer:
            def __init__(self, callbacks):
                self.callbacks = callbacks
            def _call_callbacks(self, hook, *args):
                for cb in self.callbacks:
                    getattr(cb, hook)(self, *args)
            def fit(self):
                for batch_idx in range(100):
                    self._call_callbacks("on_train_batch_start", batch_idx)
        Trainer([HangAt(3)]).fit()
    """,
    "queue_get_json": """
        import queue
        def wait_for_batch(q):
            ready()
            return q.get(timeout=3600)
        wait_for_batch(queue.Queue())
    """,
    # --- 2 gloo ranks -------------------------------------------------------
    "gloo_allreduce": """
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        def slow_step():
            ready()
            time.sleep(3600)
        t = torch.ones(4)
        if rank == 1:
            slow_step()
        ready()
        dist.all_reduce(t)
    """,
    "gloo_barrier": """
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        def save_checkpoint_rank1():
            ready()
            time.sleep(3600)
        if rank == 1:
            save_checkpoint_rank1()
        ready()
        dist.barrier()
    """,
    "gloo_recv_deadlock": """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        def exchange(t):
            # both ranks receive first: a classic p2p deadlock
            ready()
            dist.recv(t, src=1 - rank)
            dist.send(t, dst=1 - rank)
        exchange(torch.zeros(4))
    """,
    "ddp_backward": """
        import time, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        def on_step(step):
            if rank == 1 and step == 2:
                ready()
                time.sleep(3600)
        def train():
            for step in range(1000):
                x = torch.randn(8, 16)
                loss = model(x).pow(2).mean()
                on_step(step)
                opt.zero_grad()
                if step == 2:
                    ready()
                loss.backward()
                opt.step()
        train()
    """,
    "ddp_healthy": """
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.001)
        def train():
            for step in range(10**9):
                if step == 5:
                    ready()
                x = torch.randn(32, 64)
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        train()
    """,
    "fsdp_allgather": """
        import time, torch, torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        def load_next_batch(step):
            if rank == 1 and step == 2:
                ready()
                time.sleep(3600)
            return torch.randn(8, 16)
        def train():
            for step in range(1000):
                x = load_next_batch(step)
                if step == 2:
                    ready()
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        train()
    """,
    "loop_locals": """
        import time, torch
        def train():
            for step in range(10**9):
                x = torch.randn(8, 8)
                loss = (x @ x).sum()
                if step == 3:
                    ready()
                time.sleep(0.2)  # a healthy step spends its time on this line
        train()
    """,
    "slow_checkpoint": """
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        class SlowDisk:
            # a file on slow storage: every write takes a while
            def __init__(self, f):
                self.f = f
            def write(self, b):
                time.sleep(3600)
                return self.f.write(b)
            def flush(self):
                self.f.flush()
        def save_checkpoint(state):
            with open(os.devnull, "wb") as f:
                torch.save(state, SlowDisk(f))
        if rank == 0:
            ready()
            save_checkpoint({"w": torch.zeros(1000)})
        ready()
        dist.barrier()
    """,
    # --- 2 gloo ranks on the CUDA runtime stand-in (dumped with --native) ---
    # rank 1 is stuck in Python before its all-reduce; rank 0's all-reduce is a kernel
    # on its stream, and rank 0 waits at the line that synchronises with the stream
    "cuda_spin_sync": """
        import sys, time, torch, torch.distributed as dist
        sys.path.insert(0, os.environ["EXAMPLES_DIR"])
        import sim_cuda
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        cudart, why = sim_cuda.load()
        cudart.cudaSetDevice(rank)
        stream = sim_cuda.Stream(cudart)
        def load_batch():
            ready()
            time.sleep(3600)
        def train_step(grad):
            stream.collective(dist.all_reduce(grad, async_op=True))
            ready()
            cudart.cudaStreamSynchronize(stream.handle)  # = loss.item() on a GPU: spins
        if rank == 1:
            load_batch()
        train_step(torch.ones(4))
    """,
    "cuda_blocking_sync": """
        import sys, time, torch, torch.distributed as dist
        sys.path.insert(0, os.environ["EXAMPLES_DIR"])
        import sim_cuda
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        cudart, why = sim_cuda.load()
        cudart.cudaSetDevice(rank)
        cudart.cudaSetDeviceFlags(sim_cuda.cudaDeviceScheduleBlockingSync)
        stream = sim_cuda.Stream(cudart)
        def load_batch():
            ready()
            time.sleep(3600)
        def train_step(grad):
            stream.collective(dist.all_reduce(grad, async_op=True))
            ready()
            cudart.cudaStreamSynchronize(stream.handle)  # = loss.item() on a GPU: sleeps
        if rank == 1:
            load_batch()
        train_step(torch.ones(4))
    """,
    # rank 1: a host function written in Python runs on its stream (the driver's lock
    # held, it needs the GIL) while the main thread, holding the GIL, frees an event
    # (cudaEventDestroy waits for the driver's lock): deadlocked; rank 0 spins at its sync
    "cuda_driver_lock": """
        import ctypes, functools, sys, threading, time, torch, torch.distributed as dist
        sys.path.insert(0, os.environ["EXAMPLES_DIR"])
        import sim_cuda
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        cudart, why = sim_cuda.load()
        cudart.cudaSetDevice(rank)
        cudart_gil = sim_cuda.with_gil(cudart)  # calls that keep the GIL
        stream = sim_cuda.Stream(cudart)
        def log_metrics(started):  # a host function in Python
            started.set()
            while True:
                time.sleep(0.01)
        def release_timer(timer):
            ready()
            cudart_gil.cudaEventDestroy(timer)  # = del a torch.cuda.Event, the GIL held
        def train_step(grad):
            stream.collective(dist.all_reduce(grad, async_op=True))
            ready()
            cudart.cudaStreamSynchronize(stream.handle)
        if rank == 1:
            timer = ctypes.c_void_p()
            cudart.cudaEventCreate(ctypes.byref(timer))
            started = threading.Event()
            stream.enqueue(functools.partial(log_metrics, started))
            started.wait()
            release_timer(timer)
        train_step(torch.ones(4))
    """,
}
WORLD = {"gloo_allreduce": 2, "gloo_barrier": 2, "gloo_recv_deadlock": 2, "ddp_backward": 2, "ddp_healthy": 2, "fsdp_allgather": 2, "slow_checkpoint": 2,
         "cuda_spin_sync": 2, "cuda_blocking_sync": 2, "cuda_driver_lock": 2}
EXTRA = {"queue_get_json": ["--json"], "sleep_callback": ["--locals"], "gloo_barrier": ["--full-filenames"], "ddp_backward": ["--nonblocking"], "slow_checkpoint": ["--full-filenames", "--nonblocking"],
         "loop_locals": ["--full-filenames", "--nonblocking", "--locals"],
         **{name: ["--native", "--full-filenames"] for name in ("cuda_spin_sync", "cuda_blocking_sync", "cuda_driver_lock")}}

PRELUDE = """
import os, pathlib
def ready():
    pathlib.Path(os.environ["READY_FILE"]).touch()
"""


def py_spy() -> str:
    """py-spy beside this Python (a virtual environment's), else the one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy") or "py-spy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(name: str) -> None:
    world = WORLD.get(name, 1)
    tmp = Path(tempfile.mkdtemp(prefix=f"rec_{name}_"))
    script = tmp / "train.py"
    script.write_text(PRELUDE + textwrap.dedent(PROGRAMS[name]))
    port = free_port()
    procs = []
    try:
        for rank in range(world):
            env = dict(os.environ, READY_FILE=str(tmp / f"ready{rank}"), RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1",
                       EXAMPLES_DIR=str(EXAMPLES))
            procs.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp))
        deadline = time.monotonic() + TIMEOUT
        while not all((tmp / f"ready{r}").exists() for r in range(world)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{name}: programs did not get ready")
            time.sleep(0.1)
        time.sleep(1.5)
        for n in (1, 2):
            for rank, p in enumerate(procs):
                cmd = [py_spy(), "dump", "--pid", str(p.pid), *EXTRA.get(name, [])]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                if r.returncode != 0:
                    raise RuntimeError(f"{name}: {r.stderr}")
                (HERE / f"{name}.r{rank}.{n}.{'json' if '--json' in cmd else 'txt'}").write_text(r.stdout)
            if n == 1:
                time.sleep(1.2)
        print(f"recorded {name}")
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)


if __name__ == "__main__":
    for name in sys.argv[1:] or PROGRAMS:
        record(name)
