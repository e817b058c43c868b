"""ddptop benchmarks: print figures, assert nothing.

    python3 tests/bench/bench.py            # all
    python3 tests/bench/bench.py help ingest

Figures: `ddptop --help` wall time; time to the TUI's first frame; headless
ingest throughput (lines/s) for a synthetic multi-rank burst; ddptop's CPU use
(viewer and supervisor) while supervising a quiet 2-rank job; `ddptop attach`
over a loopback sshd: agent CPU use and line latency; the cost of watching
the process tree on a node with a thousand processes; the failure-signature
matcher's cost per log line.
"""

from __future__ import annotations

import json
import os
import statistics
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _texts(events) -> list[str]:
    """The log lines among the events (batches spread out)."""
    return [t for e in events if e.kind == "logs" for t in e.texts]


def bench_help(n: int = 7) -> None:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ddptop", "--help"], stdout=subprocess.DEVNULL, check=True, cwd=ROOT, timeout=60)
        times.append(time.perf_counter() - t0)
    print(f"ddptop --help wall time: median {statistics.median(times) * 1000:.0f} ms, min {min(times) * 1000:.0f} ms  (n={n})")


def make_synthetic_run(d: Path, ranks: int, lines: int, finished: bool = True, nodes: int = 1) -> Path:
    from ddptop.core.model import run_dirs
    from ddptop.core.model.run_meta import Meta
    from ddptop.core.run import journal
    run = d / "run"
    run.mkdir()
    log_dir = run / "logs"
    meta = Meta("bench", ["torchrun"], ["torchrun"], {}, str(ROOT), "bench", time.time(), str(log_dir), ranks, 0, "bench")
    journal.write_json(run / run_dirs.META, meta.to_dict())
    with open(run / run_dirs.EVENTS, "w") as f:
        f.write(json.dumps({"t": time.time(), "kind": "state", "state": "running"}) + "\n")
        for r in range(ranks):
            node = f"node{r * nodes // ranks}" if nodes > 1 else "bench"
            f.write(json.dumps({"t": time.time(), "kind": "rank", "rank": r, "local_rank": r, "node": node,
                                "pid": 10_000 + r, "attempt": 0, "alive": True}) + "\n")
        if finished:
            f.write(json.dumps({"t": time.time(), "kind": "state", "state": "succeeded", "exit_code": 0}) + "\n")
    if finished:
        journal.write_json(run / run_dirs.EXIT, {"state": "succeeded", "exit_code": 0})
    for r in range(ranks):
        p = log_dir / "x_1" / "attempt_0" / str(r)
        p.mkdir(parents=True)
        with open(p / "stdout.log", "w") as f:
            for start in range(0, lines, 10_000):  # (in pieces: this process stays small, see bench_replay)
                f.write("".join(f"step {i} loss 0.{i % 9973:04d} lr 3e-4 epoch 1 [batch {i}/1000000]\n"
                                for i in range(start, min(lines, start + 10_000))))
        (p / "stderr.log").write_text("")
    return run


def bench_ingest(ranks: int = 8, lines: int = 250_000) -> None:
    from ddptop.headless import run_headless
    from ddptop.core.run.run_session import Session
    with tempfile.TemporaryDirectory() as d:
        run = make_synthetic_run(Path(d), ranks, lines)
        total = ranks * lines
        for mode in ("text", "json"):
            s = Session.open(run)
            out = open(os.devnull, "w")
            t0 = time.perf_counter()
            run_headless(s, json_mode=(mode == "json"), out=out, stop_on_signal=False, interval=0)
            dt = time.perf_counter() - t0
            print(f"headless ingest ({mode}): {total / dt:,.0f} lines/s ({ranks} ranks x {lines:,} lines in {dt:.2f} s)")
        s = Session.open(run)
        t0 = time.perf_counter()
        n = 0
        while not s.finished:
            n += sum(len(e) if e.kind == "logs" else 1 for e in s.poll())
        dt = time.perf_counter() - t0
        print(f"session poll only (lines and events, no output): {n / dt:,.0f} lines/s")


def bench_first_frame() -> None:
    code = r'''
import asyncio, sys, time, tempfile
from pathlib import Path
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/tests/bench")
from bench import make_synthetic_run
from ddptop.core.run.run_session import Session
from ddptop.ui.app import make_app
d = tempfile.mkdtemp()
run = make_synthetic_run(Path(d), 2, 100)
app = make_app(Session.open(run))
async def main():
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        print(f"{(time.perf_counter() - t0) * 1000:.0f}")
asyncio.run(main())
'''
    times = []
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            print("first frame: could not measure:", r.stderr.strip().splitlines()[-1:] )
            return
        times.append(float(r.stdout.strip().splitlines()[-1]))
    print(f"TUI first frame (process start excluded, imports included): median {statistics.median(times):.0f} ms (n=3)")


def bench_supervise(seconds: float = 20) -> None:
    import psutil
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, DDPTOP_RUNS_DIR=d)
        steps = int(seconds)
        p = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "torchrun", "--nproc-per-node", "2",
                              str(ROOT / "examples" / "train_ddp.py"), "--steps", str(steps), "--step-time", "1"],
                             cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        viewer = psutil.Process(p.pid)
        sup = None
        deadline = time.time() + 60
        while sup is None and time.time() < deadline:
            for f in Path(d).glob("*/supervisor.json"):
                try:
                    sup = psutil.Process(json.loads(f.read_text())["pid"])
                except Exception:
                    pass
            time.sleep(0.2)
        time.sleep(8)  # past torch import and rendezvous
        v0, s0, t0 = sum(viewer.cpu_times()[:2]), sum(sup.cpu_times()[:2]), time.perf_counter()
        time.sleep(max(1.0, seconds - 12))
        v1, s1, t1 = sum(viewer.cpu_times()[:2]), sum(sup.cpu_times()[:2]), time.perf_counter()
        p.wait(timeout=300)
        dt = t1 - t0
        print(f"supervising a quiet 2-rank job (1 step/s): viewer {100 * (v1 - v0) / dt:.2f}% of a core, "
              f"supervisor {100 * (s1 - s0) / dt:.2f}% of a core (over {dt:.0f} s)")


