"""Who said a line: the per-line prefixes launchers put on their ranks' output.

One parser for every reader (``ddptop diagnose``, the live analysis, logs
read through ``kubectl logs --prefix``):

* torchrun ``--tee`` / torch: ``[default3]:``, ``[rank3]:``, nested
  ``[default1]:[rank5]:`` (the global one wins);
* Open MPI's ``--tag-output``: ``[1,3]<stderr>:`` (job id, MPI rank, stream);
* ``srun --label``: ``3: `` (the task id; padded to a common width);
* pdsh (DeepSpeed's multi-node launcher): ``worker-1: ``, ``10.0.0.5: `` (the host);
* Ray: ``(pid=1234, ip=10.0.0.1)``, ``(RayTrainWorker pid=1234, ip=...)``;
  a worker's rank when the log says it (Ray Train's ``- (ip=..., pid=1234)
  world_rank=3, ...`` lines, or torch's own ``[rankN]:`` inside);
* ``kubectl logs --prefix``: ``[pod/NAME/CONTAINER]`` (the pod is the host).

Prefixes nest (``worker-1: [rank5]: ...``); each is taken off in turn, and the
innermost rank wins (torch's global rank over a launcher's task id).  The two
forms that ordinary text can look like (``3: `` and ``host: ``) count only
once a reader has seen them on several lines (:class:`PrefixReader`); the
stateless :func:`split` knows the unambiguous ones only.

Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TORCH = re.compile(r"\s*\[(?P<kind>default|rank)(?P<n>\d+)\]:\s?")
_MPI = re.compile(r"\[(?P<job>\d+),(?P<n>\d+)\]<(?:stdout|stderr|stddiag)>:\s?")
_KUBECTL = re.compile(r"\[pod/(?P<pod>[a-z0-9][a-z0-9.-]{0,252})/(?P<container>[a-z0-9][a-z0-9-]{0,62})\]\s?")
_RAY = re.compile(r"\((?:(?P<actor>[A-Za-z_][\w.]*) )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9a-fA-F.:]+))?\)\s?")
_SRUN = re.compile(r"\s{0,6}(?P<n>\d{1,5}): ")
# a host as pdsh prints it, then ": " (never a time: "12:30:01"): a name (letters, digits, dots and dashes), or
# the IPv4 address a hostfile gave (DeepSpeed's multi-node runs: "10.0.0.5: Traceback ...")
_PDSH = re.compile(r"(?P<host>[A-Za-z][A-Za-z0-9.-]{0,62}|\d{1,3}(?:\.\d{1,3}){3}): ")
# Ray Train's start-up table: "- (node_id=..., ip=10.0.0.1, pid=1234) world_rank=3, local_rank=1, node_rank=1"
_RAY_RANKS = re.compile(r"\bpid=(?P<pid>\d+)\)?,? world_rank=(?P<rank>\d+)")
# words that end a pdsh-looking prefix but are an ordinary line's ("Error: ...", "INFO: ...", "Traceback: ")
_NOT_HOSTS = frozenset({"error", "warning", "info", "debug", "note", "critical", "fatal", "traceback", "caused",
                        "exception", "hint", "usage", "epoch", "step", "loss", "file", "http", "https", "details",
                        "reason", "message", "stderr", "stdout", "srun", "slurmstepd", "sbatch", "mpirun", "torchrun",
                        "python", "nccl", "gloo", "ray", "deepspeed", "assertionerror", "raise", "warn"})
_SEEN_ENOUGH = 3  # lines in one form before an ambiguous form counts


# the launchers' own word on which local rank is which global one:
# torch elastic's "Rendezvous complete for workers" block ("local_ranks=[0, 1]" then "global_ranks=[4, 5]"),
# DeepSpeed's "global_rank_mapping=defaultdict(<class 'list'>, {'worker-0': [0, 1], 'worker-1': [2, 3]})"
_LOCAL_RANKS = re.compile(r"\blocal_ranks=\[(?P<ranks>[\d, ]*)\]")
_GLOBAL_RANKS = re.compile(r"\bglobal_ranks=\[(?P<ranks>[\d, ]*)\]")
_DS_MAPPING = re.compile(r"global_rank_mapping=.*?\{(?P<map>(?:'[^']+': \[[\d, ]*\](?:, )?)+)\}")
_DS_ENTRY = re.compile(r"'(?P<host>[^']+)': \[(?P<ranks>[\d, ]*)\]")


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.replace(" ", "").split(",") if x]


class RankMapping:
    """Local rank -> global rank, per host ("" when the log names none), as
    the launchers say it.  Fed every line of a source in order."""

    def __init__(self) -> None:
        self.by_host: dict[str, dict[int, int]] = {}
        self._local: dict[str, list[int]] = {}

    def learn(self, text: str, host: str = "") -> None:
        if "_ranks=" in text:
            m = _LOCAL_RANKS.search(text)
            if m:
                self._local[host] = _ints(m.group("ranks"))
            m = _GLOBAL_RANKS.search(text)
            if m and host in self._local:
                glob = _ints(m.group("ranks"))
                if len(glob) == len(self._local[host]):
                    self.by_host[host] = dict(zip(self._local.pop(host), glob))
        if "global_rank_mapping=" in text:
            m = _DS_MAPPING.search(text)
            if m:
                for e in _DS_ENTRY.finditer(m.group("map")):
                    self.by_host[e.group("host")] = dict(enumerate(_ints(e.group("ranks"))))

    def global_rank(self, local: int, host: str = "") -> int | None:
        """The global rank of ``local`` on ``host``; None when the launchers did not say."""
        ranks = self.by_host.get(host)
        if ranks is None and len(self.by_host) == 1 and not host:
            ranks = next(iter(self.by_host.values()))  # (one node's console: its block is the one)
        return None if ranks is None else ranks.get(local)


@dataclass(frozen=True)
class Prefixed:
    """One line with its prefixes taken off."""

    text: str  # the rest of the line
    rank: int | None = None  # the global rank when a prefix says it
    host: str = ""  # the host or pod a prefix names
    pid: int | None = None  # the process a prefix names (Ray)
    forms: tuple[str, ...] = ()  # which prefixes were taken off, outermost first
    local: bool = False  # ``rank`` is a local rank (torchrun --tee's "[defaultN]:" alone)


def split(text: str, *, label: bool = False, pdsh: bool = False,
          ray_ranks: dict[tuple[str, int], int] | None = None, label_is_rank: bool = True) -> Prefixed:
    """Take ``text``'s prefixes off.  ``label``/``pdsh``: also the ambiguous
    ``srun --label`` and pdsh host forms; ``ray_ranks``: (ip, pid) -> rank, as
    Ray Train's start-up lines say; ``label_is_rank``: an srun task is one
    rank (not a node's torchrun, whose ranks say their own prefixes)."""
    if not text or text[0] not in "[( 0123456789" and not (pdsh and text[0].isalpha()):
        return Prefixed(text)
    rank: int | None = None
    local: int | None = None
    host, pid, forms = "", None, []
    pos = 0
    while pos < len(text):
        c = text[pos]
        m = None
        if c == "[" or c == " ":
            m = _TORCH.match(text, pos)
            if m:
                if m.group("kind") == "rank":
                    rank = int(m.group("n"))
                else:
                    local = int(m.group("n"))
                forms.append("torch")
            elif c == "[":
                m = _MPI.match(text, pos)
                if m:
                    rank = int(m.group("n"))
                    forms.append("mpi")
                else:
                    m = _KUBECTL.match(text, pos)
                    if m:
                        host = m.group("pod")
                        forms.append("kubectl")
        elif c == "(":
            m = _RAY.match(text, pos)
            if m:
                pid = int(m.group("pid"))
                host = m.group("ip") or host
                if ray_ranks and (host, pid) in ray_ranks:
                    rank = ray_ranks[(host, pid)]
                elif ray_ranks and ("", pid) in ray_ranks:
                    rank = ray_ranks[("", pid)]
                forms.append("ray")
        if m is None and label and (c.isdigit() or c == " "):
            m = _SRUN.match(text, pos)
            if m:
                if label_is_rank and rank is None:
                    rank = int(m.group("n"))
                else:
                    host = host or f"task {m.group('n')}"
                forms.append("srun")
        if m is None and pdsh and (c.isalpha() or c.isdigit()) and not forms:
            m = _PDSH.match(text, pos)
            if m and m.group("host").lower() not in _NOT_HOSTS:
                host = m.group("host")
                forms.append("pdsh")
            else:
                m = None
        if m is None or m.end() == pos:
            break
        pos = m.end()
    if not forms:
        return Prefixed(text)
    if rank is None and local is not None:
        # (torchrun --tee's local rank: the global one on one node)
        return Prefixed(text[pos:], local, host, pid, tuple(forms), True)
    return Prefixed(text[pos:], rank, host, pid, tuple(forms))


class PrefixReader:
    """:func:`split` for one source read in order: it learns which ambiguous
    forms the source uses (``srun --label``, pdsh) once it has seen them on
    several lines, and which Ray worker is which rank."""

    def __init__(self) -> None:
        self._label_seen = 0
        self._pdsh_seen: dict[str, int] = {}
        self.label = False
        self.pdsh = False
        self.ray_ranks: dict[tuple[str, int], int] = {}
        self._inner: dict[str, set[int]] = {}  # srun task -> the torch ranks its lines name
        self.label_is_rank = True
        self.mapping = RankMapping()

    def learn(self, text: str) -> None:
        """Look at a line without taking it (a first pass over a whole file)."""
        m = _SRUN.match(text)
        if m:
            if not self.label:
                self._label_seen += 1
                self.label = self._label_seen >= _SEEN_ENOUGH
            inner = _TORCH.match(text, m.end())
            if inner and self.label_is_rank:
                # (one task's lines naming several ranks: each task is a node's torchrun, not a rank)
                seen = self._inner.setdefault(m.group("n"), set())
                seen.add(int(inner.group("n")))
                self.label_is_rank = len(seen) < 2
        if not self.pdsh and text[:1].isalnum():
            m = _PDSH.match(text)
            if m and m.group("host").lower() not in _NOT_HOSTS:
                h = m.group("host")
                self._pdsh_seen[h] = self._pdsh_seen.get(h, 0) + 1
                # (one host name repeated, or several: pdsh's form, not a word followed by a colon)
                self.pdsh = sum(self._pdsh_seen.values()) >= _SEEN_ENOUGH and (
                    len(self._pdsh_seen) >= 2 or any("-" in k or "." in k or k[-1:].isdigit() for k in self._pdsh_seen))
        if "_ranks=" in text or "global_rank_mapping=" in text:
            p = split(text, label=self.label, pdsh=self.pdsh, label_is_rank=self.label_is_rank)
            self.mapping.learn(p.text, p.host)
        if "world_rank=" in text:
            m = _RAY_RANKS.search(text)
            if m:
                ip = re.search(r"\bip=([0-9a-fA-F.:]+)", text)
                self.ray_ranks[(ip.group(1) if ip else "", int(m.group("pid")))] = int(m.group("rank"))
                self.ray_ranks.setdefault(("", int(m.group("pid"))), int(m.group("rank")))

    def split(self, text: str) -> Prefixed:
        self.learn(text)
        p = split(text, label=self.label, pdsh=self.pdsh, ray_ranks=self.ray_ranks, label_is_rank=self.label_is_rank)
        if p.local and p.rank is not None:
            g = self.mapping.global_rank(p.rank, p.host)
            if g is not None:
                p = Prefixed(p.text, g, p.host, p.pid, p.forms)
        if p.pid is not None and p.rank is not None and "torch" in p.forms:
            # a Ray worker whose own line says its rank (torch's "[rankN]:" inside): its other lines are that rank's
            self.ray_ranks.setdefault((p.host, p.pid), p.rank)
        return p
