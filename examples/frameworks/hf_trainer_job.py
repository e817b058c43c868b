"""A tiny Hugging Face Trainer DDP job (CPU, gloo) for trying ddptop on a framework.

Nothing is downloaded (HF_HUB_OFFLINE=1): the model is a one-layer BERT built from
a config in code and the data are random token ids.  Launch it with torchrun:

    torchrun --nproc-per-node 2 examples/frameworks/hf_trainer_job.py --steps 60
    ddptop torchrun --nproc-per-node 2 examples/frameworks/hf_trainer_job.py --steps 200

Options:

  --steps N            max_steps (default 100)
  --step-time S        sleep S seconds in every training step (default 0.05)
  --hang-rank R --hang-at-step S
                       a TrainerCallback whose on_step_begin sleeps forever on
                       rank R at global step S; the other ranks then wait in a DDP
                       collective: the buffer broadcast at the start of DDP forward
                       (default), or the gradient all-reduce in backward with
                       --no-broadcast-buffers
  --eval-every N --eval-time S
                       evaluate every N steps (eval_strategy="steps"); each
                       evaluation lasts about S seconds in all and prints nothing
                       until its metrics (the "healthy, quiet evaluation phase")
  --eval-batches N     evaluation batches per rank (default 1).  Trainer's evaluation
                       tqdm bar writes one update per batch (with \r and ESC[A, even
                       into a file), so 1 batch keeps the phase silent between its
                       start and its metrics line
  --ckpt-every N --ckpt-time S
                       save a checkpoint every N steps (save_strategy="steps";
                       default 20 when --ckpt-time is given); rank 0's model write
                       lasts S seconds (slow storage: a write inside torch.save
                       blocks) while the other ranks go on to the next step
                       and wait for rank 0 in a collective there (seen: accelerate's
                       all_gather in the next step; after the last step, the
                       all_gather of distributed_broadcast_scalars)
  --no-broadcast-buffers
                       ddp_broadcast_buffers=False.  By default DDP broadcasts BERT's
                       buffers from rank 0 at the start of every forward, so in the
                       hang case rank 0 waits in that broadcast (DDP forward); with
                       this flag it waits in the gradient all-reduce (backward)
  --logging-steps N    Trainer's logging_steps (default 10)
  --quiet              don't print this script's own lines (the first-step marker,
                       "hanging ...", "writing checkpoint ...")
  --out-dir DIR        output_dir (default: $TMPDIR/ddptop-hf-trainer-job)
"""

from __future__ import annotations

import os
import time

_T0 = time.time()  # before the heavy imports: start-up is measured from here

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import sys
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

SEQ = 16
VOCAB = 100
BATCH = 8


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="max_steps")
    p.add_argument("--step-time", type=float, default=0.05, help="sleep per training step (s)")
    p.add_argument("--hang-rank", type=int, default=None)
    p.add_argument("--hang-at-step", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps")
    p.add_argument("--eval-time", type=float, default=2.0, help="length of one evaluation (s)")
    p.add_argument("--eval-batches", type=int, default=1, help="evaluation batches per rank")
    p.add_argument("--ckpt-every", type=int, default=None, help="checkpoint every N steps")
    p.add_argument("--ckpt-time", type=float, default=None, help="length of rank 0's checkpoint write (s)")
    p.add_argument("--no-broadcast-buffers", action="store_true")
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--out-dir", default=os.path.join(tempfile.gettempdir(), "ddptop-hf-trainer-job"))
    p.add_argument("--quiet", action="store_true", help="no lines of this script's own")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if (a.hang_rank is None) != (a.hang_at_step is None):
        p.error("--hang-rank and --hang-at-step go together")
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


class RandomTokens(Dataset):
    """Random token ids; the label is whether token 0 is in the upper half of the vocabulary."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        ids = self.ids[i]
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "labels": torch.tensor(int(ids[0] >= VOCAB // 2)),
        }


class PacedTrainer(Trainer):
    """Sleeps ``step_time`` in every training step, ``eval_batch_time`` in every
    evaluation batch, and ``ckpt_time`` in rank 0's model write."""

    def __init__(self, *args, step_time=0.0, eval_batch_time=0.0, ckpt_time=0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.step_time = step_time
        self.eval_batch_time = eval_batch_time
        self.ckpt_time = ckpt_time

    def training_step(self, *args, **kwargs):
        if self.step_time > 0:
            time.sleep(self.step_time)
        return super().training_step(*args, **kwargs)

    def prediction_step(self, *args, **kwargs):
        if self.eval_batch_time > 0:
            compute(self.eval_batch_time)
        return super().prediction_step(*args, **kwargs)

    def _save(self, output_dir=None, state_dict=None):
        # Trainer calls this on every rank; only the rank that writes (rank 0) goes on.
        if self.args.should_save and self.ckpt_time:
            # an extra state file on slow storage: the time goes inside torch.save, where a slow disk puts it
            say(f"[rank {_rank()}] writing checkpoint {output_dir} ({self.ckpt_time:g} s)")
            out = output_dir or self.args.output_dir
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "extra_state.pt"), "wb") as f:
                torch.save(self.model.state_dict(), SlowStorage(f, self.ckpt_time))
        return super()._save(output_dir, state_dict=state_dict)