def bench_telemetry(gpus: int = 8, ranks: int = 8, ticks: int = 200) -> None:
    """Telemetry tick cost, 8 real rank processes and 8 GPUs: behind the Python
    fake of pynvml, and behind the real pynvml over the C stand-in for
    libnvidia-ml (tests/support/nvml_stub): the latter counts pynvml's ctypes work,
    everything but the driver's own time."""
    sys.path[:0] = [str(ROOT / "tests" / "support"), str(ROOT / "tests")]  # (fake_nvml, helpers, sshd; conftest)
    import fake_nvml
    from ddptop.core.sources.gpu_nvml import NvmlBackend
    from ddptop.core.sources.telemetry import RankProc, Telemetry
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(ranks)]
    try:
        fgpus = [fake_nvml.FakeGpu(procs=[p.pid]) for p in procs[:gpus]]
        tel = Telemetry(NvmlBackend(fake_nvml.make(fgpus)))
        rp = [RankProc(i, i, p.pid) for i, p in enumerate(procs)]
        tel.tick(rp)
        c0 = time.process_time()
        for _ in range(ticks):
            tel.tick(rp)
        cpu = (time.process_time() - c0) / ticks
        print(f"telemetry tick, {gpus} GPUs (fake NVML) + {ranks} ranks (real psutil): {cpu * 1000:.2f} ms CPU per tick "
              f"= {cpu * 100:.2f}% of one core at 1 Hz (fake NVML calls cost ~0; real ones add the driver's time)")
        with tempfile.TemporaryDirectory() as d:
            fake_nvml.build_stub(d)
            conf = Path(d) / "nvml.conf"
            conf.write_text(f"gpus {gpus}\n" + "".join(f"gpu {i} util 90 30\ngpu {i} pids {p.pid}\n"
                                                      for i, p in enumerate(procs[:gpus])))
            code = f"""
import json, sys, time
sys.path.insert(0, {str(ROOT)!r})
from ddptop.core.sources.gpu_nvml import NvmlBackend
from ddptop.core.sources.telemetry import RankProc, Telemetry
tel = Telemetry(NvmlBackend())
rp = [RankProc(i, i, pid) for i, pid in enumerate({[p.pid for p in procs]!r})]
evs = tel.tick(rp)
assert sum(e.kind == "proc" and e.gpu_mapping == "nvml" for e in evs) == {min(gpus, ranks)}, evs
c0 = time.process_time()
for _ in range({ticks}):
    tel.tick(rp)
print((time.process_time() - c0) / {ticks})
"""
            env = dict(os.environ, LD_LIBRARY_PATH=d, DDPTOP_FAKE_NVML=str(conf))
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                print("telemetry tick through the real pynvml: failed:", out.stderr.strip().splitlines()[-1:])
                return
            cpu = float(out.stdout.split()[-1])
            print(f"telemetry tick, {gpus} GPUs (real pynvml over the C stand-in for libnvidia-ml) + {ranks} ranks: "
                  f"{cpu * 1000:.2f} ms CPU per tick = {cpu * 100:.2f}% of one core at 1 Hz (driver time excluded)")
    finally:
        for p in procs:
            p.kill()
            p.wait()


def bench_hook(steps: int = 20000) -> None:
    code = r"""
import os, sys, time, torch
m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.0)
for _ in range(500): opt.step()
t = time.perf_counter()
for _ in range(%d): opt.step()
print((time.perf_counter() - t) / %d * 1e6)
""" % (steps, steps)
    with tempfile.TemporaryDirectory() as d:
        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DDPTOP_BEAT_DIR")}
        hooked = dict(base, PYTHONPATH=str(ROOT / "ddptop" / "_inject"), DDPTOP_BEAT_DIR=d, RANK="0")
        res = {}
        for name, env in (("plain", base), ("hooked", hooked)):
            runs = [float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                         timeout=300, check=True).stdout) for _ in range(3)]
            res[name] = min(runs)
        assert os.path.exists(os.path.join(d, "hook.0"))
    print(f"step hook: optimizer.step() {res['plain']:.1f} us plain, {res['hooked']:.1f} us with the hook: "
          f"+{res['hooked'] - res['plain']:.1f} us per step (a 100 ms training step: {100 * (res['hooked'] - res['plain']) / 1e5:.4f}%)")
    # the batch hook: one DataLoader iterator's __next__, with and without the hook (target <= 5 us per batch)
    batch_code = r"""
import time, torch
from torch.utils.data import DataLoader
dl = DataLoader(range(%d), batch_size=None)
torch.nn.Linear(2, 2).train()  # a model in train mode: the hook reads its mode at every batch
for _ in dl: pass
t = time.perf_counter()
for _ in dl: pass
print((time.perf_counter() - t) / %d * 1e6)
""" % (steps * 10, steps * 10)
    with tempfile.TemporaryDirectory() as d:
        hooked = dict(base, PYTHONPATH=str(ROOT / "ddptop" / "_inject"), DDPTOP_BEAT_DIR=d, RANK="0")
        res = {}
        for name, env in (("plain", base), ("hooked", hooked)):
            runs = [float(subprocess.run([sys.executable, "-c", batch_code], env=env, capture_output=True, text=True,
                                         timeout=300, check=True).stdout) for _ in range(3)]
            res[name] = min(runs)
        assert os.path.exists(os.path.join(d, "batch.0"))
    print(f"batch hook: a DataLoader batch {res['plain']:.2f} us plain, {res['hooked']:.2f} us with the hook: "
          f"+{res['hooked'] - res['plain']:.2f} us per batch (target <= 5 us)")


