"""The one event stream.

Every fact ddptop knows is an event: a frozen, JSON-serialisable dataclass
with a unix time ``t`` and a ``kind``.  Front ends (TUI, headless printer,
journal) only consume events.

One module, though over 500 lines: it is the wire format itself, every event kind
and the one decoder that checks a line against their annotations; a kind split off
from its decoder would be a second place to keep in step.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol

from ddptop.core.model.evidence import FoldedAlarm, StackGroup, Where

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_enc = json.encoder.encode_basestring  # C implementation: a JSON string literal
_new = object.__new__
_setattr = object.__setattr__

# Job states, in the order a job normally passes through them.
STARTING = "starting"
RUNNING = "running"
STOPPING = "stopping"
SUCCEEDED = "succeeded"
FAILED = "failed"
STOPPED = "stopped"
LOST = "lost"  # the supervisor vanished without recording an exit
ENDED = "ended"  # a job ddptop did not start has ended: its exit code cannot be known
FINAL_STATES = frozenset({SUCCEEDED, FAILED, STOPPED, LOST, ENDED})


@dataclass(frozen=True)
class Event:
    kind: ClassVar[str] = "event"
    t: float

    def to_dict(self) -> dict[str, Any]:
        d = {"t": self.t, "kind": self.kind, **self.__dict__}
        for name in _TYPED.get(type(self), ()):
            d[name] = _plain(d[name])
        return d

    def to_json(self) -> str:
        return _dumps(self.to_dict())

    def json_lines(self) -> str:
        """What ``--json`` prints for it: its JSON (a ``LogBatch`` prints one object per line)."""
        return self.to_json()


@dataclass(frozen=True)
class StateEvent(Event):
    """The job's state changed.  ``exit_code`` is set once the job has ended."""

    kind: ClassVar[str] = "state"
    state: str = STARTING
    exit_code: int | None = None
    message: str = ""
    node: str = ""
    # who ended the run (a final state only): "ddptop-on-stall" (--on-stall kill), "ddptop-stop" (a stop asked
    # of ddptop: the TUI, an attachment, a signal to its supervisor), "outside" (torchrun killed by a signal ddptop
    # did not send), "job" (torchrun exited by itself), "" (not known: an earlier release's journal)
    ended_by: str = ""


@dataclass(frozen=True)
class RankEvent(Event):
    """A rank process was seen (or seen to end)."""

    kind: ClassVar[str] = "rank"
    rank: int = 0
    local_rank: int = 0
    node: str = ""
    pid: int | None = None
    attempt: int = 0
    alive: bool = True
    exit_code: int | None = None


@dataclass(frozen=True)
class LogEvent(Event):
    """One line of output.  ``rank`` is None for torchrun's own output.

    ``offset`` is the byte offset of the line's start in ``path`` (relative to
    the run directory), so a reader can resume exactly after it.
    ``partial`` is True for a line that was cut because it grew too long.
    ``transient`` is True for an in-place update (a ``\r`` progress bar) of a
    line that has not ended yet: show it, then replace it with the next one.
    """

    kind: ClassVar[str] = "log"
    rank: int | None = None
    stream: str = "stdout"
    text: str = ""
    attempt: int = 0
    path: str = ""
    offset: int = 0
    partial: bool = False
    transient: bool = False
    node: str = ""  # host it came from, when attached to several (or a remote) node

    @classmethod
    def fast(cls, t, rank, stream, text, attempt, path, offset, partial=False, transient=False, node="") -> "LogEvent":
        """Same as the constructor, several times cheaper (hot path: every line)."""
        ev = _new(cls)
        _setattr(ev, "__dict__", {
            "t": t, "rank": rank, "stream": stream, "text": text, "attempt": attempt,
            "path": path, "offset": offset, "partial": partial, "transient": transient, "node": node,
        })
        return ev

    def to_json(self) -> str:
        # hand-rolled for speed; equal to json.dumps(self.to_dict()) (tested)
        return (
            f'{{"t":{self.t!r},"kind":"log","rank":{"null" if self.rank is None else self.rank},'
            f'"stream":{_enc(self.stream)},"text":{_enc(self.text)},"attempt":{self.attempt},'
            f'"path":{_enc(self.path)},"offset":{self.offset},'
            f'"partial":{"true" if self.partial else "false"},'
            f'"transient":{"true" if self.transient else "false"},"node":{_enc(self.node)}}}'
        )


