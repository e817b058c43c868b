"""``bench.py scale``: one ``ddptop attach`` following a simulated 1,024-rank job (issue 35).

    python tests/bench/bench.py scale [--nodes 128] [--ranks-per-node 8] [--seconds 60]
                                      [--mode issue|flat20|both] [--view headless|tui|both]
    python tests/bench/bench.py scale --nodes 1,8,32,128        # the growth: a table at the end

How: a SLURM job of N nodes (the fake cluster of the tests: ``squeue`` and
``scontrol`` from tests/support/cluster/bin, ``srun`` from tests/bench/scale_bin)
is attached to with ``ddptop --json attach --slurm 4242`` (``--view headless``)
or with the TUI in Textual's headless driver (``--view tui``, scale_view.py).
ddptop runs ``srun ... ddptop agent`` per node as it would on a cluster; the
bench's ``srun`` hands node-0's to the REAL ``ddptop agent`` (reading a journal
that scale_sim.py writes to disk as node-0's supervisor and ranks would) and
every other node's to ONE simulator process (scale_sim.py) that speaks the
agent's protocol on the viewer's own pipes.  The load and the hang: see
scale_sim.py.  Every process is started in its own session, with a timeout,
and ended by process group or pid at the end; what is left is said.

Printed, one figure a line, each with the 1-minute load average and the
simulator's CPU (% of one core) over the window it was measured in: the time
to attach every node, the viewer's lag (``--view headless``: a line's
latency from its node's agent to ddptop's stdout; ``tui``: the event loop's
lateness, and a line's delivery to the view), its RSS, CPU, threads, file
descriptors, bytes/s read, the real agent's CPU and its stream against the
simulator's model of the same node, the relays' CPU, the stall alarm's latency
after the odd rank's missed step, whether it named the rank and its node, and
how many stall alarms there were.  Targets (issue 35): lag p95 <= 100 ms,
viewer memory <= 1 GB, agent CPU <= 1 % of a core, alarm <= 10 s with culprit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCALE_BIN = HERE / "scale_bin"
SUPPORT = ROOT / "tests" / "support"
JOB = "4242"
MB = 1 << 20


def _q(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


class Proc:
    """A process this bench watches: CPU, RSS, threads, fds and bytes read over time."""

    def __init__(self, pid: int, per_thread: bool = False):
        self.p = psutil.Process(pid)
        self.samples: list[tuple] = []  # (t, cpu_s, rss, threads, fds, read_chars, write_chars, sys, ctx, writes)
        self.hwm = 0
        self.per_thread = per_thread
        self.threads: list[tuple[float, dict[int, tuple[str, float]]]] = []  # (t, {tid: (name, cpu_s)})

    def sample(self) -> None:
        try:
            with self.p.oneshot():
                c = self.p.cpu_times()
                io = self.p.io_counters()
                cs = self.p.num_ctx_switches()
                self.samples.append((time.time(), c.user + c.system, self.p.memory_info().rss, self.p.num_threads(),
                                     self.p.num_fds(), io.read_chars, io.write_chars, c.system,
                                     cs.voluntary + cs.involuntary, io.write_count))
            if self.per_thread:
                names = {}
                for th in self.p.threads():
                    try:
                        names[th.id] = (Path(f"/proc/{self.p.pid}/task/{th.id}/comm").read_text().strip(),
                                        th.user_time + th.system_time)
                    except OSError:
                        pass
                self.threads.append((time.time(), names))
            for line in Path(f"/proc/{self.p.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.hwm = max(self.hwm, int(line.split()[1]) * 1024)
        except (psutil.Error, OSError):
            pass

    def thread_cpu(self, a: float, b: float) -> dict[str, float]:
        """Each thread's CPU (% of one core) in [a, b], by name."""
        s = [x for x in self.threads if a <= x[0] <= b]
        if len(s) < 2:
            return {}
        dt = s[-1][0] - s[0][0]
        out: dict[str, float] = {}
        for tid, (name, cpu) in s[-1][1].items():
            before = s[0][1].get(tid, (name, 0.0))[1]
            out[name] = out.get(name, 0.0) + 100 * (cpu - before) / dt
        return out

    def window(self, a: float, b: float) -> dict | None:
        """CPU (% of one core), read and write rates (bytes/s), peaks of threads, fds and RSS, in [a, b]."""
        s = [x for x in self.samples if a <= x[0] <= b]
        if len(s) < 2:
            return None
        dt = s[-1][0] - s[0][0]
        return {"cpu": 100 * (s[-1][1] - s[0][1]) / dt, "read": (s[-1][5] - s[0][5]) / dt,
                "write": (s[-1][6] - s[0][6]) / dt, "sys": 100 * (s[-1][7] - s[0][7]) / dt,
                "ctx": (s[-1][8] - s[0][8]) / dt, "writes": (s[-1][9] - s[0][9]) / dt,
                "threads": max(x[3] for x in s), "fds": max(x[4] for x in s), "rss": max(x[2] for x in s), "s": dt}