def bench_alarm_latency(repeat: int = 2) -> None:
    """How long after the step that should have come the stall alarm arrives,
    on real 2- and 3-rank jobs, per hang form and step time: the distribution
    (median, p90, max), and whether the alarm named the culprit and its line."""
    sys.path[:0] = [str(ROOT / "tests" / "support"), str(ROOT / "tests")]  # (fake_nvml, helpers, sshd; conftest)
    from helpers import free_port

    forms = [("gloo, rank 1 stuck, rank 0 polling", ["--fault", "hang"], 2),
             ("CUDA stand-in, rank 1 stuck, rank 0 at its sync", ["--sim-cuda", "on", "--fault", "hang"], 2),
             ("CUDA stand-in, rank 1 in another collective (3 ranks)",
              ["--sim-cuda", "on", "--fault", "other-collective"], 3)]
    lat: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, DDPTOP_RUNS_DIR=d, XDG_CACHE_HOME=os.path.join(d, "cache"))
        for name, fault, nproc in forms:
            for step_time in (0.05, 0.2, 0.5):
                for i in range(repeat):
                    r = subprocess.run([sys.executable, "-m", "ddptop", "--json", "--gpu", "sim", "--on-stall", "kill",
                                        "torchrun", "--nproc-per-node", str(nproc), "--master-port", str(free_port()),
                                        str(ROOT / "examples" / "train_ddp.py"), "--steps", "100000",
                                        "--step-time", str(step_time), *fault, "--fault-rank", "1",
                                        "--fault-step", str(15 + 5 * i)],
                                       env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
                    ev = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
                    steps = sorted(e["t"] for e in ev if e["kind"] == "log" and e["text"].startswith("step ")
                                   and e["rank"] == 0)
                    alarm = next((e for e in ev if e["kind"] == "alarm" and e["type"] == "stall"), None)
                    if alarm is None or len(steps) < 3:
                        print(f"  {name}, step {step_time} s: no alarm ({r.returncode})")
                        continue
                    interval = statistics.median(b - a for a, b in zip(steps, steps[1:]))
                    due = steps[-1] + interval
                    lat.append(alarm["t"] - due)
                    named = alarm["culprits"] == [1] and bool(alarm["where"].get("1", {}).get("line"))
                    print(f"  {name}, step every {interval:.2f} s: alarm {alarm['t'] - due:.1f} s after the step "
                          f"that should have come, {alarm['id']}, culprit and line {'named' if named else 'NOT named'}")
    if lat:
        lat.sort()
        p90 = lat[min(len(lat) - 1, int(0.9 * len(lat)))]
        print(f"alarm latency over {len(lat)} hangs: median {statistics.median(lat):.1f} s, p90 {p90:.1f} s, "
              f"max {lat[-1]:.1f} s after the step that should have come (target: median <= 5 s)")


def bench_nvml_tick(ticks: int = 50) -> None:
    """The CPU one telemetry tick costs over this machine's real GPUs (NVML), at 1 Hz."""
    from ddptop.core.sources.gpu_nvml import NvmlBackend
    from ddptop.core.sources.telemetry import Telemetry

    backend = NvmlBackend()
    if not backend.init():
        print(f"real NVML tick: no NVML here ({backend.error})")
        return
    try:
        tel = Telemetry(backend)
        tel.tick([])
        c0 = time.process_time()
        for _ in range(ticks):
            tel.tick([])
        per = (time.process_time() - c0) / ticks
        print(f"real NVML tick over {len(backend.devices)} GPU(s): {per * 1000:.2f} ms CPU = {per * 100:.2f}% of a "
              "core at 1 Hz")
    finally:
        backend.shutdown()


def bench_native_pause(dumps: int = 20) -> None:
    """What a native stack sample (``py-spy dump --native``, which stops the
    process while it unwinds) costs a rank: a child process spins a thread
    that notes every gap in its own timeline longer than 1 ms; the gaps that
    fall inside each dump are that dump's pause.  The same for the
    non-blocking Python-only dump, for comparison.  Twice: a plain Python
    process, and a real torch rank (torch imported, its main thread in
    matrix products: py-spy reads libtorch_cpu's symbols, benfred/py-spy#872)."""
    from ddptop.core.sources.stack_pyspy import NATIVE_TIMEOUT, py_spy

    exe = py_spy()
    if exe is None:
        print("native pause: py-spy is not installed")
        return
    child_code = """
import json, sys, threading, time
WORK
gaps = []
def spin():
    last = time.perf_counter()
    while True:
        now = time.perf_counter()
        if now - last > 0.001:
            gaps.append((last, now))
        last = now
threading.Thread(target=spin, daemon=True).start()
print(time.perf_counter(), flush=True)
sys.stdin.readline()
print(json.dumps(gaps), flush=True)
"""
    torch_work = ("import torch\ntorch.set_num_threads(1)\nx = torch.randn(256, 256)\n"
                  "def work():\n    while True:\n        float((x @ x).sum())\n"
                  "threading.Thread(target=work, daemon=True).start()")
    for label, work, n in (("plain python", "", dumps), ("torch rank", torch_work, max(5, dumps // 4))):
        child = subprocess.Popen([sys.executable, "-c", child_code.replace("WORK", work)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            child.stdout.readline()
            time.sleep(0.5)
            windows: dict[str, list[tuple[float, float]]] = {"native": [], "nonblocking": []}
            for i in range(n):
                for how in ("native", "nonblocking"):
                    t0 = time.perf_counter()
                    subprocess.run([exe, "dump", f"--{how}", "--pid", str(child.pid)], capture_output=True,
                                   timeout=60)
                    windows[how].append((t0, time.perf_counter()))
                    time.sleep(0.1)
            child.stdin.write("\n")
            child.stdin.flush()
            gaps = json.loads(child.stdout.readline())
        finally:
            child.kill()
            child.wait()
        for how, ws in windows.items():
            pauses = sorted(max([b - a for a, b in gaps if a >= w0 and b <= w1 + 0.01] or [0.0]) for w0, w1 in ws)
            walls = sorted(w1 - w0 for w0, w1 in ws)
            print(f"{label}: py-spy dump --{how}: the process paused {statistics.median(pauses) * 1000:.1f} ms "
                  f"median, {pauses[-1] * 1000:.1f} ms max over {len(ws)} dumps (the dump itself took "
                  f"{statistics.median(walls) * 1000:.0f} ms median, {walls[-1] * 1000:.0f} ms max; ddptop gives a "
                  f"native dump up after {NATIVE_TIMEOUT:g} s)")


def bench_stack_watch(ranks: int = 8, seconds: float = 40.0) -> None:
    """attach --pid's life signal: py-spy's CPU over one core while watching N
    ranks in turn (target: within 2% of a core on average), and each rank's
    sampling period."""
    from ddptop.core.sources.stack_probe import StackWatch

    code = "import time, torch\nwhile True:\n    time.sleep(0.01)\n    torch.randn(64, 64) @ torch.randn(64, 64)\n"
    procs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(ranks)]
    try:
        time.sleep(5)  # torch imported
        got: list = []
        w = StackWatch(lambda: {r: p.pid for r, p in enumerate(procs)}, got.extend)
        w.start()
        time.sleep(seconds)
        w.stop()
        per_rank = seconds / max(1, len([e for e in got if getattr(e, "rank", None) == 0]))
        print(f"stack watch ({ranks} ranks, {seconds:.0f} s): py-spy used {100 * w.cpu_seconds / w.wall_seconds:.2f}% "
              f"of a core (target <= 2%), {w.samples} samples, each rank every {per_rank:.1f} s")
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def bench_attach(lines: int = 200, every: float = 0.1, quiet_s: float = 20) -> None:
    """ddptop attach over a real sshd on 127.0.0.1: the agent's CPU use while
    streaming a quiet job, and the latency from a rank's line being written to
    the client having it."""
    import psutil

    sys.path[:0] = [str(ROOT / "tests" / "support"), str(ROOT / "tests")]  # (fake_nvml, helpers, sshd; conftest)
    from conftest import rank_started, write_run
    from sshd import remote_ddptop, start_sshd, stop_sshd
    from ddptop.core.sessions.ssh import RemoteSession

    with tempfile.TemporaryDirectory() as d:
        sshd = start_sshd(Path(d) / "sshd")
        try:
            runs = Path(d) / "runs"
            runs.mkdir()
            run = write_run(runs, events=[rank_started(time.time(), 0, os.getpid())], logs={0: ""}, nproc=1)
            me = psutil.Process()
            (run / "supervisor.json").write_text(json.dumps({"pid": me.pid, "create_time": me.create_time()}))
            log = next(run.glob("logs/*/attempt_0/0/stdout.log"))
            rs = RemoteSession("node-a", run=str(run), ssh=sshd.ssh, remote_cmd=remote_ddptop(runs))
            deadline = time.time() + 60
            while rs.link != "up" and time.time() < deadline:
                rs.poll()
                time.sleep(0.05)
            agent = next(p for p in psutil.process_iter(["cmdline"])
                         if "agent" in (p.info["cmdline"] or []) and "ddptop" in " ".join(p.info["cmdline"] or []))
            # a quiet job: one line a second
            c0, t0 = sum(agent.cpu_times()[:2]), time.perf_counter()
            with open(log, "a") as f:
                for i in range(int(quiet_s)):
                    f.write(f"step {i} loss 0.5\n")
                    f.flush()
                    end = time.time() + 1
                    while time.time() < end:
                        rs.poll()
                        time.sleep(0.05)
            c1, t1 = sum(agent.cpu_times()[:2]), time.perf_counter()
            # latency: lines written at a known time, received by polling the client every 5 ms
            lat = []
            with open(log, "a") as f:
                for i in range(lines):
                    f.write(f"lat {time.time():.6f}\n")
                    f.flush()
                    end = time.time() + every
                    while time.time() < end:
                        now = time.time()
                        lat += [now - float(text.split()[1]) for text in _texts(rs.poll()) if text.startswith("lat ")]
                        time.sleep(0.005)
            end = time.time() + 5
            while len(lat) < lines and time.time() < end:
                now = time.time()
                lat += [now - float(text.split()[1]) for text in _texts(rs.poll()) if text.startswith("lat ")]
                time.sleep(0.005)
            rs.close()
        finally:
            stop_sshd(sshd)
    lat.sort()
    print(f"attach over loopback sshd: agent {100 * (c1 - c0) / (t1 - t0):.2f}% of a core streaming a quiet job "
          f"(1 line/s, {t1 - t0:.0f} s); line written -> client has it: median {1000 * lat[len(lat) // 2]:.0f} ms, "
          f"p95 {1000 * lat[int(len(lat) * 0.95)]:.0f} ms, max {1000 * lat[-1]:.0f} ms ({len(lat)}/{lines} lines)")


def bench_relaunch(n: int = 3) -> None:
    """What a relaunch costs: ddptop's own time (noticing the request, the gap
    between the old attempt's last process ending and the new torchrun starting)
    next to torchrun's and the ranks' own stop and start-up times."""
    from ddptop.core.model.events import from_dict
    from ddptop.core.run.run_session import Session

    rows = []
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, DDPTOP_RUNS_DIR=d)
        for i in range(n):
            run_dir = Path(d) / f"r{i}"
            p = subprocess.Popen([sys.executable, "-m", "ddptop", "--json", "--gpu", "sim", "--run-dir", str(run_dir),
                                  "torchrun", "--nproc-per-node", "2", str(ROOT / "examples" / "train_ddp.py"),
                                  "--steps", "100000", "--step-time", "0.1"], cwd=ROOT, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                s = None
                deadline = time.time() + 120
                while time.time() < deadline:
                    if (run_dir / "meta.json").exists():
                        s = s or Session.open(run_dir)
                        s.poll()
                        if any("step 5 " in l for l in (run_dir / "logs").rglob("stdout.log") for l in [l.read_text()]):
                            break
                    time.sleep(0.1)
                import psutil

                first = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines()]
                tr_pid = int(next(e["message"].split()[-1] for e in first if e["kind"] == "state"
                                  and e["state"] == "running" and e.get("message", "").startswith("torchrun pid")))
                tr = psutil.Process(tr_pid)
                tr_gone = None
                t_req = time.time()
                assert s.relaunch(["p2p-off"], "bench")
                evs = []
                while time.time() < deadline:
                    evs += s.poll()
                    if tr_gone is None:
                        try:
                            if tr.status() == psutil.STATUS_ZOMBIE:
                                tr_gone = time.time()
                        except psutil.NoSuchProcess:
                            tr_gone = time.time()
                    launch = next((e for e in evs if e.kind == "launch" and e.generation == 1), None)
                    if launch and any(e.kind == "logs" and e.t > launch.t and any(t.startswith("step ") for t in e.texts)
                                      for e in evs):
                        break
                    time.sleep(0.02)
                ev = [from_dict(json.loads(l)) for l in (run_dir / "events.jsonl").read_text().splitlines()]
                stopping = next(e.t for e in ev if e.kind == "state" and e.state == "stopping" and e.t >= t_req - 1)
                launch = next(e for e in ev if e.kind == "launch" and e.generation == 1)
                old_end = max(e.t for e in ev if e.kind == "rank" and not e.alive and e.t < launch.t)
                running = next(e.t for e in ev if e.kind == "state" and e.state == "running" and e.t >= launch.t)
                first_rank = min(e.t for e in ev if e.kind == "rank" and e.alive and e.t >= launch.t)
                first_step = min(e.t for e in evs if e.kind == "logs" and e.t > launch.t
                                 and any(t.startswith("step ") for t in e.texts))
                rows.append(dict(notice=stopping - t_req, stop=old_end - stopping, torchrun_exit=tr_gone - old_end,
                                 gap=launch.t - tr_gone,
                                 spawn=running - launch.t, ranks=first_rank - running, step=first_step - first_rank))
                s.stop()
                p.wait(timeout=120)
            finally:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    own = med["notice"] + med["gap"] + med["spawn"]
    print(f"relaunch (median of {n}): ddptop's own time {own:.2f} s (notice the request {med['notice']:.2f} s, "
          f"old torchrun gone -> new torchrun {med['gap']:.2f} s, spawn {med['spawn']:.2f} s); "
          f"the old ranks' stop after SIGTERM {med['stop']:.2f} s, torchrun's own exit after them "
          f"{med['torchrun_exit']:.2f} s; torchrun start-up to ranks {med['ranks']:.2f} s; "
          f"rank start-up to the first step {med['step']:.2f} s (torch import, rendezvous)")


def bench_busy_node(others: int = 1000, ranks: int = 8, ticks: int = 50) -> None:
    """A node with many processes (GPU nodes often run a thousand): the cost of
    finding torchrun's ranks and each rank's data-loader workers, from
    /proc/PID/task/*/children (what ddptop does) vs psutil's scan of every process."""
    import psutil
    sys.path[:0] = [str(ROOT / "tests" / "support"), str(ROOT / "tests")]  # (fake_nvml, helpers, sshd; conftest)
    import fake_nvml
    from ddptop.core.sources import proc_tree as procs
    from ddptop.core.sources.gpu_nvml import NvmlBackend
    from ddptop.core.sources.telemetry import RankProc, Telemetry
    crowd = [subprocess.Popen(["sleep", "300"]) for _ in range(others)]
    rank_code = "import subprocess, time; [subprocess.Popen(['sleep', '300']) for _ in range(2)]; time.sleep(300)"
    job = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                            f"[subprocess.Popen([sys.executable, '-c', {rank_code!r}]) for _ in range({ranks})]; time.sleep(300)"])
    try:
        tr = psutil.Process(job.pid)
        deadline = time.time() + 60
        while len(tr.children(recursive=True)) < 3 * ranks and time.time() < deadline:
            time.sleep(0.2)
        rp = [RankProc(i, i, c.pid) for i, c in enumerate(tr.children())]
        n = len(psutil.pids())

        def cost(fn, k=ticks):
            fn()
            c0 = time.process_time()
            for _ in range(k):
                fn()
            return (time.process_time() - c0) / k * 1000

        rows = []
        for label, supported in (("children files", None), ("psutil scan", False)):
            procs._SUPPORTED = supported
            tel = Telemetry(NvmlBackend(fake_nvml.make([fake_nvml.FakeGpu() for _ in range(ranks)])))
            disc = cost(lambda: procs.children(tr))
            tick = cost(lambda: tel.tick(rp))
            # the supervisor looks for ranks twice a second and samples once a second
            rows.append((label, disc, tick, (2 * disc + tick) / 10))
        procs._SUPPORTED = None
        print(f"busy node: {n} processes, torchrun with {ranks} ranks x 2 workers")
        for label, disc, tick, pct in rows:
            print(f"  {label:15s} find ranks {disc:6.2f} ms, telemetry tick {tick:6.2f} ms "
                  f"-> {pct:.2f}% of a core (2 Hz discovery + 1 Hz ticks)")
    finally:
        for c in psutil.Process(job.pid).children(recursive=True):
            c.kill()
        job.kill()
        job.wait()
        for p in crowd:
            p.kill()
            p.wait()


def bench_signatures(lines: int = 50_000) -> None:
    """The failure-signature matcher (run on every log line by the detection
    thread): microseconds per line for ordinary training lines, NCCL INFO
    lines (NCCL_DEBUG=INFO floods them at start-up) and the error lines of a
    crash."""
    from ddptop.core.analysis.signatures import SignatureMatcher

    kinds = {
        "training": [f"[rank0]: step {i} loss 0.{i % 97:04d} lr 3e-4 grad_norm 1.23 tokens/s 152344" for i in range(lines)],
        "NCCL INFO": [f"node1:12345:12400 [0] NCCL INFO Channel {i % 32:02d}/0 : 0[0] -> 1[0] via P2P/IPC/read"
                      for i in range(lines)],
        "errors": [("RuntimeError: DataLoader worker (pid 2637) is killed by signal: Killed. ",
                    "[rank1]: RuntimeError: Expected to have finished reduction in the prior iteration before starting",
                    "NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129")[i % 3]
                   for i in range(lines // 10)],
    }
    for kind, ls in kinds.items():
        best = float("inf")
        for _ in range(3):
            m = SignatureMatcher()
            t0 = time.perf_counter()
            for line in ls:
                m.feed(line, 0)
            best = min(best, (time.perf_counter() - t0) / len(ls))
        print(f"signatures: {kind:<10} {best * 1e6:6.2f} us/line ({1 / best:,.0f} lines/s on one core)")


def _target(figure: str, target: str, anchor: str) -> str:
    return f"{figure:<58} target {target:<22} anchor {anchor}"


def installed_bytecode() -> None:
    """Compile ddptop's modules to bytecode first, as installing a package does (pip writes the .pyc files;
    this checkout may run with PYTHONDONTWRITEBYTECODE, where every start would compile the edited modules
    again): start-up figures measure the start of an installed ddptop."""
    import compileall

    compileall.compile_dir(str(ROOT / "ddptop"), quiet=1)


def bench_replay(ranks: int = 2, lines: int = 1_000_000) -> None:
    """Replay of a finished run through the CLI, as a person runs it:
    `ddptop --headless attach RUN > /dev/null`, against a plain Python loop
    over the same files; the replay's peak RSS."""
    installed_bytecode()
    with tempfile.TemporaryDirectory() as d:
        run = make_synthetic_run(Path(d), ranks, lines)
        total = ranks * lines
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "attach", str(run)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        # the child's peak RSS (Linux keeps a peak across fork and exec: this
        # process is kept small, so the figure is the replay's own)
        _, _, usage = os.wait4(p.pid, 0)
        p.returncode = 0
        dt = time.perf_counter() - t0
        rss = usage.ru_maxrss
        t1 = time.perf_counter()
        n = 0
        for f in sorted(run.glob("logs/*/attempt_0/*/stdout.log")):
            with open(f, encoding="utf-8", errors="replace") as fh:
                for _line in fh:
                    n += 1
        loop = time.perf_counter() - t1
        # the same loop as a program of its own (a Python start, as the replay pays), and the replay's fixed
        # cost: the same command on a run of 10 lines a rank (start-up: Python, ddptop's imports, the session)
        t2 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import sys\nfor f in sys.argv[1:]:\n    for _ in open(f, "
                        "encoding='utf-8', errors='replace'): pass", *map(str, sorted(run.glob("logs/*/attempt_0/*/stdout.log")))],
                       check=True)
        loop_proc = time.perf_counter() - t2
        (Path(d) / "tiny").mkdir()
        tiny = make_synthetic_run(Path(d) / "tiny", ranks, 10)
        starts = []
        for _ in range(5):
            t3 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "ddptop", "--headless", "attach", str(tiny)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, cwd=ROOT)
            starts.append(time.perf_counter() - t3)
        start = statistics.median(starts)
        print(_target(f"replay via the CLI, {ranks} x {lines:,} lines: {total / dt:,.0f} lines/s",
                      ">= 1,000,000 lines/s", "lnav ~1.7M lines/s"))
        print(f"  ({dt / loop:.1f}x a plain Python line loop over the same files, {dt / loop_proc:.1f}x that loop run as a "
              f"program; of the replay's {dt * 1000:.0f} ms, {start * 1000:.0f} are its start-up (a 10-line run), the "
              f"lines {(dt - start) / loop:.1f}x the loop; peak RSS {rss / 1024:.0f} MB, target < 200 MB for 2M lines) "
              f"[load {os.getloadavg()[0]:.2f}]")


def bench_latency(seconds: float = 20.0, rate: float = 20.0) -> None:
    """A line a rank writes -> the same line on `ddptop --headless`'s stdout, for
    a live launch (2 ranks, `rate` lines/s each); each line carries the time
    the rank wrote it."""
    script = r"""
import os, sys, time
n, rate = int(sys.argv[1]), float(sys.argv[2])
for i in range(n):
    print(f"tick {i} {time.time():.6f}", flush=True)
    time.sleep(1 / rate)
"""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "ticks.py"
        f.write_text(script)
        env = dict(os.environ, DDPTOP_RUNS_DIR=str(Path(d) / "runs"))
        p = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "torchrun", "--nproc-per-node", "2", str(f),
                              str(int(seconds * rate)), str(rate)], stdout=subprocess.PIPE, text=True, env=env,
                             cwd=ROOT, bufsize=1)
        lat = []
        assert p.stdout is not None
        for line in p.stdout:
            now = time.time()
            parts = line.split()
            if len(parts) == 4 and parts[1] == "tick":  # [rN] tick I T
                lat.append((now - float(parts[3])) * 1000)
        p.wait(timeout=120)
    lat = lat[len(lat) // 10:]  # (the first lines come while everything starts)
    q = statistics.quantiles(lat, n=20)
    print(_target(f"live line latency ({len(lat)} lines): p50 {statistics.median(lat):.0f} ms, p95 {q[18]:.0f} ms",
                  "p50 <= 25, p95 <= 60 ms", "inotify wake-up ~ms"))


FLOOR_APP = """
from textual.app import App
from textual.widgets import Static
class Floor(App):
    def compose(self):
        yield Static("floor: rank last output")
Floor().run()
"""


# the stock Textual widgets of ddptop's screen, laid out as it lays them out, with no ddptop code: a header, the
# rank table (8 rows), the GPU table, a tab per rank, the merged log with a screenful of lines, the two hidden
# inputs and the footer's keys: what Textual itself costs to show such a screen
LAYOUT_APP = """
import sys
from textual.app import App
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Input, RichLog, Static, TabbedContent, TabPane
RANKS = int(sys.argv[1])
class Layout(App):
    BINDINGS = [Binding(k, "bell", "key " + k) for k in "abcdefghi"]
    def compose(self):
        yield Static("floor: ddptop header")
        yield DataTable(id="ranks")
        yield DataTable(id="gpus")
        with TabbedContent():
            with TabPane("merged"):
                yield RichLog(id="merged")
            for r in range(RANKS):
                yield TabPane(f"rank {r}")
        yield Input(id="filter")
        yield Input(id="picker")
        yield Footer()
    def on_mount(self):
        table = self.query_one("#ranks", DataTable)
        table.add_columns("rank", "local", "node", "pid", "state", "attempt", "last output", "step")
        for r in range(RANKS):
            table.add_row(str(r), str(r), "node", str(10000 + r), "gone", "0", "-", "99")
        self.query_one("#filter").display = self.query_one("#picker").display = False
        log = self.query_one("#merged", RichLog)
        for i in range(60):
            log.write(f"[r{i % RANKS}] step {i} loss 0.0070 lr 3e-4 epoch 1")
Layout().run()
"""


def _tmux_until(name: str, command: str, seen, limit: float = 30) -> float | None:
    """Milliseconds from starting ``command`` in a new tmux session (160x45) until seen(screen)."""
    t0 = time.perf_counter()
    subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "160", "-y", "45", command], check=True, cwd=ROOT)
    try:
        while time.perf_counter() - t0 < limit:
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout
            if seen(screen):
                return (time.perf_counter() - t0) * 1000
            time.sleep(0.005)
        return None
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)