class LineChunk(Protocol):
    """What a log reader's read gives (``log_tailer.Chunk``): its lines as lists, or kept as one text."""

    partial: tuple[int, ...]
    transient: bool

    @property
    def offsets(self) -> list[int]: ...

    @property
    def texts(self) -> list[str]: ...

    @property
    def body(self) -> str: ...

    @property
    def kept_whole(self) -> bool: ...


@dataclass(frozen=True)
class LogBatch(Event):
    """The lines of one read of one log file: the form log output travels in
    (session, analysis, headless, UI, agent), one event per read instead of
    one object per line.

    ``offsets[i]`` is the byte offset of line ``i`` in ``path`` (relative to
    the run directory); ``partial`` lists the indices of lines cut because
    they grew too long; ``transient`` says the last line is an in-place update
    (a ``\r`` progress bar) of a line that has not ended yet.  ``--json``
    prints one ``log`` object per line (``json_lines``), as before batches.
    """

    kind: ClassVar[str] = "logs"
    rank: int | None = None
    stream: str = "stdout"
    attempt: int = 0
    path: str = ""
    node: str = ""
    offsets: tuple[int, ...] = ()
    texts: tuple[str, ...] = ()
    partial: tuple[int, ...] = ()
    transient: bool = False

    @classmethod
    def fast(cls, t, rank, stream, attempt, path, offsets, texts, partial=(), transient=False,
             node="") -> "LogBatch":
        """Same as the constructor, without the dataclass machinery (hot path);
        ``offsets`` and ``texts`` may be lists (taken as they are, not copied)."""
        ev = _new(cls)
        _setattr(ev, "__dict__", {
            "t": t, "rank": rank, "stream": stream, "attempt": attempt, "path": path, "node": node,
            "offsets": offsets, "texts": texts, "partial": partial, "transient": transient,
        })
        return ev

    @classmethod
    def of_chunk(cls, t, rank, stream, attempt, path, chunk: LineChunk, node="") -> "LogBatch":
        """The lines of one read (``log_tailer.Chunk``): lines the read kept as one text stay so until
        ``texts`` or ``offsets`` is first read."""
        ev = _new(cls)
        d = {"t": t, "rank": rank, "stream": stream, "attempt": attempt, "path": path, "node": node,
             "partial": chunk.partial, "transient": chunk.transient}
        if chunk.kept_whole:
            d["_chunk"] = chunk
        else:
            d["offsets"], d["texts"] = chunk.offsets, chunk.texts
        _setattr(ev, "__dict__", d)
        return ev

    if not TYPE_CHECKING:
        def __getattr__(self, name):
            # (only for what the instance lacks: the lines of a batch made by of_chunk, until first read)
            if name in ("texts", "offsets"):
                d = self.__dict__
                chunk = d.pop("_chunk", None)  # (split, the lines are kept once: a pickled batch carries one form)
                if chunk is not None:
                    d["texts"], d["offsets"] = chunk.texts, chunk.offsets
                    return d[name]
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def done_text(self) -> str | None:
        """The texts of the ended lines joined by newlines, None when no line has ended (``done`` as one
        text: a batch that keeps its lines as one text gives it without splitting it)."""
        chunk = self.__dict__.get("_chunk")
        if chunk is not None and not self.transient:
            return chunk.body
        done = self.done
        return "\n".join(done) if done else None

    @classmethod
    def of_line(cls, ev: LogEvent) -> "LogBatch":
        """A batch of one line (a ``log`` event from an older agent)."""
        return cls.fast(ev.t, ev.rank, ev.stream, ev.attempt, ev.path, (ev.offset,), (ev.text,),
                        (0,) if ev.partial else (), ev.transient, ev.node)

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def done(self):
        """The texts of the lines that have ended (all but a trailing transient one)."""
        return self.texts[:-1] if self.transient else self.texts

    @property
    def live(self) -> str | None:
        """The trailing in-place update, if the batch ends with one."""
        return self.texts[-1] if self.transient and self.texts else None

    def lines(self) -> list[LogEvent]:
        """One ``LogEvent`` per line (for code that wants them one by one)."""
        cut = set(self.partial)
        last = len(self.texts) - 1
        return [LogEvent.fast(self.t, self.rank, self.stream, text, self.attempt, self.path, off, i in cut,
                              self.transient and i == last, self.node)
                for i, (off, text) in enumerate(zip(self.offsets, self.texts))]

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, "kind": self.kind, "rank": self.rank, "stream": self.stream, "attempt": self.attempt,
                "path": self.path, "node": self.node, "offsets": list(self.offsets), "texts": list(self.texts),
                "partial": list(self.partial), "transient": self.transient}

    def json_lines(self) -> str:
        """One ``log`` object a line, newline-separated (what ``--json`` prints;
        each equal to that line's ``LogEvent.to_json()``, tested)."""
        if not self.texts:
            return ""
        rank = "null" if self.rank is None else self.rank
        head = f'{{"t":{self.t!r},"kind":"log","rank":{rank},"stream":{_enc(self.stream)},"text":'
        mid = f',"attempt":{self.attempt},"path":{_enc(self.path)},"offset":'
        tail = f',"partial":false,"transient":false,"node":{_enc(self.node)}}}'
        out = [f"{head}{_enc(text)}{mid}{off}{tail}" for off, text in zip(self.offsets, self.texts)]
        last = len(out) - 1
        for i in {*self.partial, *((last,) if self.transient else ())}:
            if 0 <= i <= last:
                p = "true" if i in self.partial else "false"
                tr = "true" if self.transient and i == last else "false"
                out[i] = (f"{head}{_enc(self.texts[i])}{mid}{self.offsets[i]},\"partial\":{p},\"transient\":{tr},"
                          f"\"node\":{_enc(self.node)}}}")
        return "\n".join(out)


