"""A rank spinning at a CUDA synchronisation point, on a real GPU.  Skipped
without a CUDA torch (and, where a test reads it, NVML) or without py-spy.

Run on a GPU machine:  python3 -m pytest -q -s tests/gpu/test_cuda_sync_real.py

NCCL collectives are asynchronous: a rank whose peers never come does not
block inside the collective but runs on to its next CUDA synchronisation
(``loss.item()``) and spins there, on one Python line, on the CPU.  The hang
verdict (``ddptop.core.analysis.stack_verdict``) reads such a rank as waiting on the
GPU from its native frames (``py-spy dump --native``: the CUDA runtime or the
driver inside the Python line), or, from a Python-only dump, from its GPU
being busy (NVML) while it sits on that line.  The tests on the CPU check
that reading on a stand-in CUDA runtime (examples/cuda_stub); these check the
real thing it stands for:

* a child keeps the GPU busy with long kernels (``torch.cuda._sleep``) and
  then syncs (``x.item()``): py-spy's native frames there come from
  libcudart/libcuda and the verdict says "gpu-wait" at that line, while a
  Python-only read (as the sampler takes it) shows the thread active (spinning) on the same line;
* the same wait on a blocking event (``torch.cuda.Event(blocking=True)``,
  cudaEventBlockingSync): the thread sleeps there (idle), and its native
  frames still come from the CUDA runtime or the driver;
* NVML, through ddptop's backend, reads that GPU busy meanwhile;
* what a native dump costs the rank: how long it stops it (figures only);
* with two GPUs or more, a real NCCL hang of examples/train_ddp.py launched
  by ddptop is named, with the waiting rank on the GPU or in the collective.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU here (torch.cuda.is_available() is false)", allow_module_level=True)

from ddptop.core.analysis.stack_verdict import gpu_library, parse_dump, rank_state
from ddptop.core.sources.stack_pyspy import py_spy, python_dump
from ddptop.core.sources.telemetry import make_backend

PY_SPY = py_spy()
if PY_SPY is None:
    pytest.skip("py-spy is not installed (pip install py-spy)", allow_module_level=True)

NVML = make_backend("auto")  # the backend `ddptop --gpu auto` samples with
NVML_OK = NVML.init()
needs_nvml = pytest.mark.skipif(not NVML_OK, reason=f"no NVML here: {NVML.error}")

ROOT = Path(__file__).resolve().parents[2]
DUMP_TIMEOUT = 90  # seconds for one py-spy dump (a native one reads the symbols of libtorch_cuda)
START_TIMEOUT = 180  # seconds for the child to import torch, start CUDA and queue its kernels

# The rank: queues `seconds` of GPU time at least, in kernels of a second or more, then syncs at one line.
# With --gaps, a thread notes every gap over 1 ms in its own timeline (the process was
# stopped, by a native dump) and beats once a second (so the test knows it ran throughout).
CHILD = r'''
import sys, threading, time
import torch

seconds = float(sys.argv[1])


def note_gaps():
    last = beat = time.perf_counter()
    while True:
        now = time.perf_counter()
        if now - last > 0.001:
            print(f"gap {last:.6f} {now:.6f}", flush=True)
            now = time.perf_counter()  # not the print's own time
        if now - beat >= 1.0:
            print(f"beat {now:.6f}", flush=True)
            beat = now = time.perf_counter()
        last = now


if "--gaps" in sys.argv:
    threading.Thread(target=note_gaps, daemon=True, name="gaps").start()
x = torch.ones(1, device="cuda:0")
# Every kernel used below launched once first: under lazy module loading (CUDA's default since 12.2) the
# first launch of a kernel loads its module, and that waits for the kernels already running.  (On an H100
# the add below, first launched behind the queued sleeps, sat in cuLaunchKernel for their whole length
# and "syncing" never came: tests/data/h100/launch-behind-sleeps.txt.)
x.add_(1)
torch.cuda._sleep(1000)
x.item()
# Kernels sized by a clock no GPU reaches (3 GHz), so each lasts a second at least.  (Sized by the
# clock measured on one short kernel, they ended early on an H200 and the tests found the child
# gone; a clock still ramping up from idle when measured is the likely cause.)  The tests kill the
# child when they are done with it.
per_s = 3_000_000_000
uuid = getattr(torch.cuda.get_device_properties(0), "uuid", "")
print(f"device {torch.cuda.get_device_name(0)} uuid {uuid}", flush=True)
for _ in range(max(1, round(seconds))):
    torch.cuda._sleep(per_s)  # a second of GPU time at least
x.add_(1)
if "--blocking-event" in sys.argv:
    done = torch.cuda.Event(blocking=True)  # cudaEventBlockingSync: a wait on it sleeps
    done.record()
    print("syncing", flush=True)
    done.synchronize()  # the blocking sync: waits, asleep, for the kernels above
    print("done", flush=True)
    sys.exit(0)
print("syncing", flush=True)
value = x.item()  # the sync: waits for the kernels above
print("done", value, flush=True)
'''
SYNC = 1 + next(i for i, line in enumerate(CHILD.splitlines()) if "value = x.item()" in line)
EVENT_SYNC = 1 + next(i for i, line in enumerate(CHILD.splitlines()) if "done.synchronize()" in line)


class Child:
    """The rank above, in its own process group, its output read by a thread."""

    def __init__(self, tmp_path: Path, seconds: float, *flags: str):
        self.script = tmp_path / "cuda_sync_rank.py"
        self.script.write_text(CHILD)
        self.lines: list[str] = []
        env = dict(os.environ, PYTHONUNBUFFERED="1", CUDA_DEVICE_ORDER="PCI_BUS_ID")
        self.p = subprocess.Popen([sys.executable, str(self.script), str(seconds), *flags],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                  env=env, start_new_session=True)
        self.pid = self.p.pid
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines[-40:])

    def wait_for(self, text: str, timeout: float = START_TIMEOUT) -> None:
        began = time.monotonic()
        deadline = began + timeout
        while text not in self.lines:
            if self.p.poll() is not None:
                self._reader.join(5)
                if text in self.lines:
                    break
                pytest.fail(f"the child exited ({self.p.returncode}) before {text!r}:\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {text!r} from the child in {timeout:.0f} s:\n{self.output()}")
            time.sleep(0.05)
        print(f"\n[{text!r} from the child after {time.monotonic() - began:.1f} s]", flush=True)

    @property
    def spinning(self) -> bool:
        """Still waiting at its sync (its kernels not finished)."""
        return self.p.poll() is None and not any(line.startswith("done") for line in self.lines)

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait(30)
        self._reader.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


EVIDENCE = os.environ.get("DDPTOP_GPU_EVIDENCE")  # a folder: every dump taken is kept there, as recorded evidence


def dump(pid: int, native: bool) -> subprocess.CompletedProcess:
    """A native dump, or the Python-only read ddptop's sampler takes (non-blocking, or paused where
    non-blocking reads come back without frames: ``python_dump``)."""
    if native:
        began = time.monotonic()
        r = subprocess.run([PY_SPY, "dump", "--native", "--full-filenames", "--pid", str(pid)],
                           capture_output=True, text=True, errors="replace", timeout=DUMP_TIMEOUT, check=False)
        print(f"[native dump: rc {r.returncode} in {time.monotonic() - began:.2f} s]", flush=True)
    else:
        r = python_dump(PY_SPY, pid, timeout=DUMP_TIMEOUT)
        if r.args[-1] == "paused":
            print("(non-blocking reads came back without frames: read paused)")
    if EVIDENCE and r.returncode == 0:
        os.makedirs(EVIDENCE, exist_ok=True)
        name = os.environ.get("PYTEST_CURRENT_TEST", "dump").split("::")[-1].split(" ")[0][:60]
        n = len(os.listdir(EVIDENCE))
        with open(os.path.join(EVIDENCE, f"{n:03d}-{name}-{'native' if native else r.args[-1]}.txt"), "w") as f:
            f.write(r.stdout)
    return r


def wait_at_sync(child: Child, timeout: float = 30.0, line: int = SYNC):
    """Python-only dumps until the main thread sits on the sync line (the
    line after "syncing"); its RankStack there."""
    began = time.monotonic()
    deadline = began + timeout
    while True:
        r = dump(child.pid, native=False)
        st = rank_state(parse_dump(r.stdout)) if r.returncode == 0 else None
        print(f"[python-only dump at {time.monotonic() - began:.1f} s: rc {r.returncode} {r.args[-1]}, "
              f"{st.state if st else None} at line {st.user.line if st and st.user else None}]", flush=True)
        if st is not None and st.user is not None and st.user.line == line:
            return st
        if time.monotonic() > deadline:
            pytest.fail(f"the child's main thread never showed at line {line}:\n{r.stdout}\n{r.stderr}\n"
                        f"{child.output()}")
        time.sleep(0.2)


def main_thread(threads):
    return next((t for t in threads if t.name == "MainThread"), threads[0] if threads else None)


def test_a_rank_spinning_at_a_cuda_sync_shows_cuda_frames_under_py_spy_native(tmp_path):
    """The reading the verdict rests on, on a real GPU: at ``x.item()`` behind
    long kernels, the main thread's innermost native frames (inside the sync
    line's Python frame) come from the CUDA runtime or the driver, so the rank
    is "gpu-wait" at that line; and a Python-only read shows it *active* on
    that one line (the runtime spins on the CPU), which without native frames
    or NVML would read like a rank working in a tight loop."""
    with Child(tmp_path, 60) as child:
        child.wait_for("syncing")
        wait_at_sync(child)
        r = dump(child.pid, native=True)
        assert r.returncode == 0, f"py-spy --native failed: {r.stderr}"
        assert child.spinning, "the kernels finished before the native dump: make them longer"
        threads = parse_dump(r.stdout)
        assert threads, r.stdout
        st = rank_state(threads)
        main = main_thread(threads)
        print(f"\n{next((ln for ln in child.lines if ln.startswith('device ')), '')}")
        print("main thread under py-spy --native (innermost first):")
        print("\n".join(f"  {'*' if gpu_library(f) else ' '} {f.function} ({f.base}{f':{f.line}' if f.line else ''})"
                        for f in main.frames))
        print(f"verdict: {st.kind}, gpu library {st.gpu!r}, native frame {st.native!r}: {st.text}")
        assert st.kind == "gpu-wait", r.stdout
        assert st.gpu in ("libcudart", "libcuda", "cuda-runtime", "cuda-driver"), st  # (the keys, before and after)
        assert st.user is not None and Path(st.user.file).name == child.script.name and st.user.line == SYNC, st

        # Python-only (as the sampler reads it): the thread runs (spins) on the sync line, in every sample
        for _ in range(3):
            r = dump(child.pid, native=False)
            assert r.returncode == 0, r.stderr
            st = rank_state(parse_dump(r.stdout))
            print(f"python-only: {st.state} at line {st.user.line if st.user else None}: {st.text}")
            assert st.user is not None and st.user.line == SYNC, r.stdout
            assert st.state == "active", r.stdout
            time.sleep(0.2)
        assert child.spinning


def test_a_rank_asleep_on_a_blocking_cuda_event_is_idle_with_cuda_frames_under_py_spy_native(tmp_path):
    """Blocking synchronisation, for real: ``torch.cuda.Event(blocking=True)``
    (cudaEventBlockingSync) recorded behind long kernels, then
    ``event.synchronize()``.  The thread sleeps there: py-spy shows it *idle*
    (not spinning), on that line, in every sample; and its native frames inside
    that line's Python frame include the CUDA runtime's or the driver's (under
    them, libc's futex or poll wait), so the rank still reads as waiting on the
    GPU ("gpu-wait"), not as a rank asleep in Python."""
    with Child(tmp_path, 60, "--blocking-event") as child:
        child.wait_for("syncing")
        wait_at_sync(child, line=EVENT_SYNC)
        r = dump(child.pid, native=True)
        assert r.returncode == 0, f"py-spy --native failed: {r.stderr}"
        assert child.spinning, "the kernels finished before the native dump: make them longer"
        threads = parse_dump(r.stdout)
        main = main_thread(threads)
        st = rank_state(threads)
        print(f"\n{next((ln for ln in child.lines if ln.startswith('device ')), '')}")
        print(f"main thread ({main.state}) under py-spy --native, blocking event (innermost first):")
        print("\n".join(f"  {'*' if gpu_library(f) else ' '} {f.function} ({f.base}{f':{f.line}' if f.line else ''})"
                        for f in main.frames))
        print(f"verdict: {st.kind}, gpu library {st.gpu!r}, native frame {st.native!r}: {st.text}")
        assert main.state == "idle", r.stdout  # asleep, not spinning
        # (the innermost Python frame is torch's Event.synchronize, the script's line calls it)
        inner_py = next(i for i, f in enumerate(main.frames) if not f.native)
        assert any(gpu_library(f) for f in main.frames[:inner_py]), r.stdout  # a CUDA call inside the sync
        assert any(Path(f.file).name == child.script.name and f.line == EVENT_SYNC for f in main.frames), r.stdout
        assert st.kind == "gpu-wait", r.stdout
        assert st.user is not None and st.user.line == EVENT_SYNC, st

        # Python-only (as the sampler reads it): idle on the sync line, in every sample
        for _ in range(3):
            r = dump(child.pid, native=False)
            assert r.returncode == 0, r.stderr
            st = rank_state(parse_dump(r.stdout))
            print(f"python-only: {st.state} at line {st.user.line if st.user else None}: {st.text}")
            assert st.user is not None and st.user.line == EVENT_SYNC, r.stdout
            assert st.state == "idle", r.stdout
            time.sleep(0.2)
        assert child.spinning


def _norm_uuid(u: str | None) -> str:
    return (u or "").lower().removeprefix("gpu-")  # NVML writes "GPU-<uuid>", torch the bare uuid


def nvml_index(child: Child) -> int:
    """The NVML index of the child's cuda:0: by UUID, else by PCI order (the
    child runs with CUDA_DEVICE_ORDER=PCI_BUS_ID, NVML's own order)."""
    line = next((ln for ln in child.lines if ln.startswith("device ")), "")
    uuid = line.split(" uuid ", 1)[1].split(" ", 1)[0] if " uuid " in line else ""
    for d in NVML.devices:
        if uuid and _norm_uuid(d.uuid) == _norm_uuid(uuid):
            return d.index
    if os.environ.get("CUDA_VISIBLE_DEVICES") and len(NVML.devices) > 1:
        pytest.skip(f"cannot tell which NVML device is cuda:0 (CUDA_VISIBLE_DEVICES set, uuid {uuid!r} unmatched)")
    return 0