def frame_floor(n: int = 5, ranks: int = 8) -> tuple[float, float, float]:
    """The floors under ddptop's first frame here, medians in ms: Python with `import textual.app` (the
    issue's yardstick), a minimal Textual app (one Static) to its first frame in tmux, and ddptop's screen
    built of Textual's own widgets alone (LAYOUT_APP, ``ranks`` ranks), measured as the TUI's first frame is."""
    imports = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import textual.app"], check=True)
        imports.append((time.perf_counter() - t0) * 1000)
    with tempfile.TemporaryDirectory() as d:
        app = Path(d) / "floor.py"
        app.write_text(FLOOR_APP)
        frames = [_tmux_until(f"ddptop-floor-{os.getpid()}-{i}", f"{sys.executable} {app}",
                              lambda screen: "floor: rank last output" in screen) for i in range(n)]
        layout = Path(d) / "layout.py"
        layout.write_text(LAYOUT_APP)
        shown = [_tmux_until(f"ddptop-layout-{os.getpid()}-{i}", f"{sys.executable} {layout} {ranks}",
                             lambda screen: "floor: ddptop header" in screen and "last output" in screen
                             and "] step " in screen) for i in range(n)]
    return (statistics.median(imports), statistics.median([f for f in frames if f is not None]),
            statistics.median([f for f in shown if f is not None]))