# (a batch made by of_chunk has no texts or offsets of its own until they are first read, by __getattr__:
# no class-level default may answer for them; the constructor keeps its defaults)
delattr(LogBatch, "texts")
delattr(LogBatch, "offsets")


@dataclass(frozen=True)
class LogMarks(Event):
    """When the supervisor's live analysis read each log file of its run:
    ``upto[path]`` lists ``[offset, t]`` pairs, ascending: by ``t`` it had read
    every line that starts at or before ``offset`` (the path relative to the
    run directory, as ``LogBatch.path``; ``t`` the time of that read).  Written
    into the journal while lines come, one event per ``MARK_EVERY`` seconds
    at most, with up to ``MARKS_PER_FILE`` reads of a file each, so that a
    replay of the run (``diagnose``) gives every line the time the live
    analysis had it: a finished run's logs are read all at once.  Journal-only:
    a session passes them on only when asked (``Session(marks=True)``)."""

    kind: ClassVar[str] = "marks"
    upto: dict = field(default_factory=dict)


MARK_EVERY = 0.5  # seconds between two LogMarks, at least
MARKS_PER_FILE = 8  # reads of one file one LogMarks keeps, at most (more: the last is moved on)


@dataclass(frozen=True)
class NoteEvent(Event):
    """Something ddptop itself wants to tell the person (not an alarm)."""

    kind: ClassVar[str] = "note"
    level: str = "info"
    message: str = ""
    node: str = ""