class Headless:
    """ddptop --json attach's stdout, read as it comes: a line's latency (1 in 50), links up, stall alarms."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lat: list[tuple[float, float]] = []
        self.ups: dict[str, float] = {}
        self.links: list[tuple[float, str, str]] = []  # (when, node, state) of every link event
        self.alarms: list[dict] = []
        self.notes = 0
        self.note_list: list[dict] = []  # every note: its level, node and message
        self.lines = 0
        self.bytes = 0
        self.thread = threading.Thread(target=self._read, daemon=True, name="scale-reader")
        self.thread.start()

    def _read(self) -> None:
        fd = self.proc.stdout.fileno()
        buf = b""
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except OSError:
                break
            if not chunk:
                break
            now = time.time()
            self.bytes += len(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                if raw.startswith(b'{"t":') and raw.find(b'"kind":"log"', 0, 60) > 0:
                    self.lines += 1
                    if self.lines % 50 == 0:
                        self.lat.append((now, now - float(raw[5:raw.index(b",")])))
                elif b'"kind":"alarm"' in raw[:60]:
                    d = json.loads(raw)
                    if d.get("type") == "stall":
                        self.alarms.append({"t": now, "culprits": d.get("culprits", []), "node": d.get("node", ""),
                                            "where_nodes": {k: v.get("node", "") for k, v in
                                                            (d.get("where") or {}).items()},
                                            "id": d.get("id"), "message": d.get("message", "")[:600]})
                elif b'"kind":"link"' in raw[:60]:
                    d = json.loads(raw)
                    self.links.append((now, d.get("node", ""), d.get("state", ""), d.get("message", "")))
                    if d.get("state") == "up":
                        self.ups.setdefault(d.get("node", ""), now)
                elif b'"kind":"note"' in raw[:60]:
                    self.notes += 1
                    d = json.loads(raw)
                    self.note_list.append({"level": d.get("level", ""), "node": d.get("node", ""),
                                           "message": d.get("message", "")})


def _load() -> float:
    return os.getloadavg()[0]


def _nofile(limit: str):
    """A preexec_fn that sets the viewer's limit on open files ("SOFT" or "SOFT:HARD"), or None."""
    if not limit:
        return None
    import resource

    soft, _, hard = limit.partition(":")

    def set_it() -> None:
        h = int(hard) if hard else resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(soft), h))
    return set_it


