"""A tiny PyTorch Lightning DDP job (CPU, gloo) for trying ddptop on a framework.

Nothing is downloaded: the model is a small MLP built in code and the data are
random tensors.  Launch it with torchrun (Lightning picks the ranks up from the
torchrun environment):

    torchrun --nproc-per-node 2 examples/frameworks/lightning_job.py --steps 60
    ddptop torchrun --nproc-per-node 2 examples/frameworks/lightning_job.py --steps 200

Options:

  --steps N            max_steps (default 100)
  --step-time S        sleep S seconds in every training_step (default 0.05)
  --hang-rank R --hang-at-batch B
                       a Callback whose on_train_batch_start sleeps forever on
                       rank R when it reaches global batch B (0-based); the other
                       ranks then wait in DDP's gradient all-reduce
  --val-every N --val-time S
                       run validation every N training batches; each validation
                       lasts about S seconds in all (validation_step computes, no
                       output: the "healthy, quiet validation phase")
  --ckpt-every N --ckpt-time S
                       save a checkpoint every N training batches (default 20 when
                       --ckpt-time is given); rank 0's write lasts S seconds (slow
                       storage: its first write blocks, inside torch.save) while the
                       other ranks wait in Lightning's barrier after the save
  --quiet              don't print this script's own lines (the first-step marker,
                       "hanging ...", "writing checkpoint ...")
  --out-dir DIR        where checkpoints go (default: $TMPDIR/ddptop-lightning-job)

Lightning's progress bar is left at its default; when stdout is not a terminal it
prints little (see the notes in the report that goes with these examples).
"""

from __future__ import annotations

import time

_T0 = time.time()  # before the heavy imports: start-up is measured from here

import argparse
import os
import tempfile

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.strategies import DDPStrategy

FEATURES = 32
BATCH = 16
VAL_BATCHES_PER_RANK = 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="max_steps")
    p.add_argument("--step-time", type=float, default=0.05, help="sleep per training batch (s)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--hang-rank", type=int, default=None)
    p.add_argument("--hang-at-batch", type=int, default=None)
    p.add_argument("--val-every", type=int, default=None, help="validate every N training batches")
    p.add_argument("--val-time", type=float, default=2.0, help="length of one validation (s)")
    p.add_argument("--ckpt-every", type=int, default=None, help="checkpoint every N training batches")
    p.add_argument("--ckpt-time", type=float, default=None, help="length of rank 0's checkpoint write (s)")
    p.add_argument("--out-dir", default=os.path.join(tempfile.gettempdir(), "ddptop-lightning-job"))
    p.add_argument("--quiet", action="store_true", help="no lines of this script's own")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if (a.hang_rank is None) != (a.hang_at_batch is None):
        p.error("--hang-rank and --hang-at-batch go together")
    if a.ckpt_time is not None and a.ckpt_every is None:
        a.ckpt_every = 20
    return a


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


QUIET = False



def compute(seconds: float) -> None:
    """Work for ``seconds``: a slow evaluation computes (it does not sleep)."""
    end = time.monotonic() + seconds
    x = torch.randn(64, 64)
    while time.monotonic() < end:
        x = torch.tanh(x @ x)

def say(msg: str) -> None:
    if not QUIET:
        print(msg, flush=True)


class TinyMLP(pl.LightningModule):
    def __init__(self, hidden: int, step_time: float, val_time: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.step_time = step_time
        self.val_time = val_time

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.step_time > 0:
            time.sleep(self.step_time)
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        # the whole validation (VAL_BATCHES_PER_RANK batches) lasts about val_time
        compute(self.val_time / VAL_BATCHES_PER_RANK)
        loss = nn.functional.mse_loss(self(x), y)
        self.log("val_loss", loss, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class HangCallback(Callback):
    """Sleeps forever in on_train_batch_start on one rank at one batch."""

    def __init__(self, rank: int, at_batch: int):
        self.rank = rank
        self.at_batch = at_batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == self.rank and trainer.global_step >= self.at_batch:
            say(f"[rank {trainer.global_rank}] hanging in on_train_batch_start at batch {trainer.global_step}")
            while True:
                time.sleep(1)


class FirstBatchMarker(Callback):
    """Prints one line on rank 0 when the first training batch starts."""

    def __init__(self):
        self.done = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.done and trainer.global_rank == 0:
            self.done = True
            say(f"[rank 0] first training batch, {time.time() - _T0:.1f} s after the script started")


class SlowCheckpointIO(TorchCheckpointIO):
    """A checkpoint write that takes ``seconds`` (called on rank 0 only, by Lightning)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        say(f"[rank {_rank()}] writing checkpoint {path} ({self.seconds:g} s)")
        os.makedirs(os.path.dirname(str(path)) or ".", exist_ok=True)
        with open(path, "wb") as f:
            torch.save(checkpoint, SlowStorage(f, self.seconds))  # the time goes where a slow disk puts it
        say(f"[rank {_rank()}] checkpoint written")


class SlowStorage:
    """A file on slow storage: the first write blocks ``seconds``, inside torch.save."""

    def __init__(self, f, seconds: float):
        self.f = f
        self.delay = seconds

    def write(self, b):
        if self.delay:
            time.sleep(self.delay)
            self.delay = 0
        return self.f.write(b)

    def flush(self):
        self.f.flush()


def main(argv=None):
    a = parse_args(argv)
    global QUIET
    QUIET = a.quiet
    pl.seed_everything(a.seed + _rank(), verbose=False)  # different data per rank, like a sampler would give
    n_devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    n_nodes = max(1, int(os.environ.get("WORLD_SIZE", "1")) // n_devices)

    # Enough training batches per rank that --steps fits in one epoch
    # (DistributedSampler splits the set between the ranks).
    world = n_devices * n_nodes
    n_train = BATCH * world * (a.steps + 8)
    g = torch.Generator().manual_seed(a.seed)
    x = torch.randn(n_train, FEATURES, generator=g)
    y = x[:, :1] * 0.5 + 0.1 * torch.randn(n_train, 1, generator=g)
    train = DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)

    model = TinyMLP(a.hidden, a.step_time, a.val_time)
    callbacks = [FirstBatchMarker()]
    plugins = []
    val = None
    if a.hang_rank is not None:
        callbacks.append(HangCallback(a.hang_rank, a.hang_at_batch))
    if a.val_every:
        n_val = BATCH * world * VAL_BATCHES_PER_RANK
        xv = torch.randn(n_val, FEATURES, generator=g)
        val = DataLoader(TensorDataset(xv, xv[:, :1] * 0.5), batch_size=BATCH)
    if a.ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=os.path.join(a.out_dir, "checkpoints"),
                                         every_n_train_steps=a.ckpt_every, save_top_k=-1,
                                         save_on_train_epoch_end=False))
        if a.ckpt_time:
            plugins.append(SlowCheckpointIO(a.ckpt_time))

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=n_devices,
        num_nodes=n_nodes,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=a.steps,
        max_epochs=1,  # the data set holds more than --steps batches per rank
        val_check_interval=a.val_every if a.val_every else None,
        check_val_every_n_epoch=None if a.val_every else 1,
        limit_val_batches=VAL_BATCHES_PER_RANK if a.val_every else 0,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        plugins=plugins or None,
        enable_checkpointing=bool(a.ckpt_every),
        logger=False,
        default_root_dir=a.out_dir,
        log_every_n_steps=10,
    )
    t0 = time.time()
    trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
    if trainer.global_rank == 0:
        say(f"done: {trainer.global_step} steps in {time.time() - t0:.1f} s (fit)")


if __name__ == "__main__":
    main()