@dataclass(frozen=True)
class LaunchEvent(Event):
    """torchrun was (re)started by ddptop (generation 0 is the first launch),
    or a node's cluster restarted it (``node_restart``: a new attempt of that
    node, whose generations an attached client counts on from the last).

    ``env_diff`` is what this launch's environment changes relative to the
    first one (secret values masked); ``profiles`` the profiles applied.
    """

    kind: ClassVar[str] = "launch"
    generation: int = 0
    profiles: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    env_diff: dict = field(default_factory=dict)
    reason: str = ""
    node: str = ""
    # the node's restart by its cluster that began this launch (1, 2, ...: its container or pod was restarted,
    # and ddptop in it began a new run, seen through ``attach --k8s``); 0: a launch by ddptop
    node_restart: int = 0


@dataclass(frozen=True)
class ProgressEvent(Event):
    """A rank's step count from its in-process hook or ``ddptop.beat``.

    ``t`` is when the rank made the step (its own clock).
    ``source``: ``hook`` (optimizer steps counted automatically), ``beat``
    (``ddptop.beat()``) or ``batch``: then ``step`` counts the batches the
    rank has drawn from any ``DataLoader`` (training and evaluation alike) and
    ``phase`` says what it is doing.
    """

    kind: ClassVar[str] = "progress"
    rank: int = 0
    step: int = 0
    source: str = "hook"
    node: str = ""
    phase: str = ""  # source "batch": train | eval (the model's mode) | save (inside torch.save)


@dataclass(frozen=True)
class GpuStatusEvent(Event):
    """Which GPU backend is in use, or why there is none ("no NVIDIA driver")."""

    kind: ClassVar[str] = "gpu_status"
    backend: str = "none"  # nvml | sim | none
    message: str = ""
    fault: str = ""  # a driver that is there but failed: what to do
    driver: str | None = None
    count: int = 0
    node: str = ""


@dataclass(frozen=True)
class GpuEvent(Event):
    """One GPU, one sample.  A field the GPU does not report is None ("n/a")."""

    kind: ClassVar[str] = "gpu"
    index: int = 0
    name: str = ""
    uuid: str = ""
    util: float | None = None  # SM utilisation, %
    mem_util: float | None = None  # memory-bandwidth utilisation, %
    mem_used: int | None = None  # bytes
    mem_total: int | None = None  # bytes
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_tx_kbs: int | None = None
    pcie_rx_kbs: int | None = None
    ecc_uncorrected: int | None = None
    retired_pages: int | None = None
    throttle: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()  # ranks running on this GPU
    pids: tuple[int, ...] = ()  # processes NVML sees on it
    mapping: str = ""  # how ranks were mapped (the weakest of its ranks'): nvml | device | env | guess | sim
    simulated: bool = False
    lost: bool = False
    node: str = ""


@dataclass(frozen=True)
class ProcEvent(Event):
    """One rank process, one psutil sample."""

    kind: ClassVar[str] = "proc"
    rank: int = 0
    pid: int = 0
    cpu: float | None = None  # % of one core (the rank itself)
    rss: int | None = None  # bytes
    status: str = ""  # running, sleeping, disk-sleep, zombie, ...
    threads: int | None = None
    children: int | None = None  # data-loader workers and other descendants
    children_cpu: float | None = None  # % of one core, all descendants
    gpu: int | None = None  # GPU index the rank runs on
    # nvml: its pid on NVML's list; device: by the GPU its environment names, where NVML's pids are
    # not ours (a container); env: the same, outside one (not on a GPU NVML lists yet); guess; sim
    gpu_mapping: str = ""
    node: str = ""


@dataclass(frozen=True)
class AlarmEvent(Event):
    """Something is wrong and a person should look.

    ``type``: stall, signature, crash or gpu.  ``culprits`` are global ranks.
    ``node``: the node it concerns; in the merged view of several nodes, a
    stall's is the culprits' node when they are all on one ("all nodes"
    otherwise), and each ``where`` entry names its rank's node.
    """

    kind: ClassVar[str] = "alarm"
    type: str = "gpu"
    id: str = ""
    ranks: tuple[int, ...] = ()
    culprits: tuple[int, ...] = ()
    message: str = ""
    suggested_profiles: tuple[str, ...] = ()
    node: str = ""
    # where each culprit is stuck, from its stack (in JSON: {"<rank>": Where.to_dict()})
    where: Mapping[int, Where] = field(default_factory=dict)
    # the nodes' own stall alarms this (cross-node) alarm took in as its evidence, instead of showing them
    # separately (``analysis.nodes``)
    folded: tuple[FoldedAlarm, ...] = ()