def bench_frame_tmux(n: int = 5, ranks: int = 8, lines: int = 100, nodes: int = 1) -> None:
    """The TUI's first frame in a real terminal: tmux 160x45, `ddptop attach RUN`
    of a finished run (8 ranks x 100 lines, the issue's size; ``frame-tmux-1024``:
    128 nodes x 8 ranks x 200 lines), from process start to the header, the rank
    table and the merged log's lines on the screen (the first frame,
    first_frame.py), then to the full screen in its place; beside it, for a
    small run, the floor (frame_floor)."""
    import shutil

    if not shutil.which("tmux"):
        print("first frame in tmux: tmux is not installed")
        return
    installed_bytecode()
    # (a session that outlives the measured ones: a server whose last session ends exits, and a session started
    # just then fails)
    keeper = f"ddptop-bench-keeper-{os.getpid()}"
    subprocess.run(["tmux", "new-session", "-d", "-s", keeper, "sleep 900"], check=True)
    try:
        _frame_tmux(n, ranks, lines, nodes)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", keeper], capture_output=True)


def _frame_tmux(n: int, ranks: int, lines: int, nodes: int) -> None:
    times: list[float] = []
    built: list[float] = []
    whole: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        run = make_synthetic_run(Path(d), ranks, lines, nodes=nodes)
        screen = ""
        for i in range(n):
            name = f"ddptop-bench-{os.getpid()}-{i}"
            t0 = time.perf_counter()
            subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", "160", "-y", "45",
                            f"{sys.executable} -m ddptop attach {run}"], check=True, cwd=ROOT)
            try:
                while time.perf_counter() - t0 < 30:
                    screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True,
                                            text=True).stdout
                    if "ddptop" in screen and "rank" in screen and "last output" in screen and \
                            (ranks <= 2 or "] step " in screen):
                        times.append((time.perf_counter() - t0) * 1000)
                        break
                    time.sleep(0.005)
                # the full screen in the first frame's place (first_frame.py): the footer's palette key, which the
                # first frame does not draw
                while time.perf_counter() - t0 < 30:
                    screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True,
                                            text=True).stdout
                    if "^p palette" in screen:
                        built.append((time.perf_counter() - t0) * 1000)
                        break
                    time.sleep(0.005)
                # (a run of several nodes: until the merged log's last line names every rank: the whole replay
                # folded)
                every = f"[r0-{ranks - 1}] step {lines - 1} "
                while nodes > 1 and time.perf_counter() - t0 < 60:
                    screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", name], capture_output=True,
                                            text=True).stdout
                    if every in screen:
                        whole.append((time.perf_counter() - t0) * 1000)
                        break
                    time.sleep(0.02)
            finally:
                subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)
    if times:
        print(_target(f"TUI first frame in tmux, {ranks} ranks x {lines} lines (process start included): median "
                      f"{statistics.median(times):.0f} ms of {len(times)}",
                      "<= 1.6x the floor" if ranks <= 8 else "<= 2 s", "python + import textual.app"))
        if ranks <= 8:
            imp, floor, layout = frame_floor(n, ranks)
            med = statistics.median(times)
            print(f"  {med / imp:.1f}x Python with `import textual.app` ({imp:.0f} ms); a minimal Textual app's first "
                  f"frame {floor:.0f} ms ({floor / imp:.1f}x); ddptop's screen of Textual's own widgets alone, no "
                  f"ddptop code, {layout:.0f} ms ({layout / imp:.1f}x) [load {os.getloadavg()[0]:.2f}]")
        if built:
            print(f"  the full screen (tabs, keys, the table's cursor) in the first frame's place: median "
                  f"{statistics.median(built):.0f} ms of {len(built)}")
        if whole:
            print(f"  every rank's lines read and folded (the merged log's last line names all {ranks}): median "
                  f"{statistics.median(whole):.0f} ms of {len(whole)}")
        if nodes > 1 and screen:
            print("\n".join("  | " + ln for ln in screen.splitlines()[:45]))