def run_one(nodes: int, rpn: int, mode: str, view: str, seconds: float, stop_at: float, burst: int,
            real_node: str, keep: bool = False, quiet: bool = False, viewer_nofile: str = "", drop: str = "",
            freeze: str = "") -> dict:
    """One attach, measured; its figures (and printed, unless quiet)."""
    sys.path[:0] = [str(SUPPORT)]
    from fake_cluster import FakeCluster

    world = nodes * rpn
    odd_node = nodes * 97 // 128
    odd = odd_node * rpn + min(1, rpn - 1)
    tmp = Path(tempfile.mkdtemp(prefix="scale_bench_"))
    cluster = FakeCluster(tmp / "cluster")
    cluster.slurm_job(JOB, {f"node-{i}": tmp / "runs" / f"node-{i}" for i in range(nodes)})
    sock = str(tmp / "sim.sock")
    status_f = tmp / "sim-status.json"
    env = cluster.env()
    env.update(PATH=f"{SCALE_BIN}:{env['PATH']}", DDPTOP_SCALE_SIM=sock, DDPTOP_SCALE_REAL=real_node,
               DDPTOP_SCALE_LINK_S=str(int(seconds + 600)))
    env.pop("DDPTOP_RUNS_DIR", None)
    started: list[psutil.Process] = []  # every process of this run, for the end
    out: dict = {"nodes": nodes, "rpn": rpn, "ranks": world, "mode": mode, "view": view, "odd": odd,
                 "odd_node": f"node-{odd_node}", "load_start": _load()}
    t0 = time.time() + 2.0 + nodes * 0.01
    end_at = t0 + seconds
    sim_err = open(tmp / "sim.err", "w")
    sim = subprocess.Popen([sys.executable, str(HERE / "scale_sim.py"), "--sock", sock, "--nodes", str(nodes),
                            "--ranks-per-node", str(rpn), "--mode", mode, "--burst", str(burst), "--odd", str(odd),
                            "--stop-at", str(stop_at), "--seconds", str(seconds), "--t0", repr(t0),
                            "--real-node", real_node, "--runs", str(tmp / "runs"), "--status", str(status_f),
                            "--drop", drop, "--freeze", freeze],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=sim_err, start_new_session=True, env=env)
    started.append(psutil.Process(sim.pid))
    viewer = None
    reader = None
    status: dict = {}
    view_err = open(tmp / "view.err", "w")
    try:
        deadline = time.time() + 60
        while not (status_f.exists() and "ready" in json.loads(status_f.read_text() or "{}")):
            if sim.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the simulator did not start: {(tmp / 'sim.err').read_text()[-2000:]}")
            time.sleep(0.05)
        remote = f"{sys.executable} -m ddptop"
        t_view = time.time()
        if view == "headless":
            viewer = subprocess.Popen([sys.executable, "-m", "ddptop", "--json", "attach", "--slurm", JOB,
                                       "--remote-ddptop", remote], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=view_err, start_new_session=True, preexec_fn=_nofile(viewer_nofile))
            reader = Headless(viewer)
        else:
            viewer = subprocess.Popen([sys.executable, str(HERE / "scale_view.py"), "--slurm", JOB, "--remote", remote,
                                       "--until", repr(end_at + 5), "--out", str(tmp / "view.json"),
                                       *(["--in-process"] if view == "tui-in-process" else [])], cwd=ROOT,
                                      env=env, stdout=subprocess.DEVNULL, stderr=view_err, start_new_session=True,
                                      preexec_fn=_nofile(viewer_nofile))
        started.append(psutil.Process(viewer.pid))
        vp, sp = Proc(viewer.pid), Proc(sim.pid)
        agent: Proc | None = None
        reading: Proc | None = None  # the TUI's reading process (ddptop.core.sessions.hosted): part of the viewer
        relays: dict[int, psutil.Process] = {}
        relay_seen: dict[int, float] = {}
        loads: list[tuple[float, float]] = []
        shown: list[tuple[float, int]] = []  # (when, log lines the headless viewer had printed)
        hard_end = end_at + 60
        while viewer.poll() is None and time.time() < hard_end:
            vp.sample()
            sp.sample()
            loads.append((time.time(), _load()))
            if reader is not None:
                shown.append((time.time(), reader.lines))
            try:
                for c in vp.p.children(recursive=True):
                    if reading is None and c.pid not in relays:
                        try:
                            if "ddptop.core.sessions.hosted" in c.cmdline():
                                reading = Proc(c.pid)
                                started.append(c)
                                continue
                        except psutil.Error:
                            pass
                    if c.pid not in relays and (reading is None or c.pid != reading.p.pid):
                        relays[c.pid] = c
                        started.append(c)
                        try:
                            if agent is None and "agent" in c.cmdline():
                                agent = Proc(c.pid, per_thread=True)
                        except psutil.Error:
                            pass
            except psutil.Error:
                pass
            if agent is not None:
                agent.sample()
            if reading is not None:
                reading.sample()
            for pid, c in relays.items():  # (their CPU, read while they live: the python start before the sleep)
                if agent is None or pid != agent.p.pid:
                    try:
                        ct = c.cpu_times()
                        relay_seen[pid] = ct.user + ct.system
                    except psutil.Error:
                        pass
            time.sleep(max(0.1, 1.0 - (time.time() - loads[-1][0])))
        out["viewer_exit"] = viewer.poll()
        if viewer.poll() is None:
            out["viewer_exit"] = "killed (did not end by itself)"
        status = json.loads(status_f.read_text()) if status_f.exists() else {}
        out["relay_cpu_s"] = sum(relay_seen.values())
        out["relays"] = len(relays) - (1 if agent is not None else 0)
    except BaseException:  # (interrupted, or killed by SIGTERM: what it started ends, and its files go)
        _end(started, viewer, sim, tmp)
        sim_err.close()
        view_err.close()
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    out["leftover"] = _end(started, viewer, sim, tmp)
    sim_err.close()
    view_err.close()
    status = json.loads(status_f.read_text()) if status_f.exists() else status
    out["sim_end"] = status.get("end", {})
    if view.startswith("tui"):
        try:
            seen = json.loads((tmp / "view.json").read_text())
        except (OSError, ValueError):
            seen = {"error": "no result from scale_view.py: " + (tmp / "view.err").read_text()[-1500:]}
        ups, alarms, lat = seen.get("ups", {}), seen.get("alarms", []), seen.get("lat", [])
        links = seen.get("links", [])
        out["lags"] = seen.get("lags", [])
        out["view_error"] = seen.get("error")
        out["first_frame"] = seen.get("first_frame")
        out["notes"] = seen.get("notes")
    else:
        ups, alarms, lat = reader.ups, reader.alarms, reader.lat
        links = reader.links
        out["notes"] = reader.notes
        out["note_list"] = reader.note_list
        out["stdout_bytes"] = reader.bytes
    out["view_err"] = (tmp / "view.err").read_text()[-3000:] if (tmp / "view.err").exists() else ""
    out["sim_err"] = (tmp / "sim.err").read_text()[-1500:] if (tmp / "sim.err").exists() else ""
    if not keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        out["tmp"] = str(tmp)
    # -- the figures --------------------------------------------------------------------------------
    out["ups"] = len(ups)
    all_up = max(ups.values()) if len(ups) == nodes else None
    out["attach_s"] = (all_up - t_view) if all_up else None
    stopped = status.get("stopped", {})
    steady = (t0 + 5.0, t0 + stop_at)  # (the job's own time: a viewer that lags is measured, not waited for)
    burst_w = (t0 + 20.0 - 1.0, t0 + 20.0 + 10.0) if mode == "issue" and burst else (0.0, 0.0)

    def in_steady(t: float) -> bool:
        return steady[0] <= t <= steady[1] and not (burst_w[0] <= t <= burst_w[1])

    def loads_in(a: float, b: float) -> str:
        ls = [x for t, x in loads if a <= t <= b] or [x for _, x in loads[-1:]]
        return f"{statistics.mean(ls):.2f}" if ls else "?"

    def win(p: Proc | None, a: float, b: float) -> dict | None:
        if p is None:
            return None
        parts = [w for w in (p.window(a, min(b, burst_w[0])) if burst_w[0] > a else None,
                             p.window(max(a, burst_w[1]), b)) if w]
        if not parts:
            return p.window(a, b)
        s = sum(w["s"] for w in parts)
        return {k: (sum(w[k] * w["s"] for w in parts) / s if k in ("cpu", "read", "write", "sys", "ctx", "writes") else
                    max(w[k] for w in parts)) for k in parts[0] if k != "s"} | {"s": s}

    out["steady"] = steady
    out["t0"] = t0
    out["lines_in"] = world * (5 if mode == "issue" else 20) + (45 if mode == "issue" else 0)
    out["load_steady"] = loads_in(*steady)
    sw = win(sp, *steady)
    out["sim_cpu_steady"] = sw["cpu"] if sw else None
    vw = win(vp, *steady)
    out["viewer_steady"] = vw
    out["viewer_all"] = vp.window(t_view, hard_end)
    out["viewer_hwm"] = vp.hwm
    out["viewer_burst"] = vp.window(*burst_w) if burst_w[1] else None
    out["reading_steady"] = win(reading, *steady)
    out["reading_hwm"] = reading.hwm if reading else 0
    out["sim_cpu_burst"] = (sp.window(*burst_w) or {}).get("cpu") if burst_w[1] else None
    out["load_burst"] = loads_in(*burst_w) if burst_w[1] else None
    aw = win(agent, *steady)
    out["agent_steady"] = aw
    out["agent_threads"] = agent.thread_cpu(*steady) if agent else {}
    out["agent_all"] = agent.window(t_view, hard_end) if agent else None
    ls = [(t, n) for t, n in shown if steady[0] <= t <= steady[1]]
    out["lines_out"] = (ls[-1][1] - ls[0][1]) / (ls[-1][0] - ls[0][0]) if len(ls) > 1 else None
    lats = [x for t, x in lat if in_steady(t)]
    out["lat_n"] = len(lats)
    out["lat_p50"], out["lat_p95"] = _q(lats, 0.5) * 1000, _q(lats, 0.95) * 1000
    bl = [x for t, x in lat if burst_w[0] <= t <= burst_w[1]]
    out["lat_burst_max"] = max(bl) * 1000 if bl else None
    if view.startswith("tui"):
        lg = [x for t, x in out["lags"] if in_steady(t)]
        out["lag_p50"], out["lag_p95"] = _q(lg, 0.5), _q(lg, 0.95)
        out["lag_max"] = max(lg) if lg else None
        lb = [x for t, x in out["lags"] if burst_w[0] <= t <= burst_w[1]]
        out["lag_burst_max"] = max(lb) if lb else None
        after = [x for t, x in out["lags"] if t0 + stop_at <= t <= t0 + stop_at + 20]
        out["lag_hang_p95"] = _q(after, 0.95) if after else None
        out["lag_hang_max"] = max(after) if after else None
        out["lags"] = None
    else:
        after = [x for t, x in lat if t0 + stop_at <= t <= t0 + stop_at + 20]
        out["lat_hang_p95"] = _q(after, 0.95) * 1000 if after else None
    out["faults"] = []
    for f in status.get("faults", []):
        mine = [(t - f["t"], st) for t, n, st, _m in links if n == f["node"] and t >= f["t"] - 0.5]
        said = list(dict.fromkeys(m for t, n, st, m in links if n == f["node"] and t >= f["t"] - 0.5
                                  and st in ("down", "failed") and m))
        down = next((dt for dt, st in mine if st == "down"), None)
        up = next((dt for dt, st in mine if st == "up" and (down is None or dt >= down)), None)
        others = [x for t, x in lat if f["t"] <= t <= f["t"] + 25]
        out["faults"].append({**f, "down_after": down, "up_after": up, "states": [st for _, st in mine][:12], "said": said[:3],
                              "others_p95": _q(others, 0.95) * 1000 if others else None})
    out["stall_alarms"] = len(alarms)
    if alarms and stopped:
        a = alarms[0]
        out["alarm_latency"] = a["t"] - stopped["due"]
        out["alarm_culprit"] = odd in a["culprits"]
        out["alarm_node"] = a["node"] == f"node-{odd_node}" or a["where_nodes"].get(str(odd)) == f"node-{odd_node}"
        out["alarm_message"] = a["message"]
        out["alarm_sim_window"] = (sp.window(stopped["due"] - 1, a["t"] + 1) or {}).get("cpu")
        out["load_alarm"] = loads_in(stopped["due"] - 1, a["t"] + 1)
    out["load_end"] = _load()
    if not quiet:
        report(out)
    return out


