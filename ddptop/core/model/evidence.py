"""Typed evidence from stack samples: where each rank is, who waits, who is the odd one out.

Stack samples are judged once (``analysis.stack_verdict.verdict``) into a
``StackEvidence``; the ``StacksEvent`` carries it over the journal and the
wire as plain JSON (``to_event_fields`` / ``from_event``), and every reader
(the detector, the cross-node view, the UI, ``diagnose``) takes it back as
these types: ranks are ``int`` everywhere, and nothing reads a dict with
``.get()`` across modules.

The one rule for "this rank is working" lives here (``Where.working``): a
rank whose stack moves between samples, or that runs on the CPU on one line
*without* waiting on the GPU, works; a rank frozen in a collective, in
``backward`` or at a CUDA synchronisation point (native CUDA/NCCL frames, or
one unchanged line spinning while its GPU is busy) waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

# what a rank's main thread is doing (Where.kind)
KINDS = ("collective", "backward", "gpu-wait", "nccl", "gpu-lock", "data", "io", "sleep/wait in user code",
         "user code", "framework", "unknown")
# kinds in which a rank waits for its peers: inside a collective (gloo blocks there), in backward (DDP's
# all-reduce), at a CUDA/HIP synchronisation point behind an asynchronous NCCL collective (spinning or
# sleeping), or in NCCL's own host code (communicator setup, group end).  Not "gpu-lock": a rank blocked on
# the CUDA driver's lock under a call that does not wait for GPU work is stuck, not waiting.
WAITING_KINDS = ("collective", "backward", "gpu-wait", "nccl")
# per-rank status across samples: "seen" (one sample: frozen and moving cannot be told apart), "unclear"
# (one unchanged line that may be a GPU synchronisation, with nothing to tell: neither culprit nor waiter)
STATUSES = ("frozen", "busy", "moving", "seen", "unclear", "unknown")
# % GPU utilisation that counts as busy (an NCCL spin reads ~100) and as idle (~0)
HOT_UTIL = 40.0
IDLE_UTIL = 15.0


def ranks_text(rs: Iterable[int]) -> str:
    """``rank 3`` / ``ranks 0-2,5``."""
    rs = sorted(set(rs))
    if not rs:
        return ""
    if len(rs) == 1:
        return f"rank {rs[0]}"
    runs, start, prev = [], rs[0], rs[0]
    for r in rs[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(f"{start}" if start == prev else f"{start}-{prev}" if prev > start + 1 else f"{start},{prev}")
        if r is not None:
            start = prev = r
    return "ranks " + ",".join(runs)


@dataclass(frozen=True)
class Where:
    """Where one rank's main thread is, across the samples."""

    rank: int
    status: str = "unknown"  # one of STATUSES
    kind: str = "unknown"  # one of KINDS
    function: str = ""  # the innermost frame of the user's own code (else the innermost frame)
    file: str = ""
    line: int = 0
    call: str = ""  # the call made from that frame ("all_reduce", "time.sleep")
    innermost: str = ""
    innermost_file: str = ""
    code: str = ""  # the source line, when it could be read
    text: str = ""  # short description
    node: str = ""  # the node this rank runs on (multi-node jobs)
    # how it waits on the GPU (kinds gpu-wait, gpu-lock, nccl): the key of the library its native frames say
    # ("cuda-runtime", "cuda-driver", "nccl", "hip", ...: analysis.native_frames.LIBRARIES), "util" (no native
    # frames: one unchanged line while its GPU is busy), or ""
    gpu: str = ""
    native: str = ""  # the GPU call in words: "cudaStreamSynchronize (libcudart.so.12)", "in the CUDA driver"
    library: str = ""  # the library in words: "the CUDA runtime"
    others: tuple[str, ...] = ()  # other threads worth naming (in GPU code, holding the GIL)
    native_read: bool = False  # its dump had native frames (py-spy --native, gdb, pystack)
    signature: tuple[str, ...] = ()  # its stack, for grouping ranks (func@file, and :line for the user's frames)
    passed: bool = False  # moving, and went through a wait (collective, backward, GPU sync) between samples
    samples: int = 0  # usable samples of it

    @property
    def waiting(self) -> bool:
        """Waits for its peers (in a collective, backward, at a GPU sync, in NCCL)."""
        return self.status in ("frozen", "seen") and self.kind in WAITING_KINDS

    @property
    def working(self) -> bool:
        """Visibly working: its stack moves, or it runs on the CPU on one line
        without waiting on the GPU (a long C call, a tight loop of its own)."""
        return self.status in ("moving", "busy") and self.kind not in WAITING_KINDS

    @property
    def at(self) -> str:
        base = self.file.replace("\\", "/").rsplit("/", 1)[-1]
        return f"{base}:{self.line}" if self.line else base

    def to_dict(self) -> dict:
        return {"rank": self.rank, "function": self.function, "file": self.file, "line": self.line,
                "call": self.call, "innermost": self.innermost, "innermost_file": self.innermost_file,
                "kind": self.kind, "status": self.status, "code": self.code, "text": self.text, "node": self.node,
                "gpu": self.gpu, "native": self.native, "library": self.library, "others": list(self.others),
                "native_read": self.native_read, "signature": list(self.signature), "passed": self.passed,
                "samples": self.samples}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], rank: int | None = None) -> "Where":
        def s(k: str) -> str:
            v = d.get(k)
            return v if isinstance(v, str) else ""

        line = d.get("line")
        r = rank if rank is not None else d.get("rank")
        return cls(rank=int(r) if isinstance(r, (int, str)) and str(r).lstrip("-").isdigit() else -1,
                   status=s("status") or "unknown", kind=s("kind") or "unknown", function=s("function"),
                   file=s("file"), line=line if isinstance(line, int) and not isinstance(line, bool) else 0,
                   call=s("call"), innermost=s("innermost"), innermost_file=s("innermost_file"), code=s("code"),
                   text=s("text"), node=s("node"), gpu=_old_gpu_key(s("gpu")), native=s("native"),
                   library=s("library"),
                   others=tuple(str(x) for x in d.get("others") or () if isinstance(x, str)),
                   native_read=d.get("native_read") is True,
                   signature=tuple(str(x) for x in d.get("signature") or () if isinstance(x, str)),
                   passed=d.get("passed") is True,
                   samples=d["samples"] if isinstance(d.get("samples"), int) and not isinstance(d.get("samples"), bool)
                   else 0)