def bench_ras(queries: int = 30) -> None:
    """NCCL RAS: one query (connect, handshake, report, parse, verdict) against
    the stand-in server, per format and job size; and, end to end, a hung
    2-rank job's alarm with the culprit from RAS (stack sampling off)."""
    sys.path[:0] = [str(ROOT / "tests" / "support"), str(ROOT / "tests")]  # (fake_nvml, helpers, sshd; conftest)
    from ras_server import Job, Rank, RasServer

    from ddptop.core.sources import ras_client as ras
    from ddptop.core.analysis.ras_verdict import verdict as ras_verdict

    for n in (8, 64, 1024):
        # (two ranks held back together: NCCL's text lists them as a group and its members)
        job = Job([Rank(r, 10000 + r, f"10.0.{r // 8}.1", gpu=r % 8, counts={"AllReduce": 4412 - (r in (5, 6))})
                   for r in range(n)])
        for version, fmt in (("2.29.2", "json"), ("2.27.3", "text")):
            srv = RasServer(lambda: job, version=version)
            took = []
            for _ in range(queries):
                t0 = time.perf_counter()
                v = ras_verdict(ras.query(srv.addr, timeout=5))
                took.append(time.perf_counter() - t0)
            srv.close()
            assert sorted(v.culprits) == [5, 6], v.text
            print(f"ras: query+parse+verdict, {n:5d} ranks, {fmt:4}: median {statistics.median(took) * 1000:6.2f} ms")
    # end to end: the alarm's culprit from RAS
    with tempfile.TemporaryDirectory() as d:
        runs = Path(d) / "runs"

        def real_job():
            rs = [x for x in runs.glob("*/meta.json")] if runs.exists() else []
            if not rs:
                return Job([])
            run = rs[0].parent
            pids = {}
            for line in (run / "events.jsonl").read_text().splitlines():
                e = json.loads(line)
                if e.get("kind") == "rank" and e.get("alive"):
                    pids[e["rank"]] = e["pid"]
            out = []
            for r, pid in sorted(pids.items()):
                try:
                    step = int((run / "beats" / f"hook.{r}").read_text().split()[0])
                except (OSError, ValueError, IndexError):
                    step = 0
                out.append(Rank(r, pid, "127.0.0.1", counts={"AllReduce": step + (r != 1)}))
            return Job(out)

        srv = RasServer(real_job)
        env = dict(os.environ, DDPTOP_RUNS_DIR=str(runs), NCCL_RAS_ADDR=srv.addr, DDPTOP_PY_SPY="")
        r = subprocess.run([sys.executable, "-m", "ddptop", "--json", "--gpu", "none", "--on-stall", "kill", "torchrun",
                            "--nproc-per-node", "2", str(ROOT / "examples" / "train_ddp.py"), "--steps", "100000",
                            "--step-time", "0.2", "--fault", "hang", "--fault-step", "20"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        srv.close()
        evs = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
        last_step = max(e["t"] for e in evs if e["kind"] == "log" and e["text"].startswith("step "))
        alarm = next(e for e in evs if e["kind"] == "alarm" and e["type"] == "stall")
        said = [e for e in evs if e["kind"] == "ras" and e["ok"]]
        print(f"ras: hung 2-rank job (steps 0.2 s): RAS asked {said[0]['t'] - last_step:.1f} s after the last step, "
              f"answered in {said[0]['took'] * 1000:.1f} ms; alarm {alarm['t'] - last_step:.1f} s after the last step "
              f"naming rank(s) {alarm['culprits']} from RAS")


def bench_idle(seconds: float = 30.0) -> None:
    """An idle viewer of a quiet job: `ddptop --headless attach RUN` of a live
    run that writes nothing (its supervisor alive, sleeping); the viewer's CPU
    over ``seconds``."""
    import psutil

    with tempfile.TemporaryDirectory() as d:
        run = make_synthetic_run(Path(d), 8, 10, finished=False)
        sup = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        try:
            (run / "supervisor.json").write_text(json.dumps({"pid": sup.pid,
                                                             "create_time": psutil.Process(sup.pid).create_time()}))
            p = subprocess.Popen([sys.executable, "-m", "ddptop", "--headless", "attach", str(run)], cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            viewer = psutil.Process(p.pid)
            time.sleep(5)  # (started, and has read what there is)
            c0, t0 = sum(viewer.cpu_times()[:2]), time.perf_counter()
            time.sleep(seconds)
            c1, t1 = sum(viewer.cpu_times()[:2]), time.perf_counter()
            p.terminate()
            p.wait(timeout=30)
        finally:
            sup.kill()
            sup.wait()
    print(_target(f"idle viewer of a quiet 8-rank job: {100 * (c1 - c0) / (t1 - t0):.2f}% of a core",
                  "<= 0.2% of a core", "(over %.0f s)" % (t1 - t0)))


_WRITER_64 = r"""
import json, os, sys, time
run, ranks, rate, seconds, odd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
files = [open(os.path.join(run, "logs", "x_1", "attempt_0", str(r), "stdout.log"), "a") for r in range(ranks)]
ev = open(os.path.join(run, "events.jsonl"), "a")
t0 = time.time(); i = 0; tick = 0.05; last_gpu = 0.0; alarmed = False
while time.time() - t0 < seconds:
    now = time.time()
    n = int(rate * tick)
    stuck = now - t0 > seconds / 3
    for r, f in enumerate(files):
        if stuck and r == odd:
            continue
        f.write("".join(f"[node{r // 8}] rank {r} step {i + k} loss 0.{(i + k) % 997:03d} lr 3e-4 tokens/s 51234\n"
                        for k in range(n)))
        f.flush()
    i += n
    if now - last_gpu >= 1.0:
        last_gpu = now
        ev.write("".join(json.dumps({"t": now, "kind": "gpu", "index": r % 8, "node": f"node{r // 8}",
                                     "name": "H100", "util": 0.0 if r == odd and stuck else 99.0,
                                     "mem_used": 60 << 30, "mem_total": 80 << 30, "power_w": 500.0,
                                     "ranks": [r]}) + "\n" for r in range(ranks)))
        ev.flush()
    if stuck and not alarmed and now - t0 > seconds / 3 + 5:
        alarmed = True
        ev.write(json.dumps({"t": now, "kind": "alarm", "type": "stall", "id": "stall", "ranks": list(range(ranks)),
                             "culprits": [odd], "message": f"rank {odd} has printed nothing for 5 s"}) + "\n")
        ev.flush()
    time.sleep(max(0.0, tick - (time.time() - now)))
"""


def bench_ui64(ranks: int = 64, rate: int = 1000, seconds: float = 40.0, odd: int = 37) -> None:
    """64 ranks (8 nodes x 8, a synthetic journal written live): every rank
    prints ``rate`` lines/s, rank ``odd`` stops a third of the way in and a
    stall alarm names it.  The TUI (Textual's headless driver, 160x45, in
    this process) is measured: event-loop lag (a 50 ms timer's lateness),
    peak RSS, the lines kept per pane, and whether the odd rank's row is
    marked and brought into view."""
    import asyncio
    import resource

    import psutil

    from ddptop.core.model import run_dirs
    from ddptop.core.run.run_session import Session
    from ddptop.ui.app import make_app
    from ddptop.ui.rank_table import RankTable

    with tempfile.TemporaryDirectory() as d:
        run = make_synthetic_run(Path(d), ranks, 0, finished=False, nodes=8)
        (run / run_dirs.SUPERVISOR).write_text(json.dumps({"pid": os.getpid(),
                                                          "create_time": psutil.Process().create_time()}))
        writer = subprocess.Popen([sys.executable, "-c", _WRITER_64, str(run), str(ranks), str(rate), str(seconds),
                                   str(odd)])
        lags: list[float] = []
        seen: dict = {}

        async def main():
            app = make_app(Session.open(run))
            async with app.run_test(size=(160, 45)) as pilot:
                last = [time.monotonic()]

                def beat():
                    now = time.monotonic()
                    lags.append((now - last[0] - 0.05) * 1000)
                    last[0] = now

                app.set_interval(0.05, beat)
                while writer.poll() is None:
                    await pilot.pause(0.5)
                table = app.query_one("#ranks", RankTable)
                seen["marked"] = "odd one out" in str(table.get_cell(str(odd), "state"))
                seen["cursor"] = table.cursor_row == table.get_row_index(str(odd))
                seen["kept"] = max(len(b.lines) for b in app.logs.buffers.values())
                seen["panes"] = len(app.logs.buffers)
                seen["lines"] = sum(info.lines for info in app.model.ranks.values())

        asyncio.run(main())
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lags = lags[20:]  # (the start)
    q = statistics.quantiles(lags, n=20)
    print(_target(f"TUI, {ranks} ranks x {rate} lines/s: event-loop lag p50 {statistics.median(lags):.0f} ms, "
                  f"p95 {q[18]:.0f} ms", "p95 <= 100 ms", "one frame ~16-50 ms"))
    print(_target(f"  peak RSS {rss:.0f} MB ({seen['panes']} panes, up to {seen['kept']:,} lines kept per pane, "
                  f"{seen['lines']:,} lines in all)", "<= 400 MB", "20k lines kept per pane"))
    print(f"  rank {odd}'s row marked as the odd one out: {seen['marked']}; brought into view: {seen['cursor']}")


def bench_analysis(lines: int = 50_000) -> None:
    """The live analysis (progress parser, signature matcher, stall bookkeeping)
    per log line, in-process, for three kinds of line, each fed as batches."""
    from ddptop.core.analysis.analyzer import Analyzer
    from ddptop.core.model.events import LogBatch

    kinds = {
        "a training line": [f"[default0]:step {i} loss 0.{i % 997:03d} lr 3e-4 epoch 1 tokens/s 51234"
                             for i in range(lines)],
        "a tqdm bar": [f"Epoch 0:  {i % 100}%|###   | {i}/{lines} [00:{i % 60:02d}<00:40, 5.0it/s, loss=0.5]"
                       for i in range(lines)],
        "an NCCL INFO line": [f"node1:1234:1250 [3] NCCL INFO Channel {i % 32:02d}/0 : 3[3] -> 4[4] via P2P/IPC"
                              for i in range(lines)],
    }
    for what, texts in kinds.items():
        a = Analyzer(lambda: 1.0)
        batches = [LogBatch(1.0, 0, "stdout", 0, "logs/0/stdout.log", "", tuple(range(k, k + 5000)),
                            tuple(texts[k:k + 5000])) for k in range(0, lines, 5000)]
        t0 = time.perf_counter()
        a.feed(batches)
        dt = time.perf_counter() - t0
        print(f"live analysis, {what}: {dt / lines * 1e6:.1f} us per line")


def bench_agent(seconds: float = 30.0, ranks: int = 8) -> None:
    """The agent's own CPU on one node of a live job (issue 35's load: 5 lines/s
    a rank, rank 0 at 10x, a step a second through the hook's and the batch
    beats): ``ddptop agent`` reads a journal this bench writes live, its output
    thrown away, measured after 5 s."""
    import psutil

    with tempfile.TemporaryDirectory() as d:
        run = make_synthetic_run(Path(d), ranks, 0, finished=False)
        me = psutil.Process()
        (run / "supervisor.json").write_text(json.dumps({"pid": me.pid, "create_time": me.create_time()}))
        (run / "beats").mkdir(exist_ok=True)
        logs = [open(next(run.glob(f"logs/*/attempt_0/{r}/stdout.log")), "a") for r in range(ranks)]
        beats = [os.open(run / "beats" / f"{kind}.{r}", os.O_WRONLY | os.O_CREAT, 0o644)
                 for r in range(ranks) for kind in ("hook", "batch")]
        agent = subprocess.Popen([sys.executable, "-m", "ddptop", "agent", "--run", str(run)], cwd=ROOT,
                                 stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            p = psutil.Process(agent.pid)
            t0 = time.time()
            c0 = None
            tick, k = 0, 0
            while time.time() - t0 < seconds + 5:
                tick += 1  # every 20 ms: rank 0 a line each tick (50/s), the others one every 10 ticks (5/s)
                for r, f in enumerate(logs):
                    if r == 0 or (tick + r) % 10 == 0:
                        k += 1
                        f.write(f"step {tick // 50} loss 0.{k % 997:03d} lr 3e-4 tokens/s 51234\n")
                        f.flush()
                if tick % 50 == 0:  # a step a second on every rank
                    for i, fd in enumerate(beats):
                        os.pwrite(fd, b"%020d %.6f %-5s\n" % (tick // 50, time.time(), b"train"), 0)
                if c0 is None and time.time() - t0 >= 5:
                    c0, w0 = sum(p.cpu_times()[:2]), time.time()
                time.sleep(max(0.0, t0 + tick * 0.02 - time.time()))
            c1, w1 = sum(p.cpu_times()[:2]), time.time()
        finally:
            agent.kill()
            agent.wait()
            for f in logs:
                f.close()
            for fd in beats:
                os.close(fd)
    print(_target(f"agent on a node of {ranks} ranks ({k / (time.time() - t0):.0f} lines/s, a step a second): "
                  f"{100 * (c1 - c0) / (w1 - w0):.2f}% of a core over {w1 - w0:.0f} s (load {os.getloadavg()[0]:.1f})",
                  "<= 1%", "issue 35"))


def bench_scale() -> None:
    """One ``ddptop attach`` following a 1,024-rank job of 128 simulated nodes over the real wire protocol
    (issue 35; tests/bench/scale_bench.py says how).  Its options follow it on the command line
    (``bench.py scale --nodes 1,8,32,128 --seconds 60``) and take the rest of it: the benchmarks named
    after them run after it."""
    sys.path.insert(0, str(ROOT / "tests" / "bench"))
    import scale_bench

    rest = sys.argv[sys.argv.index("scale") + 1:] if "scale" in sys.argv else []
    opts = []
    while rest and rest[0] not in BENCHES:
        opts.append(rest.pop(0))
    scale_bench.main(opts)
    if opts:  # (the loop in __main__ would read the options as benchmark names)
        for n in rest:
            BENCHES[n]()
        sys.exit(0)


def bench_ui_intake(ranks: int = 1024, seconds: int = 5) -> None:
    """The TUI's own work for one second of a 1,024-rank job at the scale benchmark's load (5 lines a rank,
    a step, a process and a GPU reading), in Textual's headless driver: ``app.ingest`` of the second's events
    (the log panes, the merged pane's folding, the job's state) and one refresh of the rank table and the
    GPU grid, each timed alone (what the screen's thread spends before it can paint; issue 35)."""
    import asyncio

    from ddptop.core.model.events import GpuEvent, LogBatch, ProcEvent, ProgressEvent, RankEvent
    from ddptop.core.model.session_protocol import Control, ExitStatus, Nodes, RemoteRun
    from ddptop.ui.app import make_app

    class Quiet:
        location = Nodes(tuple(RemoteRun(f"node-{n}", "run") for n in range(ranks // 8)))
        meta = final_state = error = None
        finished, is_live = False, True

        def poll(self):
            return []

        def wait(self, t):
            time.sleep(t)

        def wake(self):
            pass

        def control(self):
            return Control(False, False, False)

        def exit_status(self):
            return ExitStatus.unknown("running")

        def cursor(self):
            return {}

        def close(self):
            pass

    def second(k: int) -> list:
        t = time.time()
        evs: list = []
        if k == 0:
            evs += [RankEvent(t=t, rank=r, local_rank=r % 8, node=f"node-{r // 8}", pid=1000 + r, attempt=0, alive=True)
                    for r in range(ranks)]
        for r in range(ranks):
            node = f"node-{r // 8}"
            for j in range(5):
                evs.append(LogBatch.fast(t + j * 0.2, r, "stdout", 0, f"logs/x/attempt_0/{r % 8}/stdout.log",
                                         [1000 * k + 100 * j], [f"step {5 * k + j} loss 0.{j}{r % 7} tokens/s {1000 + r}"],
                                         node=node))
            evs.append(ProgressEvent(t=t, rank=r, step=k, source="hook"))
            evs.append(ProcEvent(t=t, rank=r, pid=1000 + r, cpu=99.0, rss=1 << 30, status="running", threads=12, node=node))
            evs.append(GpuEvent(t=t, index=r % 8, name="NVIDIA H100", util=99.0, mem_used=1 << 30, mem_total=80 << 30,
                                ranks=(r,), node=node))
        return evs

    intake, table = [], []

    async def go() -> None:
        app = make_app(Quiet())
        async with app.run_test(size=(160, 45)) as pilot:
            await pilot.pause(0.3)
            app.ingest(second(0))
            await pilot.pause(0.3)
            for k in range(1, seconds + 1):
                evs = second(k)
                t0 = time.perf_counter()
                app.ingest(evs)
                intake.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                app._refresh_table()
                table.append((time.perf_counter() - t0) * 1000)
                await pilot.pause(0.2)

    asyncio.run(go())
    print(f"TUI intake of one second of {ranks:,} ranks ({ranks * 5:,} lines, {ranks * 3:,} readings and steps): "
          f"median {statistics.median(intake):.0f} ms of {len(intake)}; the rank table and GPU grid refreshed: "
          f"median {statistics.median(table):.0f} ms [load {os.getloadavg()[0]:.2f}]")


BENCHES = {"help": bench_help, "ingest": bench_ingest, "frame": bench_first_frame, "supervise": bench_supervise,
           "telemetry": bench_telemetry, "hook": bench_hook, "alarm": bench_alarm_latency, "native-pause": bench_native_pause, "nvml-tick": bench_nvml_tick, "watch": bench_stack_watch, "attach": bench_attach, "relaunch": bench_relaunch,
           "busy-node": bench_busy_node, "signatures": bench_signatures, "ras": bench_ras,
           "replay": bench_replay, "latency": bench_latency, "frame-tmux": bench_frame_tmux, "idle": bench_idle, "ui64": bench_ui64,
           "frame-tmux-1024": lambda: bench_frame_tmux(3, ranks=1024, lines=200, nodes=128),
           "ui1024": lambda: bench_ui64(ranks=1024, rate=20, seconds=40, odd=777),
           "analysis": bench_analysis, "scale": bench_scale, "agent": bench_agent, "ui-intake": bench_ui_intake}

if __name__ == "__main__":
    names = sys.argv[1:] or list(BENCHES)
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}")
    for n in names:
        BENCHES[n]()