def _end(started: list[psutil.Process], viewer, sim, tmp: Path) -> list[str]:
    """End what this run started (the viewer, its links, the simulator), by process group then pid; say what was left."""
    for p in (viewer, sim):
        if p is None:
            continue
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=10)
    time.sleep(0.5)
    left = []
    for p in started:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # (each link is its own process group)
                except (ProcessLookupError, PermissionError):
                    p.kill()
        except psutil.Error:
            pass
    return left


def _pct(x) -> str:
    return "?" if x is None else f"{x:.1f}%"


def report(o: dict) -> None:
    nodes, ranks = o["nodes"], o["ranks"]
    load = f"[load {o['load_steady']}, sim {_pct(o['sim_cpu_steady'])} of a core]"
    print(f"scale: {nodes} nodes x {o['rpn']} = {ranks:,} ranks, load {o['mode']}, view {o['view']}; rank {o['odd']} on "
          f"{o['odd_node']} stops; load average {o['load_start']:.2f} at the start, {o['load_end']:.2f} at the end")

    def line(fig: str, target: str = "", where: str = load) -> None:
        print(f"  {fig:<74} {('target ' + target) if target else '':<24} {where}")

    line(f"attach: {o['ups']}/{nodes} links up" + (f", the last shown {o['attach_s']:.1f} s after start" if o["attach_s"]
                                                     else ""),
         "", f"[load {o['load_start']:.2f}]")
    said = [ln for ln in o.get("view_err", "").splitlines() if ln.startswith("ddptop:") and "attaching to" not in ln]
    for ln in said[:3]:
        line(f"viewer said: {ln[:200]}")
    if o["view"].startswith("tui"):
        if o.get("view_error"):
            line(f"TUI failed: {o['view_error']}")
        line(f"first frame {o['first_frame']:.1f} s after start" if o.get("first_frame") else "first frame: none")
        line(f"event-loop lag p50 {o['lag_p50']:.0f} ms, p95 {o['lag_p95']:.0f} ms, max {o['lag_max'] or 0:.0f} ms "
             f"(steady)", "p95 <= 100 ms")
        if o.get("lag_burst_max") is not None:
            line(f"event-loop lag max {o['lag_burst_max']:.0f} ms in the burst", "",
                 f"[load {o['load_burst']}, sim {_pct(o['sim_cpu_burst'])} of a core]")
        if o.get("lag_hang_p95") is not None:
            line(f"event-loop lag p95 {o['lag_hang_p95']:.0f} ms, max {o['lag_hang_max']:.0f} ms in the 20 s after "
                 "the stop (stacks, alarms)")
        line(f"line delivery to the view p50 {o['lat_p50']:.0f} ms, p95 {o['lat_p95']:.0f} ms ({o['lat_n']} sampled)")
    else:
        line(f"line latency, agent -> stdout: p50 {o['lat_p50']:.0f} ms, p95 {o['lat_p95']:.0f} ms (steady, "
             f"{o['lat_n']} sampled)", "p95 <= 100 ms")
        if o.get("lines_out") is not None:
            line(f"lines printed {o['lines_out']:,.0f}/s from {o['steady'][0] - o['t0']:.0f} to "
                 f"{o['steady'][1] - o['t0']:.0f} s (the job writes {o['lines_in']:,.0f}/s, bursts aside)")
        if o.get("lat_burst_max") is not None:
            line(f"line latency max {o['lat_burst_max']:.0f} ms in the burst", "",
                 f"[load {o['load_burst']}, sim {_pct(o['sim_cpu_burst'])} of a core]")
        if o.get("lat_hang_p95") is not None:
            line(f"line latency p95 {o['lat_hang_p95']:.0f} ms in the 20 s after the stop")
    vw, va = o["viewer_steady"] or {}, o["viewer_all"] or {}
    line(f"viewer RSS {vw.get('rss', 0) / MB:.0f} MB steady, peak {o['viewer_hwm'] / MB:.0f} MB", "<= 1 GB")
    line(f"viewer CPU {_pct(vw.get('cpu'))} of a core steady ({_pct(vw.get('sys'))} in the kernel, "
         f"{vw.get('ctx', 0):,.0f} context switches/s), {_pct(va.get('cpu'))} over the run"
         + (f", {_pct((o['viewer_burst'] or {}).get('cpu'))} in the burst" if o.get("viewer_burst") else ""))
    rw = o.get("reading_steady")
    if rw:
        line(f"its reading process (links, analysis): CPU {_pct(rw.get('cpu'))} of a core steady, RSS "
             f"{rw.get('rss', 0) / MB:.0f} MB (peak {o['reading_hwm'] / MB:.0f} MB), threads {rw.get('threads', '?')}, "
             f"file descriptors {rw.get('fds', '?')}; the viewer in all: RSS "
             f"{(vw.get('rss', 0) + rw.get('rss', 0)) / MB:.0f} MB, CPU {_pct(vw.get('cpu', 0) + rw.get('cpu', 0))}",
             "<= 1 GB")
    line(f"viewer threads {va.get('threads', '?')}, file descriptors {va.get('fds', '?')} (peak)")
    line(f"viewer bytes read {vw.get('read', 0) / 1024:.0f} KiB/s steady"
         + (f"; simulator sent {o['sim_end'].get('sent_bytes', 0) / MB:.1f} MiB in "
            f"{o['sim_end'].get('sent_batches', 0):,} batches" if o.get("sim_end") else ""))
    aw = o["agent_steady"]
    if aw:
        sh = o["sim_end"]
        real_bytes = aw["write"]
        line(f"real agent (node-0, rank 0's node) CPU {aw['cpu']:.2f}% of a core, RSS {aw['rss'] / MB:.0f} MB, "
             f"sends {real_bytes / 1024:.1f} KiB/s", "<= 1% of a core")
        if o.get("agent_threads"):
            line("  by thread: " + ", ".join(f"{n} {c:.2f}%" for n, c in sorted(o["agent_threads"].items(),
                                                                            key=lambda x: -x[1])))
        if sh.get("shadow_bytes") and o["agent_all"]:
            aa = o["agent_all"]
            line(f"  its stream vs the simulator's model of node-0: {aa['write'] * aa['s'] / 1024:.0f} KiB in "
                 f"{aa['writes'] * aa['s']:.0f} writes real, {sh['shadow_bytes'] / 1024:.0f} KiB in "
                 f"{sh['shadow_batches']} batches modelled")
    else:
        line("real agent: not seen")
    se = o["sim_end"]
    line(f"links: {o['relays']} srun relays used {o['relay_cpu_s']:.1f} s CPU in all; reconnects "
         f"{se['links'] - (nodes - 1) if 'links' in se else '?'}; commands {se.get('commands', {})}")
    if "alarm_latency" in o:
        line(f"stall alarm {o['alarm_latency']:.1f} s after rank {o['odd']}'s missed step; culprit "
             f"{'named' if o['alarm_culprit'] else 'NOT named'}, node {'named' if o['alarm_node'] else 'NOT named'}",
             "<= 10 s, culprit", f"[load {o['load_alarm']}, sim {_pct(o['alarm_sim_window'])} of a core]")
    else:
        line("stall alarm: NONE", "<= 10 s, culprit")
    line(f"stall alarms: {o['stall_alarms']}; notes: {o.get('notes')}", "1 per hang")
    for f in o.get("faults", []):
        what = "link cut (no bye)" if f["what"] == "drop" else "link silent (open, nothing on it)"
        line(f"{f['node']}: {what}: down said after "
             + (f"{f['down_after']:.1f} s" if f["down_after"] is not None else "NEVER")
             + ", up again after " + (f"{f['up_after']:.1f} s" if f["up_after"] is not None else "NEVER")
             + f"; link events {'/'.join(f['states'])}"
             + (f"; other nodes' lines p95 {f['others_p95']:.0f} ms in the 25 s after" if f["others_p95"] else ""))
        for m in f.get("said", []):
            line(f"  {f['node']} said: {m[:160]}")
    for ln in [x for x in o.get("sim_err", "").splitlines() if x.strip()][-3:]:
        line(f"simulator said: {ln[:160]}")
    if o.get("leftover"):
        line(f"LEFT RUNNING at the end (killed now): {o['leftover']}")
    if o.get("viewer_exit") not in (0, 143, None) and o["view"] == "headless":
        line(f"viewer exit: {o['viewer_exit']}; its stderr: {o['view_err'][-500:]}")


