"""Training progress from log lines.

``parse_progress(line)`` returns a :class:`Progress` -- a training step, or
"other" progress (an eval/validation bar, a checkpoint being saved) that
shows the job is alive but must not be mistaken for training steps -- or None.
ANSI codes and rank prefixes (``[default0]:``, ``[rank3]:``, nested) are
stripped first.  Never raises, whatever the bytes: a line the parser fails
on (a bug) counts as no progress, and ``on_error`` hears of it (the analyzer
turns it into a note, so the failure is not silent).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from ddptop.core.analysis.prefixes import split

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")

TRAIN = "train"
OTHER = "other"


@dataclass(frozen=True)
class Progress:
    step: int | None  # the training step (or batch) count this line reports
    total: int | None = None
    kind: str = TRAIN  # train | other
    epoch: int | None = None
    fmt: str = ""  # which format matched
    says_train: bool = False  # its own description says training ("Train: 62%|...", "training", "epoch")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text) if "\x1b" in text else text


def clean(text: str) -> str:
    """``text`` without ANSI codes and without the launchers' rank prefixes
    (the unambiguous ones: :func:`ddptop.core.analysis.prefixes.split`)."""
    text = strip_ansi(text)
    if text[:1] in _PREFIX_STARTS:
        text = split(text).text
    return text


_PREFIX_STARTS = frozenset("[( ")


# bars of work other than training steps: evaluation, and the bars a training run draws for other work (rollouts and
# generation in RL, loading shards, mapping and tokenising datasets, downloads)
_OTHER_WORDS = re.compile(r"\b(?:eval\w*|valid\w*|val|test\w*|predict\w*|inference|sanity|rollouts?|generat\w*|"
                          r"sampl\w*|decod\w*|loading|load\w*|download\w*|map|filter\w*|tokeniz\w*|preprocess\w*|"
                          r"fetch\w*|shards?|prefill\w*|calibrat\w*|warm[- ]?up|benchmark\w*|reward\w*|"
                          r"experience|infer\w*)\b", re.I)
# a bar's description that says training
_TRAIN_DESC = re.compile(r"\b(?:train\w*|epoch\w*|fit\w*|optim\w*)\b", re.I)
_CKPT = re.compile(r"\b(?:saving|saved|checkpoint\w*|writing model|save_model)\b", re.I)

# (name, regex, groups) in order of preference
_FORMATS: list[tuple[str, re.Pattern]] = [
    # Lightning: "Epoch 0:   6%|▋ | 32040/500150 [..]"
    ("lightning", re.compile(r"\bEpoch (?P<epoch>\d+):\s+\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)")),
    # "Epoch [1/10], Step [100/600]"
    ("epoch-step", re.compile(r"Epoch\s*\[(?P<epoch>\d+)/\d+\],?\s*Step\s*\[(?P<step>\d+)/(?P<total>\d+)\]", re.I)),
    # 3D-Speaker: "Epoch: [3][ 100/3000]"
    ("3dspeaker", re.compile(r"Epoch:\s*\[(?P<epoch>\d+)\]\[\s*(?P<step>\d+)/(?P<total>\d+)\]")),
    # wenet: "TRAIN Batch 4/203700 loss ..."   ("CV Batch" is validation)
    ("wenet", re.compile(r"\b(?P<tag>TRAIN|CV) Batch (?P<epoch>\d+)/(?P<step>\d+)")),
    # icefall: "Epoch 0, batch 1, loss[...]"
    ("icefall", re.compile(r"\bEpoch (?P<epoch>\d+), batch (?P<step>\d+)\b")),
    # "Epoch 2 Batch 300", "epoch: 3, iter: 120/500", "Epoch 1 | Step 40" (the other orders and separators)
    ("epoch-batch", re.compile(r"\bEpoch[:=\s]*\[?\s*(?P<epoch>\d+)(?:\s*/\s*\d+)?\]?[\s,:|;-]*"
                               r"(?:Batch|Iter(?:ation)?|Step)\b[:=#\s]*\[?\s*(?P<step>\d+)(?:\s*/\s*(?P<total>\d+))?", re.I)),
    # HF Trainer dict logs: "{'loss': 0.7, 'learning_rate': ..., 'epoch': 0.35}" (+ optional 'step')
    ("hf", re.compile(r"^\{.*'loss': [-\d.e]+.*'epoch': (?P<fepoch>[\d.]+)")),
    # tqdm: "10/1752 [00:29<1:22:01, 2.83s/it]" (with optional "desc: 1%|...| ")
    ("tqdm", re.compile(r"(?:(?P<desc>[^\s|:][^|:]*):\s*)?(?:\d+%\|[^|]*\|\s*)?(?P<step>\d+)/(?P<total>\d+|\?) \[\d")),
    # "step: 700  loss: 0.70", "step 12 loss", "iter 30", "global_step=5"
    # (a step count is a whole number: "STEP 48213.0" is SLURM's job step id)
    ("step", re.compile(r"\b(?:global_step|step|iter|iteration|it)\b\s*[:=#]?\s*\[?\s*(?P<step>\d+)(?![\d.]*\.\d)(?!\d)"
                        r"(?:\s*/\s*(?P<total>\d+))?", re.I)),
    # a bracketed fraction on a line about training: "Train: 3 [ 400/1000 ( 40%)]  Loss: 0.41", "[ 400/1000] loss"
    ("fraction", re.compile(r"\[\s*(?P<step>\d+)\s*/\s*(?P<total>\d+)\s*(?:\]|\()")),
]
_TRAINING_WORDS = re.compile(r"\b(?:loss|lr|train\w*|grad\w*|tokens?/s|samples?/s)\b|\bs/it\b|\bit/s\b", re.I)

_HF_STEP = re.compile(r"'step': (\d+)")
_DIGIT = re.compile(r"\d")
_TQDM_CORE = re.compile(r"\d/(?:\d+|\?) \[\d")

# A text each format cannot match without (tested: the same answers as with no guard, on every
# format's lines and on random text): the regex runs only on lines that pass its guard, so an
# ordinary log line costs a few substring tests instead of eight searches.
_GUARDS: dict[str, Callable[[str, str], bool]] = {
    "lightning": lambda t, low: "Epoch " in t and "%|" in t,
    "epoch-step": lambda t, low: "epoch" in low and "step" in low and "[" in t,
    "3dspeaker": lambda t, low: "Epoch:" in t,
    "wenet": lambda t, low: "Batch " in t,
    "icefall": lambda t, low: "Epoch " in t and ", batch " in t,
    "epoch-batch": lambda t, low: "epoch" in low and ("batch" in low or "iter" in low or "step" in low),
    "hf": lambda t, low: t.startswith("{") and "'loss': " in t and "'epoch': " in t,
    # (its leading optional description backtracks over the whole line: find its core first)
    "tqdm": lambda t, low: " [" in t and _TQDM_CORE.search(t) is not None,
    "step": lambda t, low: "step" in low or "it" in low,
    "fraction": lambda t, low: "/" in t and "[" in t and _TRAINING_WORDS.search(t) is not None,
}


def parse_progress(text: str, on_error: Callable[[Exception], None] | None = None) -> Progress | None:
    """The progress ``text`` reports, or None.  An exception inside the parser
    (a bug: it must never take the monitor down) skips this line only, and is
    passed to ``on_error`` when given."""
    try:
        return _parse(text)
    except Exception as e:  # noqa: BLE001 (a parser bug skips this line only, and is reported through on_error)
        if on_error is not None:
            on_error(e)
        return None


def _parse(text: str, guarded: bool = True) -> Progress | None:
    if not text:
        return None
    t = clean(text)[:4096]
    if not _DIGIT.search(t):
        return Progress(None, None, OTHER, None, "checkpoint") if _CKPT.search(t) else None
    low = t.lower()
    for name, rx in _FORMATS:
        if guarded and not _GUARDS[name](t, low):
            continue
        m = rx.search(t)
        if not m:
            continue
        g = m.groupdict()
        if name == "hf":
            s = _HF_STEP.search(t)
            return Progress(int(s.group(1)) if s else None, None, OTHER if "eval_" in t else TRAIN,
                            None, name) if s else Progress(None, None, TRAIN, None, name + "-nostep")
        step = int(g["step"]) if g.get("step") else None
        total = g.get("total")
        total = int(total) if total and total.isdigit() else None
        epoch = int(g["epoch"]) if g.get("epoch") else None
        kind = TRAIN
        if name == "wenet" and g.get("tag") == "CV":
            kind = OTHER
        elif name == "tqdm":
            desc = (g.get("desc") or "") + " " + t[: m.start()]
            if _OTHER_WORDS.search(desc):
                kind = OTHER
            elif _TRAIN_DESC.search(desc):
                return Progress(step, total, kind, epoch, name, True)
        elif name == "lightning" and _OTHER_WORDS.search(t[: m.start()]):
            kind = OTHER
        elif name in ("lightning", "epoch-step", "3dspeaker", "icefall", "epoch-batch", "wenet"):
            return Progress(step, total, kind, epoch, name, True)  # (these formats say training themselves)
        elif name in ("step", "fraction", "epoch-batch") and _OTHER_WORDS.search(t[: m.start()]):
            kind = OTHER
        return Progress(step, total, kind, epoch, name)
    if _CKPT.search(t):
        return Progress(None, None, OTHER, None, "checkpoint")
    return None


def parse_step(text: str) -> int | None:
    """The training step a line reports, or None (``step 12 loss 0.3`` -> 12)."""
    p = parse_progress(text)
    return p.step if p is not None and p.kind == TRAIN else None


class TrainingBars:
    """The one rule, for the live analysis, the view and ``diagnose`` alike,
    for which progress bar is the training one when a rank draws several:
    once a rank's bars have said they are training ones ("Train: 62%|...|
    5559/9008", "Epoch 3: ..."), a bar that does not say so (a rollout's
    "0/48", a generation or eval bar without a word) is other progress."""

    _BARS = ("tqdm", "fraction")

    def __init__(self) -> None:
        self._named: set = set()

    def judge(self, who: object, p: Progress | None) -> Progress | None:
        if p is None or p.kind == OTHER or p.fmt not in self._BARS:
            return p
        if p.says_train:
            self._named.add(who)
            return p
        if who in self._named:
            return Progress(p.step, p.total, OTHER, p.epoch, p.fmt)
        return p

    def step(self, who: object, text: str) -> int | None:
        """The training step ``text`` reports for ``who``, or None."""
        p = self.judge(who, parse_progress(text))
        return p.step if p is not None and p.kind == TRAIN else None