class SlowStorage:
    """A file on slow storage: the first write blocks ``seconds``."""

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


class HangCallback(TrainerCallback):
    """Sleeps forever in on_step_begin on one rank at one global step."""

    def __init__(self, rank: int, at_step: int):
        self.rank = rank
        self.at_step = at_step

    def on_step_begin(self, args, state, control, **kwargs):
        if args.process_index == self.rank and state.global_step >= self.at_step:
            say(f"[rank {args.process_index}] hanging in on_step_begin at step {state.global_step}")
            while True:
                time.sleep(1)


class FirstStepMarker(TrainerCallback):
    """Prints one line on rank 0 when the first training step begins."""

    def __init__(self):
        self.done = False

    def on_step_begin(self, args, state, control, **kwargs):
        if not self.done and args.process_index == 0:
            self.done = True
            say(f"[rank 0] first training step, {time.time() - _T0:.1f} s after the script started")


def main(argv=None):
    a = parse_args(argv)
    global QUIET
    QUIET = a.quiet
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(a.seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=SEQ, num_labels=2)
    model = BertForSequenceClassification(config)

    train = RandomTokens(BATCH * world * (a.steps + 8), a.seed)
    evalset = RandomTokens(BATCH * world * a.eval_batches, a.seed + 1) if a.eval_every else None

    args = TrainingArguments(
        output_dir=a.out_dir,
        max_steps=a.steps,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        learning_rate=1e-3,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        logging_steps=a.logging_steps,
        eval_strategy="steps" if a.eval_every else "no",
        eval_steps=a.eval_every,
        save_strategy="steps" if a.ckpt_every else "no",
        save_steps=a.ckpt_every or 500,
        save_only_model=True,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,
        ddp_broadcast_buffers=False if a.no_broadcast_buffers else None,
        seed=a.seed,
    )

    callbacks = [FirstStepMarker()]
    if a.hang_rank is not None:
        callbacks.append(HangCallback(a.hang_rank, a.hang_at_step))

    trainer = PacedTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=evalset,
        callbacks=callbacks,
        step_time=a.step_time,
        eval_batch_time=a.eval_time / a.eval_batches,
        ckpt_time=a.ckpt_time or 0.0,
    )
    t0 = time.time()
    trainer.train()
    if trainer.args.process_index == 0:
        say(f"done: {trainer.state.global_step} steps in {time.time() - t0:.1f} s (train)")
    # Trainer leaves the process group up; a gloo group torn down at interpreter exit
    # can abort ("terminate called without an active exception", SIGABRT) when the
    # ranks finish at different moments, so close it here, together.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    # The DDP model still holds the gloo process group.  Freeing it as main() returns can deadlock inside torch:
    # the Reducer is freed with the GIL held, ProcessGroupGloo's destructor waits for its worker thread, and
    # that thread waits for the GIL to free the last collective's tensors (pytorch/pytorch#56297; seen once in
    # a loaded test run here, rank 1 frozen after its last line, and named by ddptop).  The job is done: leave
    # without tearing the objects down.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