def table(rows: list[dict]) -> None:
    print("\n| ranks (nodes x 8) | view | load | lag p50 / p95 (ms) | RSS MB (peak) | viewer CPU | threads | fds | "
          "KiB/s read | agent CPU | alarm after missed step | culprit + node | stall alarms | sim CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for o in rows:
        vw, va = o["viewer_steady"] or {}, o["viewer_all"] or {}
        lag = (f"{o['lag_p50']:.0f} / {o['lag_p95']:.0f}" if o["view"].startswith("tui")
               else f"{o['lat_p50']:.0f} / {o['lat_p95']:.0f}")
        alarm = f"{o['alarm_latency']:.1f} s" if "alarm_latency" in o else "none"
        named = ("yes" if o.get("alarm_culprit") and o.get("alarm_node") else "NO") if "alarm_latency" in o else "-"
        agent = f"{o['agent_steady']['cpu']:.2f}%" if o["agent_steady"] else "?"
        rw = o.get("reading_steady") or {}
        rss = f"{vw.get('rss', 0) / MB:.0f}" + (f" + {rw.get('rss', 0) / MB:.0f}" if rw else "")
        cpu = _pct(vw.get("cpu")) + (f" + {_pct(rw.get('cpu'))}" if rw else "")
        print(f"| {o['ranks']:,} ({o['nodes']}) {o['mode']} | {o['view']} | {o['load_steady']} | {lag} | "
              f"{rss} ({o['viewer_hwm'] / MB:.0f}) | {cpu} | "
              f"{va.get('threads', '?')} | {va.get('fds', '?')} | {vw.get('read', 0) / 1024:.0f} | {agent} | {alarm} | "
              f"{named} | {o['stall_alarms']} | {_pct(o['sim_cpu_steady'])} |")


def main(argv: list[str]) -> int:
    # (SIGTERM as an interrupt: each run ends what it started and removes its files before the bench exits)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    p = argparse.ArgumentParser(prog="bench.py scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", default="128", help="nodes, or a comma-separated list (a table at the end)")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0, help="how long the job runs (the viewer is measured)")
    p.add_argument("--stop-at", type=float, default=40.5, help="seconds in when the odd rank stops")
    p.add_argument("--mode", choices=("issue", "flat20", "both"), default="issue")
    p.add_argument("--view", choices=("headless", "tui", "tui-in-process", "both"), default="both",
                   help="tui: as `ddptop attach` shows it (the job read in a process of its own); tui-in-process: "
                        "read in the TUI's own process, as before issue 35's hosting")
    p.add_argument("--burst", type=int, default=200, help="lines every rank prints at once, 20 s in (issue mode)")
    p.add_argument("--real-node", default="node-0", help="the node served by the real ddptop agent")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (journals, stderr)")
    p.add_argument("--json", metavar="FILE", help="also write every run's figures here")
    p.add_argument("--drop", default="", metavar="NODE@S", help="cut NODE's link S seconds in (no bye): said once, "
                   "retried with backoff, the others unaffected?")
    p.add_argument("--freeze", default="", metavar="NODE@S", help="NODE's link goes silent S seconds in (open, "
                   "nothing on it: a network that hangs)")
    p.add_argument("--viewer-nofile", default="", metavar="SOFT[:HARD]",
                   help="the viewer's limit on open files (a login node's 1024, say), the simulator's unchanged")
    a = p.parse_args(argv)
    if a.stop_at >= a.seconds - 12:
        p.error("--stop-at must leave 12 s before --seconds for the alarm")
    rows = []
    for n in [int(x) for x in a.nodes.split(",")]:
        for mode in (("issue", "flat20") if a.mode == "both" else (a.mode,)):
            for view in (("headless", "tui") if a.view == "both" else (a.view,)):
                rows.append(run_one(n, a.ranks_per_node, mode, view, a.seconds, a.stop_at, a.burst, a.real_node,
                                    keep=a.keep, viewer_nofile=a.viewer_nofile, drop=a.drop, freeze=a.freeze))
                sys.stdout.flush()
    if len(rows) > 1:
        table(rows)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