@dataclass(frozen=True)
class StacksEvent(Event):
    """Every rank's Python stack, sampled (py-spy) two or more times a second or
    more apart when a stall is suspected, and what the samples say: ``hung``
    (True: frozen, or frozen in a collective while others move; False: every
    rank moving, which is work; None: cannot tell), the ``culprits``, the
    ``waiting`` ranks, ``mismatch`` (the waiting ranks wait in different
    collectives or sync points), ``where`` every sampled rank is (as in
    ``AlarmEvent.where``), the stack ``groups`` (ranks sharing one stack,
    described once), ``native`` (the samples include native frames) and
    ``dir``, where the dumps are.  Read it back typed with
    ``model.evidence.StackEvidence.from_event``."""

    kind: ClassVar[str] = "stacks"
    ranks: tuple[int, ...] = ()
    samples: int = 0
    span: float = 0.0  # seconds from the first sample to the last
    hung: bool | None = None
    culprits: tuple[int, ...] = ()
    summary: str = ""
    where: Mapping[int, Where] = field(default_factory=dict)  # in JSON: {"<rank>": Where.to_dict()}
    groups: tuple[StackGroup, ...] = ()
    dir: str = ""
    error: str = ""  # why there are no (or only some) samples: py-spy missing, ptrace denied
    node: str = ""
    io: tuple[int, ...] = ()  # ranks in I/O (a checkpoint write) in every sample: work, unless it lasts
    waiting: tuple[int, ...] = ()  # ranks waiting for their peers (collective, backward, GPU sync)
    mismatch: bool = False
    workers: tuple[int, ...] = ()  # the ranks the others wait for, visibly working (hung False: not yet a hang)
    native: bool = False  # native frames were read (py-spy --native: the ranks were paused for it)
    pause: float = 0.0  # the longest a rank was paused for a native sample, seconds
    deadlock: bool = False  # every rank blocked on the CUDA driver's lock: a deadlock in the driver
    given_up: tuple[int, ...] = ()  # ranks whose native frames were given up (too slow): Python frames only


@dataclass(frozen=True)
class RasEvent(Event):
    """What NCCL's RAS port said when ddptop asked (at a suspected stall,
    during a stall, on a stack capture): ``culprits`` (global ranks) and
    ``text`` (who launched which collective, who is missing or dead), ``behind``
    (rank, as a string key -> what RAS says of it, for the rank table), or
    ``error`` (why there is no answer: refused, timed out, RAS off, NCCL too
    old).  ``file``: the raw answer, kept in the run's stall capture.  A
    ``PEER_DEAD`` that NCCL pushed (MONITOR, 2.29+) comes with ``event`` set."""

    kind: ClassVar[str] = "ras"
    addr: str = ""
    ok: bool = False
    version: str = ""  # NCCL's, as the answer says it
    format: str = ""  # json | text
    culprits: tuple[int, ...] = ()
    text: str = ""
    behind: Mapping[int, str] = field(default_factory=dict)  # in JSON: {"<rank>": "..."}
    error: str = ""
    took: float = 0.0  # seconds the query took
    file: str = ""
    node: str = ""
    event: str = ""  # "" for an asked-for report; PEER_DEAD for one NCCL pushed (MONITOR)


@dataclass(frozen=True)
class LinkEvent(Event):
    """The state of the link to an attached node (``ddptop attach HOST``).

    ``state``: connecting, up, down (reconnecting after ``retry_in`` seconds),
    failed (gave up: ``message`` says why and what to do), closed (the job ended).
    """

    kind: ClassVar[str] = "link"
    node: str = ""
    state: str = "connecting"
    message: str = ""
    retry_in: float | None = None
    connects: int = 0  # successful connections so far
    tries: int = 0  # tries that failed since the link was last up (a drop is said once, at the first)