@needs_nvml
def test_nvml_reads_the_gpu_busy_while_a_rank_spins_at_its_sync(tmp_path):
    """The other half of the reading: without native frames, a rank on one
    unchanged line counts as waiting on the GPU when ddptop's telemetry reads
    its GPU busy.  A GPU running kernels (here long ``_sleep`` kernels, as an
    NCCL kernel spins waiting for a peer) while its rank waits at the sync
    must read >= 90% utilisation through ddptop's own NVML backend."""
    with Child(tmp_path, 40) as child:
        child.wait_for("syncing")
        i = nvml_index(child)
        seen: list = []
        g = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and child.spinning:
            g = next(e for e in NVML.sample() if e.index == i)
            seen.append(g.util)
            if g.util is not None and g.util >= 90:
                break
            time.sleep(0.5)
        print(f"\nGPU {i} utilisation while the rank waits at its sync: {seen} %"
              + (f" (power {g.power_w} W, sm {g.sm_clock_mhz} MHz)" if g else ""))
        assert any(u is not None and u >= 90 for u in seen), seen


def test_what_a_native_dump_costs_a_rank_spinning_at_its_sync(tmp_path):
    """How long ``py-spy dump --native`` stops a rank (it stops every thread
    while it unwinds them), measured on a rank with torch and CUDA loaded and
    spinning at its sync, as the stall sampler finds one: a thread in the rank
    notes every gap over 1 ms in its own timeline, and the gaps inside each
    dump are that dump's pause.  The non-blocking dump, for comparison.
    Figures only (``-s`` shows them); asserts only that the dumps succeeded."""
    dumps = 5
    windows: dict[str, list[tuple[float, float]]] = {"native": [], "nonblocking": []}
    with Child(tmp_path, 400, "--gaps") as child:
        child.wait_for("syncing")
        wait_at_sync(child)
        for _ in range(dumps):
            for how in ("native", "nonblocking"):
                t0 = time.perf_counter()
                r = dump(child.pid, native=how == "native")
                windows[how].append((t0, time.perf_counter()))
                assert r.returncode == 0, f"py-spy --{how} failed: {r.stderr}"
                assert rank_state(parse_dump(r.stdout)).user is not None, r.stdout
                time.sleep(0.1)
        still = child.spinning
    gaps = [tuple(map(float, ln.split()[1:3])) for ln in child.lines if ln.startswith("gap ")]
    beats = [float(ln.split()[1]) for ln in child.lines if ln.startswith("beat ")]
    w0, w1 = windows["native"][0][0], windows["nonblocking"][-1][1]
    print(f"\n{next((ln for ln in child.lines if ln.startswith('device ')), '')}")
    print(f"the gap thread beat {sum(w0 <= b <= w1 for b in beats)} times over the {w1 - w0:.0f} s of dumps"
          f"{'' if still else ' (the rank left its sync before the last dump)'}")
    for how, ws in windows.items():
        pauses = sorted(max([b - a for a, b in gaps if a >= s and b <= e + 0.01] or [0.0]) for s, e in ws)
        walls = sorted(e - s for s, e in ws)
        print(f"py-spy dump --{how}: the rank paused {statistics.median(pauses) * 1000:.1f} ms median, "
              f"{pauses[-1] * 1000:.1f} ms max over {len(ws)} dumps (the dump took "
              f"{statistics.median(walls) * 1000:.0f} ms median, {walls[-1] * 1000:.0f} ms max)")
    outside = [b - a for a, b in gaps if not any(a >= s and b <= e + 0.01 for ws in windows.values() for s, e in ws)]
    print(f"gaps outside the dumps: {len(outside)}, longest {max(outside, default=0.0) * 1000:.1f} ms")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_nvml