# the library names journals of earlier releases wrote in Where.gpu, as the keys of today's table
_OLD_GPU = {"libcudart": "cuda-runtime", "libcuda": "cuda-driver", "libnccl": "nccl"}


def _old_gpu_key(v: str) -> str:
    return _OLD_GPU.get(v, v)


@dataclass(frozen=True)
class StackGroup:
    """Ranks sharing a status and (frozen or busy) one stack, described once."""

    ranks: tuple[int, ...]
    status: str
    kind: str
    text: str
    culprit: bool = False
    frames: tuple[str, ...] = ()  # the main thread's frames, innermost first, for the stacks pane
    user: tuple[int, ...] = ()  # indices of the user's own frames among them

    def to_dict(self) -> dict:
        return {"ranks": list(self.ranks), "state": self.status, "kind": self.kind, "text": self.text,
                "culprit": self.culprit, "frames": list(self.frames), "user": list(self.user)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StackGroup":
        def ints(v: Any) -> tuple[int, ...]:
            return tuple(x for x in v if isinstance(x, int)) if isinstance(v, (list, tuple)) else ()

        frames = d.get("frames")
        return cls(ints(d.get("ranks")), str(d.get("state") or d.get("status") or "unknown"),
                   str(d.get("kind") or "unknown"), str(d.get("text") or d.get("description") or ""),
                   bool(d.get("culprit")),
                   tuple(str(f) for f in frames) if isinstance(frames, (list, tuple)) else (), ints(d.get("user")))


@dataclass(frozen=True)
class FoldedAlarm:
    """A node's own stall alarm (or a cross-node one, node "all nodes") that a
    cross-node alarm took in as its evidence instead of showing it apart."""

    t: float
    node: str
    id: str
    culprits: tuple[int, ...] = ()
    message: str = ""

    def to_dict(self) -> dict:
        return {"t": self.t, "node": self.node, "id": self.id, "culprits": list(self.culprits),
                "message": self.message}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FoldedAlarm":
        t = d.get("t")
        culprits = d.get("culprits")
        return cls(float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0,
                   str(d.get("node") or ""), str(d.get("id") or ""),
                   tuple(r for r in culprits if isinstance(r, int) and not isinstance(r, bool))
                   if isinstance(culprits, (list, tuple)) else (), str(d.get("message") or ""))


@dataclass(frozen=True)
class StackEvidence:
    """What stack samples of every rank (of one node, or combined across nodes) say.

    ``hung``: True (frozen, or frozen waiting while others move), False
    (work), None (cannot tell).  ``culprits``: the odd ranks out, computed
    here once.  ``waiting``: the ranks that wait for their peers.
    ``mismatch``: every rank that is frozen waits, but not all at the same
    place (different collectives or call sites: one rank took another path).
    ``io``: ranks in I/O in every sample (a checkpoint write): work, unless
    it lasts.  ``workers``: the ranks the waiting ones wait for when those
    visibly work (rank 0 evaluating alone while the others sit in a
    barrier): no hang (``hung`` False) unless it lasts."""

    t: float = 0.0
    hung: bool | None = None
    culprits: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()
    mismatch: bool = False
    where: Mapping[int, Where] = field(default_factory=dict)  # every rank sampled
    io: tuple[int, ...] = ()
    summary: str = ""
    error: str = ""
    node: str = ""
    groups: tuple[StackGroup, ...] = ()
    workers: tuple[int, ...] = ()
    deadlock: bool = False  # every rank blocked on the CUDA driver's lock (no odd rank out)

    @property
    def status(self) -> dict[int, str]:
        return {r: w.status for r, w in sorted(self.where.items())}

    def shown(self) -> dict[int, Where]:
        """The ranks worth naming: the culprits, those in I/O, and (in a
        mismatch) every waiting rank."""
        keep = set(self.culprits) | set(self.io) | set(self.workers) | (set(self.waiting) if self.mismatch else set())
        return {r: w for r, w in sorted(self.where.items()) if r in keep}

    def waits_on_work(self, also: Iterable[int] = ()) -> tuple[int, ...]:
        """The ranks the others wait for, when they visibly work: the
        ``workers``, or hung culprits that all work after all (listed in
        ``also``: a rank frozen on a child process that uses the CPU).  ()
        when the others wait for stuck ranks, or nobody waits."""
        if self.hung is False and self.workers:
            return self.workers
        if not (self.hung and self.culprits):
            return ()
        extra = set(also)
        w = self.where
        if all((r in w and w[r].working) or r in extra for r in self.culprits):
            return tuple(sorted(self.culprits))
        return ()

    @property
    def confirmed(self) -> bool:
        """Complete evidence of a hang: the culprits are frozen (not moving,
        not busy, not in I/O) while the others wait for them; or the ranks
        wait in different collectives (a mismatch)."""
        if not self.hung:
            return False
        if self.mismatch:
            return True
        if not self.culprits or not (set(self.waiting) - set(self.culprits)):
            return False
        return all(r in self.where and self.where[r].status == "frozen" and r not in self.io
                   for r in self.culprits)

    # -- over the wire (StacksEvent) -------------------------------------------------------------

    def to_event_fields(self) -> dict:
        """The ``StacksEvent`` fields this evidence fills."""
        return {"hung": self.hung, "culprits": tuple(self.culprits), "waiting": tuple(self.waiting),
                "mismatch": self.mismatch, "workers": tuple(self.workers), "summary": self.summary,
                "where": dict(sorted(self.where.items())), "groups": tuple(self.groups), "io": tuple(self.io),
                "error": self.error,
                "node": self.node, "deadlock": self.deadlock}

    @classmethod
    def from_event(cls, ev: Any) -> "StackEvidence":
        """From a ``StacksEvent`` (typed already: ``events.from_dict`` reads its JSON)."""
        where = {r: replace(w, node=w.node or ev.node) for r, w in ev.where.items()}
        return cls(ev.t, ev.hung, tuple(ev.culprits), tuple(ev.waiting), ev.mismatch, where, tuple(ev.io), ev.summary,
                   ev.error, ev.node, tuple(ev.groups), tuple(ev.workers), ev.deadlock)