_KINDS: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (StateEvent, RankEvent, LogEvent, LogBatch, LogMarks, NoteEvent, LaunchEvent, ProgressEvent, GpuStatusEvent, GpuEvent,
                ProcEvent, AlarmEvent, LinkEvent, StacksEvent, RasEvent)
}


class BadEvent(ValueError):
    """A line that is JSON but not an event this ddptop can use (the message says why)."""


class UnknownKind(BadEvent):
    """An event kind this ddptop does not know (a newer ddptop wrote it): readers skip it quietly."""


def _plain(v: Any) -> Any:
    """A typed field's value as JSON: evidence objects as their dicts, rank keys as strings."""
    if hasattr(v, "to_dict"):
        return v.to_dict()
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


def _rank_key(k: Any) -> int:
    if isinstance(k, int) and not isinstance(k, bool):
        return k
    if isinstance(k, str) and k.lstrip("-").isdigit():
        return int(k)
    raise TypeError(f"expected a rank, got {k!r:.40}")


# the evidence types an event may carry, read from their JSON form once, here
_OBJECTS: dict[str, Any] = {"Where": Where, "StackGroup": StackGroup, "FoldedAlarm": FoldedAlarm}


def _checker(annotation: str):
    """A function value -> value (tuples as tuples) that raises TypeError on a wrong type."""
    a = annotation.replace(" ", "")
    optional = a.endswith("|None")
    base = a[: -len("|None")] if optional else a
    if base.startswith("Mapping[int,"):
        value = base[len("Mapping[int,"):-1]
        # (a Where knows its own rank: it is read with its key)
        inner = (lambda k, x: x if isinstance(x, Where) else Where.from_dict(_object(x), k)) if value == "Where" \
            else (lambda _k, x, of=_checker(value): of(x))

        def check(v):
            if not isinstance(v, Mapping):
                raise TypeError(f"expected an object, got {v!r:.40}")
            return {(r := _rank_key(k)): inner(r, x) for k, x in v.items()}
    elif base in _OBJECTS:
        cls = _OBJECTS[base]

        def check(v):
            return v if isinstance(v, cls) else cls.from_dict(_object(v))
    elif base.startswith("tuple["):
        inner = _checker(base[len("tuple["):].split(",")[0])

        def check(v):
            if isinstance(v, (list, tuple)):
                return tuple(inner(x) for x in v)
            raise TypeError(f"expected a list, got {v!r:.40}")
    elif base == "dict":
        def check(v):
            if isinstance(v, dict):
                return v
            raise TypeError(f"expected an object, got {v!r:.40}")
    elif base in ("int", "float", "str", "bool"):
        types = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}[base]

        def check(v):
            if isinstance(v, types) and (base == "bool" or not isinstance(v, bool)):
                return v
            raise TypeError(f"expected {base}, got {v!r:.40}")
    else:  # not used by any event today: accept as it is
        def check(v):
            return v
    if not optional:
        return check
    return lambda v: None if v is None else check(v)


def _object(v: Any) -> Mapping:
    if isinstance(v, Mapping):
        return v
    raise TypeError(f"expected an object, got {v!r:.40}")


_FIELDS = {
    cls: {f.name: _checker(str(f.type)) for f in dataclasses.fields(cls)}
    for cls in _KINDS.values()
}


def _exact(annotation: str) -> frozenset | None:
    """The types a scalar field's value is taken as it is when it has exactly (what JSON gives: most of a
    busy job's events are GPU, process and progress readings, thousands a second at 128 nodes); None for
    the others (their checker always runs)."""
    a = annotation.replace(" ", "")
    optional = a.endswith("|None")
    base = a[: -len("|None")] if optional else a
    scalars: dict[str, set[type]] = {"int": {int}, "float": {int, float}, "str": {str}, "bool": {bool}}
    types = scalars.get(base)
    if types is None:
        return None
    return frozenset(types | ({type(None)} if optional else set()))


