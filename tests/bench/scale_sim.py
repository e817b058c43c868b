"""The nodes of a simulated 1,024-rank job, for ``bench.py scale`` (issue 35).

One process stands in for every node of a SLURM job but one: for each node it
writes, in memory, what that node's ddptop supervisor and ranks would write
into the node's run journal (rank log lines, the step hook's beats, GPU and
process telemetry, the node's own stall analysis and its stack samples), and
serves it over the real wire protocol (``ddptop.core.sessions.wire``) as
``ddptop agent`` would read and send it: a hello with the node's versions,
run and meta; per poll, the new ``events.jsonl`` events, the changed beats as
``progress`` events and one ``logs`` batch per log file, then a ``cursor``
with every file's offset (a poll right after what was written, at most every
``agent.AGENT_GAP`` seconds, as the agent paces its reads); a cursor alone
every 2 s when nothing happens; the replies to ``accept`` and ``stacks``; the
final state, then ``bye``.  Every object is what the real event classes and
``wire`` write (``check_json`` holds the hand-made JSON to them at start), so
the bytes are those a real agent sends for the same journal.

One node (``--real-node``) is not simulated: its journal is written to disk,
under ``--runs/NODE/RUN``, with this process as its supervisor
(``supervisor.json``; SIGUSR2 asks for stacks, SIGTERM stops the job), and the
real ``ddptop agent`` reads it (the bench's ``srun`` runs it).  The bench
measures that agent's CPU, and compares its stream with this process's model
of the same node (``shadow``: the bytes and batches it would have sent).

Links: the bench's ``srun`` stand-in (``scale_bin/srun``) connects to
``--sock`` and passes the viewer's pipes (its stdin and stdout) with
SCM_RIGHTS, then becomes an idle ``sleep`` holding the socket: the viewer
reads and writes the very pipes it created, this process is on their other
end.  The link ends when the viewer kills its ``srun`` (the socket closes), or
when a node's job ends (bye; the relay is then signalled).

The load (``--mode``):

* ``issue``: 5 lines/s a rank, rank 0 at 10x, a ``--burst``-line burst from
  every rank every 60 s (the first 20 s in), a step a second (the hook's
  ``hook.R`` and ``batch.R`` beats, one line of the five is the step line);
* ``flat20``: 20 lines/s a rank, as ``bench.py ui1024`` (a step a second).

Both: GPU and process telemetry once a second per node (8 ``gpu`` + 8
``proc`` events, at the node's own phase), and at ``--stop-at`` seconds rank
``--odd`` stops (its lines and steps): it sits in ``load_batch`` from then on
(``time.sleep``), and every other rank blocks in the next step's all-reduce,
spinning at its CUDA sync (their GPUs read 100 %, its GPU 0 %).  Each node's
own analysis is the real one (``Pipeline`` with a sampler, fed the node's
progress, telemetry and samples): it suspects the silence, samples stacks
(recorded py-spy dumps, ``tests/data/stacks/cuda_spin_sync.*``, judged by the
real ``stack_verdict.verdict`` for the node's ranks; ready after 1.65 s, as 2
samples of 8 real ranks take: 0.15 s, 1 s apart, then 0.5 s for the native
one) and raises its own stall alarm when its detector says so.  At
``--seconds`` (or a ``stop`` command) the job ends on every node: its final
state, then bye.

Not simulated: the node analysis's log-line parsing (its progress comes from
the hook), torchrun's own log (empty), NCCL RAS.

Writes ``--status`` (JSON) when the odd rank stops (``stopped``: its last
step's time, the step that should have come, its node) and at the end
(``end``: bytes and batches sent per kind of node, links, reconnects,
commands, the shadow's figures, this process's CPU).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import selectors
import signal
import socket
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ddptop import __version__  # noqa: E402
from ddptop.core.analysis.stack_verdict import verdict  # noqa: E402
from ddptop.core.model.events import (  # noqa: E402
    GpuEvent,
    GpuStatusEvent,
    LaunchEvent,
    LogBatch,
    NoteEvent,
    ProcEvent,
    ProgressEvent,
    RankEvent,
    StacksEvent,
    StateEvent,
)
from ddptop.core.model.evidence import StackGroup  # noqa: E402
from ddptop.core.model.run_meta import Meta, Thresholds  # noqa: E402
from ddptop.core.model.session_protocol import ExitStatus  # noqa: E402
from ddptop.core.run.pipeline import Pipeline  # noqa: E402
from ddptop.core.sessions import agent as agent_module  # noqa: E402
from ddptop.core.sessions import wire  # noqa: E402
from ddptop.core.sessions.agent import software_versions  # noqa: E402
from ddptop.core.sources.stack_probe import source_line  # noqa: E402
from ddptop.core.sources.stack_pyspy import normalise, summarise  # noqa: E402

STACKS = ROOT / "tests" / "data" / "stacks"
HEARTBEAT = wire.HEARTBEAT  # (the agent's: a cursor alone every 2 s)
# the agent's pace: seconds between two reads of a node's journal, at least (its session's FileWaker min_gap)
MIN_GAP = getattr(agent_module, "AGENT_GAP", 0.01)
ANALYSIS_EVERY = 0.5  # seconds between passes of the nodes' own analysis (the supervisor's: on file events)
SAMPLE_TIMES = (0.15, 1.0, 0.5)  # a non-blocking py-spy dump of 8 ranks, the gap, a native one
CAPTURE_TOOK = 0.3  # a stack capture (8 non-blocking dumps at once), asked for or at a node's own stall
WATCHER_NAP = 0.25  # the supervisor's watcher takes a stacks request within 0.5 s: on average
GIB = 1 << 30
_enc = json.encoder.encode_basestring  # a JSON string, as the event classes write it (ensure_ascii off)


def _dumps(name: str) -> list[str]:
    return [(STACKS / f"{name}.{i}.txt").read_text() for i in (1, 2)]


class Job:
    """The job's timeline, the same on every node: steps, lines, the odd rank's stop."""

    def __init__(self, a: argparse.Namespace, t0: float):
        self.t0 = t0
        self.mode = a.mode
        self.rpn = a.ranks_per_node
        self.nodes = a.nodes
        self.world = a.nodes * a.ranks_per_node
        self.rate = 5.0 if a.mode == "issue" else 20.0  # lines/s a rank
        self.r0_factor = 10 if a.mode == "issue" else 1
        self.burst = a.burst if a.mode == "issue" else 0
        self.burst_every = 60.0
        self.burst_first = 20.0
        self.odd = a.odd if a.odd < self.world else self.world - 1
        self.stop_at = a.stop_at  # seconds after t0
        self.end_at = a.seconds
        # the last step every rank made: the odd rank stops between steps K and K+1, the others block in
        # step K+1's all-reduce (they print that step's lines up to it), nobody makes step K+1
        self.last_step = int(self.stop_at)
        self.ended = False

    def stopped(self, rank: int, since_t0: float) -> bool:
        if since_t0 < self.stop_at:
            return False
        if rank == self.odd:
            return True
        return since_t0 >= self.last_step + 1  # blocked in the all-reduce of the step that never comes


class Node:
    """One node: its journal (as its supervisor and ranks write it) and its agent's view of it."""

    def __init__(self, sim: "Sim", index: int, job: Job, real_dir: Path | None, model_only: bool = False):
        self.sim = sim
        self.model_only = model_only  # the shadow of the real node: polled and counted, never sent, not analysed
        self.job = job
        self.index = index
        self.name = f"node-{index}"
        rpn = job.rpn
        self.ranks = list(range(index * rpn, (index + 1) * rpn))
        rnd = random.Random(index)
        self.run_id = time.strftime("%Y%m%d-%H%M%S", time.localtime(job.t0)) + f"-{10000 + index:05d}"
        self.real = real_dir is not None
        self.run_dir = str(real_dir / self.run_id) if real_dir is not None else f"/scratch/ddptop/runs/{self.run_id}"
        self.log_id = "4242_" + "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))
        self.paths = {lr: (f"logs/{self.log_id}/attempt_0/{lr}/stderr.log",
                           f"logs/{self.log_id}/attempt_0/{lr}/stdout.log") for lr in range(rpn)}
        self.off = [0] * rpn  # stdout.log sizes
        self.ev_off = 0  # events.jsonl size
        self.pids = {r: 20000 + 37 * lr + index for lr, r in enumerate(self.ranks)}
        # lockstep across nodes, within a few ms (their clocks and the collectives' skew)
        self.phase = (index * 0.0137) % 0.01
        self.tel_phase = rnd.random()  # the telemetry loop's own phase
        self.meta = Meta(self.run_id, ["torchrun", "--nnodes", str(job.nodes), "--nproc-per-node", str(rpn),
                                       "--rdzv-id", "4242", "train.py"],
                         ["torchrun", "--nnodes", str(job.nodes), "--nproc-per-node", str(rpn), "train.py"],
                         {"PYTHONPATH": "/opt/ddptop/_inject", "DDPTOP_BEAT_DIR": f"{self.run_dir}/beats"},
                         "/home/user/llm", self.name, job.t0, f"{self.run_dir}/logs", rpn, index, __version__,
                         gpu="auto", profiles=[], env_unset=[], max_relaunches=3,
                         thresholds=Thresholds().to_dict())
        # what the agent has not polled yet
        self.p_events: list[str] = []
        self.p_beats: dict[tuple[str, int], tuple[int, float, str]] = {}
        self.p_lines: dict[int, tuple[list[int], list[str]]] = {}
        self.dirty = False
        self.final: StateEvent | None = None
        self.link: Link | None = None
        self.last_sent = 0.0
        self.steps = {r: 0 for r in self.ranks}
        self.batches = {r: 0 for r in self.ranks}
        self.line_no = {r: 0 for r in self.ranks}
        # the node's own analysis, as its supervisor's watcher runs it
        self.pipe = Pipeline(node=self.name, sampler=self._sample, on_stall=self._on_stall,
                             thresholds=Thresholds())
        self.feed: list = []
        self.capture_busy = False
        self._stacks_cache: dict = {}
        self._tel: dict = {}
        self._cursor_keys = "".join(f'"{p0}":0,"{p1}":{{{lr}}},' for lr, (p0, p1) in sorted(self.paths.items()))
        self._paths_js = {lr: _enc(p[1]) for lr, p in self.paths.items()}
        self.rd = None  # the real node's files
        if self.real:
            self._open_files(real_dir)

    # -- writing (the node's supervisor and ranks) --------------------------------------------------

    def _open_files(self, runs: Path) -> None:
        from ddptop.core.run import journal

        d = Path(self.run_dir)
        (d / "beats").mkdir(parents=True)
        for lr in range(self.job.rpn):
            (d / "logs" / self.log_id / "attempt_0" / str(lr)).mkdir(parents=True)
        journal.write_json(d / "meta.json", self.meta.to_dict())
        (d / "torchrun.log").write_text("")
        me = __import__("psutil").Process()
        journal.write_json(d / "supervisor.json", {"pid": me.pid, "create_time": me.create_time()})
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        self.rd = {"events": os.open(d / "events.jsonl", flags, 0o600),
                   "out": [os.open(d / p[1], flags, 0o644) for _, p in sorted(self.paths.items())],
                   "err": [os.open(d / p[0], flags, 0o644) for _, p in sorted(self.paths.items())],
                   "beats": {}, "dir": d}

    def event(self, ev, feed: bool = True, js: str | None = None) -> None:
        s = js if js is not None else ev.to_json()
        if self.rd is not None:
            os.write(self.rd["events"], (s + "\n").encode())
        else:
            self.p_events.append(s)
            self.ev_off += len(s.encode()) + 1
            self._dirty()
        if self.sim.shadow is self:
            self.sim.shadow_node.event(ev, feed=False, js=s)
        if feed and not self.model_only:
            self.feed.append(ev)

    def line(self, rank: int, text: str) -> None:
        lr = rank - self.ranks[0]
        if self.rd is not None:
            os.write(self.rd["out"][lr], (text + "\n").encode())
        else:
            offs, texts = self.p_lines.setdefault(lr, ([], []))
            offs.append(self.off[lr])
            texts.append(text)
            self.off[lr] += len(text.encode()) + 1
            self._dirty()
        if self.sim.shadow is self:
            self.sim.shadow_node.line(rank, text)

    def lines(self, rank: int, texts: list[str]) -> None:
        if self.rd is not None:
            lr = rank - self.ranks[0]
            os.write(self.rd["out"][lr], "".join(t + "\n" for t in texts).encode())
            if self.sim.shadow is self:
                for t in texts:
                    self.sim.shadow_node.line(rank, t)
        else:
            for t in texts:
                self.line(rank, t)

    def beat(self, source: str, rank: int, n: int, t: float, phase: str = "") -> None:
        lr = rank - self.ranks[0]
        if self.rd is not None:
            fd = self.rd["beats"].get((source, lr))
            if fd is None:
                fd = self.rd["beats"][(source, lr)] = os.open(self.rd["dir"] / "beats" / f"{source}.{rank}",
                                                              os.O_WRONLY | os.O_CREAT, 0o600)
            data = b"%020d %.6f\n" % (n, t) if source == "hook" else b"%020d %.6f %-5s\n" % (n, t, phase.encode())
            os.pwrite(fd, data, 0)
        else:
            self.p_beats[(source, lr)] = (n, t, phase)
            self._dirty()
        if self.sim.shadow is self:
            self.sim.shadow_node.beat(source, rank, n, t, phase)
        if not self.model_only:
            self.feed.append(ProgressEvent(t, rank=rank, step=n, source=source, phase=phase))

    def _dirty(self) -> None:
        if not self.dirty:
            self.dirty = True
            if not self.model_only:
                self.sim.dirty.add(self)

    def start(self) -> None:
        t = self.job.t0
        host = self.name
        self.event(GpuStatusEvent(t, backend="nvml", message="NVIDIA driver 550.54.15, 8 GPUs", driver="550.54.15",
                                  count=self.job.rpn, node=host))
        self.event(LaunchEvent(t + 0.002, generation=0, command=tuple(self.meta.command), reason="launch"))
        self.event(StateEvent(t + 0.004, state="running", message=f"torchrun pid {19990 + self.index}"))
        for lr, r in enumerate(self.ranks):
            self.event(RankEvent(t + 0.5, rank=r, local_rank=lr, node=host, pid=self.pids[r], attempt=0, alive=True))

    def tick_lines(self, m: int, per_s: int) -> None:
        """Line tick m (per_s ticks a second): one line per live rank; the step on whole seconds."""
        job = self.job
        since = m / per_s
        now = job.t0 + since + self.phase
        step_tick = m % per_s == 0 and m > 0
        k = m // per_s  # the step under way
        for r in self.ranks:
            if job.stopped(r, since):
                continue
            if step_tick:
                self.steps[r] += 1
                self.batches[r] += 1
                self.beat("hook", r, self.steps[r], now)
                self.beat("batch", r, self.batches[r], now, "train")
            if r == 0 and job.r0_factor > 1:
                continue  # (rank 0 has its own, faster ticks)
            self.line(r, self._text(r, k, m % per_s))

    def tick_rank0(self, m: int, per_s: int) -> None:
        since = m / per_s
        if self.job.stopped(0, since):
            return
        k = m // per_s
        j = m % per_s
        if j % self.job.r0_factor == 0:
            self.line(0, self._text(0, k, j // self.job.r0_factor))
        else:
            self.line(0, f"[rank0]: [metrics] step {k} part {j} grad_norm/layer{j % 48}={0.01 * (j + k % 17):.4f} "
                         f"act_max={3.1 + (k % 7) * 0.11:.2f} lr=3.0e-04")

    def _text(self, r: int, k: int, j: int) -> str:
        self.line_no[r] += 1
        if self.job.mode == "flat20":
            return (f"[node{self.index}] rank {r} step {k * 20 + j} loss 0.{(k * 20 + j) % 997:03d} lr 3e-4 "
                    f"tokens/s 51234")
        if j == 0:
            return (f"[rank{r}]: step {k} | loss {2.5 - k * 0.001 + (r % 13) * 0.0001:.4f} | lr 3.00e-04 | "
                    f"grad_norm {0.8 + (k % 9) * 0.01:.3f} | tokens/s {51234 + (r * 7 + k) % 500}")
        return (f"[rank{r}]: iter {k}.{j} fwd {41 + (k + r) % 7} ms bwd {83 + (k * 3 + r) % 11} ms "
                f"data {2 + (k + j) % 5} ms mem 61.{(k + r) % 10} GiB")

    def burst(self, b: int) -> None:
        since = self.job.burst_first + b * self.job.burst_every
        for r in self.ranks:
            if self.job.stopped(r, since):
                continue
            self.lines(r, [f"[rank{r}]: eval {b} batch {i}/{self.job.burst} loss {1.9 + i * 0.0001:.4f} "
                           f"acc {0.61 + (i % 50) * 0.001:.3f}" for i in range(self.job.burst)])

    def telemetry(self, now: float) -> None:
        """The supervisor's telemetry tick: a gpu event per GPU, then a proc event per rank (as
        ``Telemetry.tick`` writes them).  (Each made once per state and kept: its JSON with this tick's time.)"""
        job = self.job
        since = now - job.t0
        t = repr(now)
        for kind in ("gpu", "proc"):
            for lr, r in enumerate(self.ranks):
                stuck = job.stopped(r, since)
                util = 97.0 + (r + int(since)) % 3
                key = (kind, lr, stuck, util)
                made = self._tel.get(key)
                if made is None:
                    made = self._tel[key] = self._telemetry_event(kind, lr, r, stuck, r == job.odd and stuck, util)
                ev, rest = made
                self.event(ev, js='{"t":' + t + rest)

    def _telemetry_event(self, kind: str, lr: int, r: int, stuck: bool, odd: bool, util: float):
        if kind == "gpu":
            ev = GpuEvent(0.0, index=lr, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-{self.index:04x}{lr:02x}-5a3b",
                          util=0.0 if odd else (100.0 if stuck else util), mem_util=0.0 if odd else 38.0,
                          mem_used=66 * GIB, mem_total=80 * GIB, power_w=130.0 if odd else 610.0,
                          power_limit_w=700.0, temp_c=41.0 if odd else 67.0, sm_clock_mhz=1980, pcie_gen=5,
                          pcie_width=16, pcie_tx_kbs=1200, pcie_rx_kbs=900, ecc_uncorrected=0, retired_pages=0,
                          ranks=(r,), pids=(self.pids[r],), mapping="nvml", node=self.name)
        else:
            ev = ProcEvent(0.0, rank=r, pid=self.pids[r], cpu=0.3 if odd else (100.0 if stuck else 88.0),
                           rss=9 * GIB, status="sleeping" if odd else "running", threads=14, children=4,
                           children_cpu=0.0 if stuck else 31.0, gpu=lr, gpu_mapping="nvml", node=self.name)
        js = ev.to_json()
        assert js.startswith('{"t":0.0,')
        return ev, js[len('{"t":0.0'):]

    def end(self, now: float, state: str, code: int, message: str, ended_by: str) -> None:
        if self.final is not None:
            return
        if self.rd is not None:
            from ddptop.core.run import journal
            journal.write_json(self.rd["dir"] / "exit.json", {"state": state, "exit_code": code, "t": now,
                                                               "message": message, "ended_by": ended_by})
        self.final = StateEvent(now, state=state, exit_code=code, message=message, ended_by=ended_by)
        self.event(self.final, feed=False)

    # -- the node's own analysis (its supervisor's watcher) ---------------------------------------

    def analyse(self, now: float) -> None:
        feed, self.feed = self.feed, []
        alarms = self.pipe.process(feed, now)
        if alarms:
            for a in alarms:
                self.event(a, feed=False)
            self.pipe.react(alarms)

    def _sample(self, gpu_util) -> bool:
        """The node's StackSampler: 2 samples of every rank, judged; the event when they would be done."""
        if self.final is not None:
            return False
        t0 = time.time()
        self.sim.later(t0 + sum(SAMPLE_TIMES), self._samples_done, t0, dict(gpu_util or {}))
        return True

    def _dumps_now(self, since: float) -> dict[int, list[str]]:
        job = self.job
        out = {}
        for r in self.ranks:
            if job.stopped(r, since):
                out[r] = self.sim.stuck if r == job.odd else self.sim.waiting
            else:
                out[r] = self.sim.moving
        return out

    def _samples_done(self, t0: float, gpu_util: dict) -> None:
        from dataclasses import replace

        since = t0 - self.job.t0
        dumps = self._dumps_now(since)
        key = (tuple(sorted((r, id(d)) for r, d in dumps.items())), tuple(sorted(gpu_util.items())))
        v = self._stacks_cache.get(key)
        if v is None:
            v = self._stacks_cache[key] = verdict(dumps, source_line, gpu_util=gpu_util)
        fields = replace(v, t=t0, node=self.name).to_event_fields()
        fields["error"] = ""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(t0))
        self.event(StacksEvent(t0, ranks=tuple(self.ranks), samples=2, span=round(sum(SAMPLE_TIMES), 3),
                               dir=f"{self.run_dir}/stacks/{stamp}-samples", native=True, pause=0.4,
                               given_up=(), **fields))

    def warm(self, since: float, gpu_util: dict) -> None:
        """Judge this node's samples of ``since`` now (a real node does it on its own CPU, not the viewer's)."""
        dumps = self._dumps_now(since)
        key = (tuple(sorted((r, id(d)) for r, d in dumps.items())), tuple(sorted(gpu_util.items())))
        if key not in self._stacks_cache:
            self._stacks_cache[key] = verdict(dumps, source_line, gpu_util=gpu_util)

    def _on_stall(self, alarm) -> None:
        self.capture()

    def capture(self, why: str = "") -> None:
        """The supervisor's StackCapture: a note when it starts (asked for), the dumps' summary after."""
        if self.capture_busy or self.final is not None:
            return
        self.capture_busy = True
        now = time.time()
        if why:
            self.event(NoteEvent(now, "info", f"capturing every rank's Python stack ({why})"), feed=False)

        def done() -> None:
            self.capture_busy = False
            if self.final is not None:
                return
            dumps = self._dumps_now(time.time() - self.job.t0)
            groups: dict[str, list[int]] = {}
            for r, d in dumps.items():
                groups.setdefault(normalise(d[0]), []).append(r)
            gs = sorted((StackGroup(tuple(rs), s, "", "") for s, rs in groups.items()), key=lambda g: (-len(g.ranks), g.ranks))
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.event(NoteEvent(time.time(), "info", f"stacks captured in {self.run_dir}/stacks/{stamp}: "
                                                      f"{summarise(gs)}"), feed=False)

        self.sim.later(now + CAPTURE_TOOK, done)

    # -- the agent (what it would send for this journal) --------------------------------------------

    def poll(self, now: float) -> str | None:
        """One poll of the node's agent: the batch it would write, or None (nothing new, no heartbeat due)."""
        if not self.dirty and now - self.last_sent < HEARTBEAT:
            return None
        batches = self.link.batches if self.link is not None else True
        parts = self.p_events
        self.p_events = []
        base = self.ranks[0]
        for (source, lr), (n, t, phase) in self.p_beats.items():
            # (= ProgressEvent(t, rank, step=n, source, phase=phase).to_json(), checked in check_json)
            parts.append(f'{{"t":{t!r},"kind":"progress","rank":{base + lr},"step":{n},"source":"{source}",'
                         f'"node":"","phase":"{phase}"}}')
        self.p_beats = {}
        t = repr(now)
        for lr in sorted(self.p_lines):
            offs, texts = self.p_lines[lr]
            if batches:  # (= LogBatch.fast(now, rank, "stdout", 0, path, offs, texts).to_json(): check_json)
                parts.append(f'{{"t":{t},"kind":"logs","rank":{base + lr},"stream":"stdout","attempt":0,'
                             f'"path":{self._paths_js[lr]},"node":"","offsets":[{",".join(map(str, offs))}],'
                             f'"texts":[{",".join(map(_enc, texts))}],"partial":[],"transient":false}}')
            else:
                parts.append(LogBatch.fast(now, base + lr, "stdout", 0, self.paths[lr][1], offs, texts).json_lines())
        self.p_lines = {}
        self.dirty = False
        self.last_sent = now
        # (= wire.dumps({"kind": "cursor", "files": the session's cursor, "t": when sent}): check_json)
        cursor = ('{"kind":"cursor","files":{"events.jsonl":' + str(self.ev_off) + ',"torchrun.log":0,'
                  + self._cursor_keys.format(*self.off)[:-1] + '},"t":' + repr(now) + "}")
        return "".join(p + "\n" for p in parts) + cursor + "\n"

    def hello(self) -> str:
        h = wire.hello(host=self.name, ddptop=__version__, pid=30000 + self.index, t=time.time(),
                       versions=self.sim.versions)
        return wire.dumps({**h, "t": time.time(), "run": self.run_id, "run_dir": self.run_dir,
                           "location": self.run_dir, "meta": self.meta.to_dict()}) + "\n"

    def bye(self) -> str:
        st = ExitStatus.of_final(self.final)
        return wire.dumps({"kind": "bye", "exit_code": st.code, "attach_exit_code": st.exit_with,
                           "exit": st.to_dict()}) + "\n"


def check_json(node: Node) -> None:
    """What ``Node.poll`` writes by hand is what the event classes and ``wire`` write for the same data (else the
    simulator would not speak the agent's protocol byte for byte): a poll with lines (quotes, tabs, non-ASCII),
    beats and telemetry, each object read back and written again by the real code."""
    from ddptop.core.model.events import from_dict

    node.line(node.ranks[0], 'step 1 "quoted" back\\slash\ttab é ✓ \x01')
    node.line(node.ranks[-1], "plain")
    node.beat("hook", node.ranks[1], 7, 1795000000.123456)
    node.beat("batch", node.ranks[1], 9, 1795000000.5, "train")
    node.telemetry(1795000001.25)
    for raw in node.poll(1795000002.0).splitlines():
        d = json.loads(raw)
        again = wire.dumps(d) if d["kind"] == "cursor" else from_dict(d).to_json()
        if again != raw:
            raise AssertionError(f"scale_sim writes {raw!r}, the real code {again!r}")


class Link:
    """One connection: the viewer's pipes, passed by the srun stand-in, and the stand-in's socket."""

    def __init__(self, node: Node, sock: socket.socket, fd_in: int, fd_out: int, pid: int):
        self.node, self.sock, self.fd_in, self.fd_out, self.pid = node, sock, fd_in, fd_out, pid
        os.set_blocking(fd_in, False)
        os.set_blocking(fd_out, False)
        self.out = bytearray()
        self.inbuf = b""
        self.batches = False
        self.closed = False
        self.sent = 0
        self.polls = 0
        self.byed = False
        self.frozen = False  # (--freeze: this link stays open but carries nothing, as a network that hangs)


class Sim:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.t0 = a.t0 or time.time() + 1.0
        self.job = Job(a, self.t0)
        self.versions = software_versions()
        self.moving = _dumps("ddp_healthy.r0")
        self.waiting = _dumps("cuda_spin_sync.r0")
        self.stuck = _dumps("cuda_spin_sync.r1")
        self.sel = selectors.DefaultSelector()
        self.dirty: set = set()  # nodes with something their agent has not polled
        self._beat_scan = 0.0
        self.timers: list = []
        self._seq = 0
        runs = Path(a.runs) if a.runs else None
        self.shadow: Node | None = None
        self.shadow_node: Node | None = None
        self.nodes: list[Node] = []
        for i in range(a.nodes):
            name = f"node-{i}"
            real = runs / name if runs is not None and name == a.real_node else None
            self.nodes.append(Node(self, i, self.job, real))
        self.by_name = {n.name: n for n in self.nodes}
        real = self.by_name.get(a.real_node) if a.real_node else None
        if real is not None and real.real:
            # the model of the real node, never sent: what this simulator would have sent for it
            self.shadow = real
            self.shadow_node = Node(self, real.index, self.job, None, model_only=True)
        check_json(Node(self, 0, self.job, None, model_only=True))
        self.stats = {"links": 0, "reconnects": 0, "commands": {}, "sent_bytes": 0, "sent_batches": 0,
                      "dropped_links": 0, "max_buffer": 0, "shadow_bytes": 0, "shadow_batches": 0,
                      "resumed": 0}
        self.status: dict = {"t0": self.t0, "odd": self.job.odd, "odd_node": self.nodes[self.job.odd // a.ranks_per_node].name,
                             "nodes": a.nodes, "ranks": self.job.world, "mode": a.mode}
        self.stop_requested = False
        self.stacks_requested = False
        self.done = False

    # -- timers ---------------------------------------------------------------------------------

    def later(self, t: float, fn, *args) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (t, self._seq, fn, args))

    def _every(self, t: float, period: float, fn, *args, count: int = 0) -> None:
        def run(i: int) -> None:
            if self.job.ended:
                return
            fn(*args, i)
            self.later(t + (i + 1) * period, run, i + 1)
        self.later(t + count * period, run, count)

    def plan(self) -> None:
        job = self.job
        per_s = int(round(job.rate))
        for n in self.nodes:
            n.start()
            # (line ticks at the node's phase; m counts from 0 at t0)
            self._every(job.t0 + n.phase, 1.0 / per_s, lambda i, n=n: n.tick_lines(i, per_s), count=1)
            if job.r0_factor > 1 and 0 in n.ranks:
                f = per_s * job.r0_factor
                self._every(job.t0 + n.phase, 1.0 / f, lambda i, n=n, f=f: n.tick_rank0(i, f), count=1)
            self._every(job.t0 + n.tel_phase, 1.0, lambda i, n=n: n.telemetry(time.time()), count=0)
        if job.burst:
            b = 0
            while job.burst_first + b * job.burst_every < job.end_at:
                self.later(job.t0 + job.burst_first + b * job.burst_every,
                           lambda b=b: [n.burst(b) for n in self.nodes])
                b += 1
        self._every(time.time(), ANALYSIS_EVERY, lambda i: self._analyse(), count=0)
        self.later(job.t0 + job.stop_at, self._odd_stopped)
        for what, spec in (("drop", self.a.drop), ("freeze", self.a.freeze)):
            if spec:
                name, _, at = spec.partition("@")
                self.later(job.t0 + float(at), self._fault, what, name)
        self.later(job.t0 + job.end_at, self.end_job, "stopped", 143,
                   "stopped on request (SIGTERM to ddptop's supervisor)", "ddptop-stop")

    def warm(self) -> None:
        """The nodes' verdicts of the stall's samples, judged before the job starts (a real node judges its
        own, on its own CPU)."""
        job = self.job
        since = job.last_step + 2
        for n in self.nodes:
            util = {r: (0.0 if r == job.odd else 100.0) for r in n.ranks}
            n.warm(since, util)

    def _analyse(self) -> None:
        now = time.time()
        for n in self.nodes:
            if n.final is None:
                n.analyse(now)

    def _fault(self, what: str, name: str) -> None:
        """--drop: the node's link is cut (its srun killed, no bye); --freeze: it stays open, silent."""
        node = self.by_name.get(name)
        link = node.link if node is not None else None
        self.status.setdefault("faults", []).append({"what": what, "node": name, "t": time.time(),
                                                      "linked": link is not None})
        self._write_status()
        if link is None:
            return
        if what == "drop":
            self.close(link)
        else:
            link.frozen = True

    def _odd_stopped(self) -> None:
        job = self.job
        odd = self.nodes[job.odd // job.rpn]
        last = job.t0 + job.last_step + odd.phase
        self.status["stopped"] = {"t": time.time(), "last_step_t": last, "due": last + 1.0, "step": job.last_step,
                                  "node": odd.name, "rank": job.odd}
        self._write_status()

    def end_job(self, state: str, code: int, message: str, ended_by: str) -> None:
        if self.job.ended:
            return
        self.job.ended = True
        now = time.time()
        for n in self.nodes:
            n.end(now, state, code, message, ended_by)
        if self.shadow_node is not None:
            self.shadow_node.end(now, state, code, message, ended_by)
        self.status["ended"] = now
        self.later(now + 30.0, self._finish)  # the links have 30 s to take their byes

    def _finish(self) -> None:
        self.done = True

    # -- links ----------------------------------------------------------------------------------

    def accept(self, srv: socket.socket) -> None:
        conn, _ = srv.accept()
        fds: list[int] = []
        try:
            conn.settimeout(5)
            msg, fds, _flags, _addr = socket.recv_fds(conn, 65536, 2)
            while not msg.endswith(b"\n"):  # (the header is one line; a stream may hand it over in pieces)
                more = conn.recv(65536)
                if not more:
                    raise ValueError("the header ended early")
                msg += more
            conn.setblocking(False)
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid = struct.unpack("3i", creds)[0]
            hdr = json.loads(msg.decode())
        except (OSError, ValueError) as e:
            sys.stderr.write(f"scale_sim: a link could not be taken: {e}\n")
            self.stats["refused_links"] = self.stats.get("refused_links", 0) + 1
            for fd in fds:
                os.close(fd)  # (else the viewer's pipe stays open here: a link that says nothing, not one that ends)
            conn.close()
            return
        node = self.by_name.get(hdr.get("node", ""))
        if node is None or len(fds) != 2 or node.real:
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        argv = hdr.get("argv", [])
        if "--resume" in argv:
            self.stats["resumed"] += 1
        if node.link is not None:
            self.stats["reconnects"] += 1
            self.close(node.link)
        link = Link(node, conn, fds[0], fds[1], pid)
        node.link = link
        self.stats["links"] += 1
        self.sel.register(conn, selectors.EVENT_READ, ("sock", link))
        self.sel.register(link.fd_in, selectors.EVENT_READ, ("in", link))
        self.write(link, node.hello())
        node.last_sent = 0.0  # the first poll comes at once (the backlog, or a cursor)
        self.dirty.add(node)

    def close(self, link: Link) -> None:
        if link.closed:
            return
        link.closed = True
        for obj in (link.sock, link.fd_in, link.fd_out):
            try:
                self.sel.unregister(obj)
            except (KeyError, ValueError):
                pass
        for fd in (link.fd_in, link.fd_out):
            try:
                os.close(fd)
            except OSError:
                pass
        link.sock.close()
        try:
            os.kill(link.pid, signal.SIGTERM)  # the relay (an idle sleep): its viewer sees the link end
        except ProcessLookupError:
            pass
        if link.node.link is link:
            link.node.link = None

    def write(self, link: Link, data: str) -> None:
        if link.closed:
            return
        b = data.encode()
        self.stats["sent_bytes"] += len(b)
        link.sent += len(b)
        if link.out:
            link.out += b
        else:
            try:
                n = os.write(link.fd_out, b)
            except BlockingIOError:
                n = 0
            except OSError:
                self.stats["dropped_links"] += 1
                self.close(link)
                return
            if n < len(b):
                link.out += b[n:]
                self.sel.register(link.fd_out, selectors.EVENT_WRITE, ("out", link))
        self.stats["max_buffer"] = max(self.stats["max_buffer"], len(link.out))

    def flush(self, link: Link) -> None:
        try:
            n = os.write(link.fd_out, link.out)
        except BlockingIOError:
            return
        except OSError:
            self.stats["dropped_links"] += 1
            self.close(link)
            return
        del link.out[:n]
        if not link.out:
            self.sel.unregister(link.fd_out)
            if link.byed:
                self.close(link)

    def commands(self, link: Link) -> None:
        try:
            chunk = os.read(link.fd_in, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.close(link)  # the viewer closed its end
            return
        link.inbuf += chunk
        *lines, link.inbuf = link.inbuf.split(b"\n")
        for raw in lines:
            if not raw.strip():
                continue
            try:
                c = json.loads(raw)
                name = c.get("cmd")
            except (ValueError, AttributeError):
                self.write(link, wire.dumps(wire.reply(None, False, f"unreadable command {raw[:200]!r}")) + "\n")
                continue
            self.stats["commands"][name] = self.stats["commands"].get(name, 0) + 1
            node = link.node
            if name == "accept" and "logs" in (c.get("kinds") or []):
                link.batches = True
                self.write(link, wire.dumps(wire.reply("accept", True, "log lines come in logs batches from now on")) + "\n")
            elif name == "stacks":
                if node.final is not None:
                    msg = wire.reply(name, False, "the job is not running (it is stopped)")
                else:
                    msg = wire.reply(name, True, "capturing every rank's Python stack")
                    self.later(time.time() + WATCHER_NAP, node.capture, "asked for")
                self.write(link, wire.dumps(msg) + "\n")
            elif name == "stop":
                self.write(link, wire.dumps(wire.reply(name, True, "stopping the job")) + "\n")
                self.later(time.time() + 0.5, self.end_job, "stopped", 143,
                           "stopped on request (SIGTERM to ddptop's supervisor)", "ddptop-stop")
            elif name == "relaunch":
                self.write(link, wire.dumps(wire.reply(name, False, "relaunch: not simulated")) + "\n")
            else:
                self.write(link, wire.dumps(wire.reply(name, False, f"unknown command {name!r}")) + "\n")

    def polls(self, now: float) -> None:
        if now - self._beat_scan >= 0.25:  # (heartbeats: a cursor every 2 s from a node with nothing new)
            self._beat_scan = now
            self.dirty.update(n for n in self.nodes if n.link is not None and now - n.last_sent >= HEARTBEAT)
        for n in list(self.dirty):
            link = n.link
            if link is None or link.closed or link.byed or link.frozen:
                continue  # (it stays dirty: its next link gets it)
            if now - n.last_sent < MIN_GAP:
                continue
            self.dirty.discard(n)
            data = n.poll(now)
            if data is None:
                continue
            link.polls += 1
            self.stats["sent_batches"] += 1
            self.write(link, data)
            if n.final is not None and not link.closed:
                self.write(link, n.bye())
                link.byed = True
                if not link.out:
                    self.close(link)
        sh = self.shadow_node
        if sh is not None and now - sh.last_sent >= MIN_GAP:
            data = sh.poll(now)
            if data is not None:
                self.stats["shadow_bytes"] += len(data.encode())
                self.stats["shadow_batches"] += 1

    def _write_status(self) -> None:
        if not self.a.status:
            return
        tmp = self.a.status + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.status, f)
        os.replace(tmp, self.a.status)

    def run(self) -> int:
        a = self.a
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # (3 a link: as many nodes as the viewer has)
        if soft != resource.RLIM_INFINITY and soft < 4 * a.nodes + 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard == resource.RLIM_INFINITY
                                                        else min(hard, 4 * a.nodes + 64), hard))
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(a.sock)
        srv.listen(1024)
        srv.setblocking(False)
        self.sel.register(srv, selectors.EVENT_READ, ("srv", None))

        def on_term(signum, frame):
            self.stop_requested = True

        def on_usr2(signum, frame):
            self.stacks_requested = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGUSR2, on_usr2)
        c0 = time.process_time()
        self.warm()
        self.status["warm_cpu_s"] = time.process_time() - c0
        self.plan()
        self.status["ready"] = time.time()
        self._write_status()
        cpu0 = os.times()
        while not self.done:
            now = time.time()
            if self.stop_requested:
                self.stop_requested = False
                if self.job.ended:
                    break  # (a second one: at once)
                self.end_job("stopped", 143, "stopped on request (SIGTERM to ddptop's supervisor)", "ddptop-stop")
            if self.stacks_requested:
                self.stacks_requested = False
                real = self.by_name.get(a.real_node)
                if real is not None:
                    self.later(now + WATCHER_NAP, real.capture, "asked for")
            while self.timers and self.timers[0][0] <= now:
                _, _, fn, args = heapq.heappop(self.timers)
                fn(*args)
            self.polls(time.time())
            if self.job.ended and all(n.link is None for n in self.nodes if not n.real) and \
                    time.time() > self.status["ended"] + 1.0:
                break
            wait = (self.timers[0][0] - time.time()) if self.timers else 0.05
            for key, _ in self.sel.select(max(0.0, min(wait, 0.05))):
                what, link = key.data
                if what == "srv":
                    self.accept(srv)
                elif what == "in":
                    self.commands(link)
                elif what == "out":
                    self.flush(link)
                elif what == "sock":
                    try:
                        data = link.sock.recv(4096)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        self.close(link)  # the viewer killed its srun (it closed the link)
        cpu1 = os.times()
        for n in self.nodes:
            if n.link is not None:
                self.close(n.link)
        srv.close()
        self.status["end"] = {**self.stats, "cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
                              "wall_s": time.time() - self.status["ready"]}
        self._write_status()
        return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sock", required=True)
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--mode", choices=("issue", "flat20"), default="issue")
    p.add_argument("--burst", type=int, default=200, help="lines each rank prints in a burst (issue mode)")
    p.add_argument("--odd", type=int, default=777)
    p.add_argument("--stop-at", type=float, default=40.5)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--t0", type=float, default=0.0)
    p.add_argument("--real-node", default="")
    p.add_argument("--runs", default="")
    p.add_argument("--status", default="")
    p.add_argument("--drop", default="", metavar="NODE@S", help="cut NODE's link S seconds in (no bye)")
    p.add_argument("--freeze", default="", metavar="NODE@S", help="NODE's link goes silent S seconds in")
    a = p.parse_args(argv)
    return Sim(a).run()


if __name__ == "__main__":
    sys.exit(main())