@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason="needs two GPUs: NCCL refuses two ranks on one device (duplicate GPU)")
def test_a_two_rank_nccl_hang_is_named_with_gpu_waits(runs_dir):
    """The whole path on real NCCL: examples/train_ddp.py --fault hang, rank 1
    sleeps forever after its step-30 backward; rank 0's all-reduce of that
    step is an NCCL kernel that waits for it, and rank 0 spins at the next
    sync (``mean = t.item() / world``).  ddptop names rank 1 at its sleep, and
    reads rank 0 as waiting (on the GPU, or in the collective)."""
    example = ROOT / "examples" / "train_ddp.py"
    source = example.read_text().splitlines()
    stuck = 1 + next(i for i, line in enumerate(source) if "time.sleep(3600)" in line)
    p = subprocess.Popen([sys.executable, "-m", "ddptop", "--json", "--gpu", "auto", "--on-stall", "kill",
                          "torchrun", "--nproc-per-node", "2", "--master-port", str(free_port()), str(example),
                          "--steps", "100000", "--step-time", "0.05", "--fault", "hang", "--fault-rank", "1",
                          "--fault-step", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", cwd=ROOT, start_new_session=True)
    try:
        out, err = p.communicate(timeout=480)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # whatever is left of ddptop, torchrun and the ranks
        except ProcessLookupError:
            pass
        p.wait(30)
    events = [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]
    assert p.returncode == 124, err[-3000:]
    stalls = [e for e in events if e["kind"] == "alarm" and e["type"] == "stall"]
    assert len(stalls) == 1, stalls
    a = stalls[0]
    print("\n" + a["message"])
    assert a["culprits"] == [1], a
    assert a["where"]["1"]["line"] == stuck, a["where"]
    stacks = [e for e in events if e["kind"] == "stacks" and e["t"] <= a["t"]] or \
        [e for e in events if e["kind"] == "stacks"]
    assert stacks, "no stacks event"
    s = stacks[-1]
    w0 = s["where"]["0"]
    print(f"rank 0: {w0['kind']} (gpu {w0.get('gpu')!r}, native {w0.get('native')!r}) at line {w0['line']}: "
          f"{w0['text']}; native samples: {s.get('native')}, pause {s.get('pause')} s")
    assert w0["kind"] in ("gpu-wait", "collective"), s["where"]