_EXACT = {
    cls: {f.name: e for f in dataclasses.fields(cls) if (e := _exact(str(f.type))) is not None}
    for cls in _KINDS.values()
}
_UNSET: Any = object()
_MANY = 10  # fields from which filling the dict is the quicker (a progress event's 7 construct faster)
# each kind's fields in their order, with their defaults (_UNSET: none, or made by a factory), and the fields
# that have a factory: from_dict builds an event's __dict__ from these instead of calling the dataclass's
# __init__ (a frozen dataclass sets its fields one by one through object.__setattr__: a GPU reading of 27
# fields took 20 times as long to construct as to fill its dict, and thousands of readings a second come
# off the wire at 128 nodes)
_TEMPLATE = {
    cls: {f.name: (f.default if f.default is not dataclasses.MISSING else _UNSET) for f in dataclasses.fields(cls)}
    for cls in _KINDS.values()
}
_FACTORIES = {
    cls: tuple((f.name, f.default_factory) for f in dataclasses.fields(cls)
               if f.default_factory is not dataclasses.MISSING)
    for cls in _KINDS.values()
}
assert not any(hasattr(cls, "__post_init__") for cls in _KINDS.values())  # (from_dict does not call it)
# the fields whose values are evidence objects or rank-keyed maps (to_dict turns them into JSON)
_TYPED = {
    cls: tuple(f.name for f in dataclasses.fields(cls)
               if str(f.type).startswith(("Mapping[", "tuple[StackGroup", "tuple[FoldedAlarm")))
    for cls in _KINDS.values()
}


def from_dict(d: Any) -> Event:
    """Rebuild an event from its dict form, checking every field's type.

    Unknown keys are ignored (a newer ddptop may add fields); an unknown kind
    raises ``UnknownKind``, anything else that is not a valid event raises
    ``BadEvent`` naming the field: a damaged line never becomes an event whose
    wrong-typed field fails later, far from the cause.
    """
    if not isinstance(d, dict):
        raise BadEvent(f"not a JSON object but {type(d).__name__}")
    kind = d.get("kind")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        if isinstance(kind, str):
            raise UnknownKind(f"unknown event kind {kind!r}")
        raise BadEvent("no event kind")
    fields = _FIELDS[cls]
    exact = _EXACT[cls]
    if "t" not in d:
        raise BadEvent(f"{kind} event without a time 't'")
    kw = {}
    for k, v in d.items():
        ok = exact.get(k)
        if ok is not None and type(v) in ok:
            kw[k] = v  # (a scalar of exactly its type: what its checker would return)
            continue
        check = fields.get(k)
        if check is None:
            continue
        try:
            kw[k] = check(v)
        except TypeError as e:
            raise BadEvent(f"{kind} event, field {k!r}: {e}") from None
    if cls is LogBatch:
        n = len(kw.get("texts", ()))
        if len(kw.get("offsets", ())) != n:
            raise BadEvent("logs event with a different number of offsets and texts")
        if any(not 0 <= i < n for i in kw.get("partial", ())):
            raise BadEvent("logs event, field 'partial': an index out of range")
        if kw.get("transient") and not n:
            raise BadEvent("logs event: transient without a line")
    template = _TEMPLATE[cls]
    if len(template) < _MANY:
        return cls(**kw)
    vals = dict(template)
    vals.update(kw)
    for name, make in _FACTORIES[cls]:
        if vals[name] is _UNSET:
            vals[name] = make()
    if vals["t"] is _UNSET:  # (the only field without a default; checked above)
        raise BadEvent(f"{kind} event without a time 't'")
    ev = _new(cls)
    _setattr(ev, "__dict__", vals)  # (= cls(**kw): the fields in their order, the defaults where not given)
    return ev


def from_json(line: str) -> Event:
    try:
        d = json.loads(line)
    except ValueError as e:
        raise BadEvent(f"not JSON ({e})") from None
    return from_dict(d)
