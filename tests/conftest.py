import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

# tests/support holds what the tests import besides this file (helpers, fake_nvml, sshd, ...): on sys.path
# for every test, whichever folder it is in (`from helpers import wait_for`, `import fake_nvml`)
SUPPORT = Path(__file__).resolve().parent / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))

from helpers import wait_for  # noqa: E402  (some tests import it from here)

# pytest keeps the test modules it rewrote for their asserts (tests/**/__pycache__, ignored by git) even where
# PYTHONDONTWRITEBYTECODE is set: the README's second pass (-m serial) and every run after the first collect in
# half the CPU (3.1 CPU-s a collection, not 6.6: every worker collects every test module)
sys.dont_write_bytecode = False

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
TIMEOUT = 180  # seconds, for any one ddptop/torchrun subprocess


# Tests that read CUDA_VISIBLE_DEVICES as the test process has it (unset: ranks map
# to GPUs by LOCAL_RANK).  (That one should give its child its own environment
# instead; then it can leave this list.)
CUDA_ENV_AS_IS = {"test_nvml_lib.py::test_gpu_lost_mid_run_and_xid_become_alarms_naming_the_ranks_on_it"}


@pytest.fixture(autouse=True)
def no_cuda_outside_tests_gpu(request, monkeypatch):
    """Every test outside tests/gpu passes with and without a GPU: the processes
    it starts see no CUDA GPU (torch on the CPU with gloo, which the example
    script and these tests' expectations are written for).  NVML still sees a
    machine's GPUs: the tests that read it use a fake pynvml, or compare with
    what this machine's own check says.  tests/gpu is where GPUs are used."""
    path = Path(request.path)
    if ROOT / "tests" / "gpu" in path.parents or f"{path.name}::{request.node.originalname}" in CUDA_ENV_AS_IS:
        return
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(autouse=True)
def own_port_and_state(monkeypatch, tmp_path_factory):
    """What tests running side by side (``pytest -n``) would otherwise share: each test's torchrun
    gets a rendezvous port of its own (torchrun reads --master-port from PET_MASTER_PORT), so jobs
    never meet on 29500; and ddptop's state directory (the default runs directory, where
    ``latest`` is looked up) is the test's own, never ~/.local/state.  A test that sets either
    itself (the ``runs_dir`` fixture, an explicit --master-port) wins."""
    from helpers import free_port

    monkeypatch.setenv("PET_MASTER_PORT", str(free_port()))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    d = tmp_path / "runs"
    monkeypatch.setenv("DDPTOP_RUNS_DIR", str(d))
    yield d
    # a test that failed midway must not leave its job running: stop it through
    # its supervisor, and check that no rank survives
    if d.exists():
        for run in d.iterdir():
            stop_run(run)


def stop_run(run: Path, timeout: float = 60) -> None:
    sup = run / "supervisor.json"
    if not sup.exists() or (run / "exit.json").exists():
        return
    from ddptop.core.run.run_session import Session

    s = Session.open(run)
    if s.is_live:
        s.stop()
        wait_for(lambda: (run / "exit.json").exists(), timeout=timeout, what=f"{run} to stop")
    left = [pid for pid in rank_pids(run).values() if alive(pid)]
    assert not left, f"ranks {left} of {run} survived the stop"


def ddptop_cmd(*args):
    return [sys.executable, "-m", "ddptop", *args]


def run_ddptop(*args, timeout=TIMEOUT, **kw):
    return subprocess.run(ddptop_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw)


def json_events(stdout: str):
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def journal_events(run_dir: Path):
    p = Path(run_dir) / "events.jsonl"
    if not p.exists():
        return []
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()]


def rank_pids(run_dir: Path):
    return {e["rank"]: e["pid"] for e in journal_events(run_dir) if e["kind"] == "rank" and e["alive"]}


def diagnose_agrees(run_dir: Path, live: dict, ended_by: str = "ddptop-on-stall") -> dict:
    """``ddptop diagnose --json`` of a run ddptop saw hang: its root cause is that hang, replayed from the
    journal, with the live alarm's culprits and, for each, the same line; who ended the run is said."""
    # the supervisor said in the journal how far it had read the logs (the replay times their lines by it)
    assert '"kind":"marks"' in (run_dir / "events.jsonl").read_text(errors="replace")
    r = run_ddptop("diagnose", "--json", str(run_dir))
    rep = json.loads(r.stdout)
    rc = rep["root_cause"]
    assert rc is not None and rc.get("replayed") is True, (rc, r.stderr[-2000:])
    assert rc["signature"] == live["id"] and sorted(rc["culprits"]) == sorted(live["culprits"]), (rc, live)
    assert sorted(rep["culprits"]) == sorted(live["culprits"]), rep["culprits"]
    for k, w in (live.get("where") or {}).items():
        got = rc["where"].get(k)
        assert got is not None and (got["file"], got["line"]) == (w["file"], w["line"]), (got, w)
    assert rep["stalls"]["differences"] == [], rep["stalls"]
    assert rep["ended_by"]["by"] == ended_by, rep["ended_by"]
    # the text says the same: the hang first, never "only consequences"
    text = run_ddptop("diagnose", str(run_dir)).stdout
    assert text.startswith("Root cause: the job hung") and "only consequences" not in text, text
    return rep


def only_run(runs_dir: Path) -> Path:
    runs = [d for d in runs_dir.iterdir() if (d / "meta.json").exists()]
    assert len(runs) == 1, runs
    return runs[0]


def write_run(root: Path, *, run_id: str = "test-run", events: list[dict], logs: dict[int, str],
              nproc: int = 2, env_set: dict | None = None, command: list[str] | None = None,
              torchrun_log: str | None = None, exit: dict | None = None) -> Path:
    """A run directory as the supervisor leaves it (meta, events, rank logs), without torchrun."""
    run_dir = root / "run"
    log_dir = run_dir / "logs"
    run_dir.mkdir(parents=True)
    command = command or ["torchrun", "--nproc-per-node", str(nproc), "train.py"]
    meta = {"run_id": run_id, "command": command, "user_command": command, "env_set": env_set or {},
            "cwd": str(root), "host": "h", "started": time.time(), "log_dir": str(log_dir),
            "nproc_per_node": nproc, "node_rank": 0, "ddptop_version": "0.1.0"}
    (run_dir / "meta.json").write_text(json.dumps(meta))
    for r, body in logs.items():
        d = log_dir / "x_abc" / "attempt_0" / str(r)
        d.mkdir(parents=True)
        (d / "stdout.log").write_text(body)
        (d / "stderr.log").write_text("")
    if torchrun_log is not None:
        (run_dir / "torchrun.log").write_text(torchrun_log)
    if exit is not None:
        (run_dir / "exit.json").write_text(json.dumps(exit))
    with open(run_dir / "events.jsonl", "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in events))
    return run_dir


def rank_started(t: float, rank: int, pid: int) -> dict:
    return {"t": t, "kind": "rank", "rank": rank, "local_rank": rank, "node": "h", "pid": pid, "attempt": 0, "alive": True}


def alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A real sshd on 127.0.0.1 (see tests/support/sshd.py), stopped by pid afterwards."""
    from sshd import start_sshd, stop_sshd

    s = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield s
    stop_sshd(s)


# -- tiers ---------------------------------------------------------------------------------------------
# A test's tier is the folder it is in: tests/unit (pure, in-process: milliseconds), tests/integration (real
# torchrun, sshd, frameworks or other processes), tests/ui (the Textual app under Pilot), tests/gpu (skipped
# without a GPU), tests/bench.  `pytest tests/unit` (or `-m unit`) is the fast loop.
TIERS = ("unit", "integration", "ui", "gpu", "bench")


def _tier(path: Path) -> str | None:
    try:
        folder = path.relative_to(ROOT / "tests").parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in TIERS else None


# -- tests/ui: a part of the screen the app could not draw fails the test ------------------------------
# The app catches an error while drawing a part of the screen (a rank's row, the header, the alarm box),
# says it once as a note in the log ("error: could not draw ...", DdptopApp._ui_error) and goes on, so a
# user keeps a working monitor.  In a UI test that note is a bug: every test in tests/ui has the app's
# reports recorded, and one that passed fails after its call if there were any.  A test that provokes
# one on purpose asks for the `ui_errors` fixture and checks the list itself.


@pytest.fixture
def ui_errors(monkeypatch) -> list[tuple[str, Exception]]:
    """(where, error) for every part of the screen the app reported it could not draw in this test
    (each call of DdptopApp._ui_error, which then goes on as it does for a user)."""
    from ddptop.ui.app import DdptopApp

    seen: list[tuple[str, Exception]] = []
    real = DdptopApp._ui_error

    def recording(self, where: str, e: Exception) -> None:
        seen.append((where, e))
        real(self, where, e)

    monkeypatch.setattr(DdptopApp, "_ui_error", recording)
    return seen


def check_no_ui_errors(seen) -> None:
    """AssertionError naming each part of the screen the app could not draw, if any."""
    if seen:
        said = sorted({f"{where}: {type(e).__name__}: {e}" for where, e in seen})
        raise AssertionError("the app could not draw " + "; ".join(said)
                             + " (a test that provokes this on purpose asks for the ui_errors fixture)")


@pytest.fixture(autouse=True)
def _ui_errors_fail_ui_tests(request):
    if _tier(Path(request.path)) != "ui" or "ui_errors" in request.fixturenames:
        return  # (a test that asked for ui_errors checks them itself)
    try:
        request.node._ddptop_ui_errors = request.getfixturevalue("ui_errors")
    except ImportError:  # no textual: the test skips itself
        pass


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield  # (a test that failed already is left as it failed)
    check_no_ui_errors(getattr(item, "_ddptop_ui_errors", ()))
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """``DDPTOP_TEST_COST=FILE``: one JSON line per test with its wall time, when it started, its xdist
    worker and the CPU it took (every process it started: torchrun, the ranks, ddptop, sshd; counted by a
    cgroup of the worker's own where cgroup v1's cpuacct is writable, else this process and the children it
    waited for: ``counted_by`` says which), to find what makes the suite long (issue 34); nothing is measured
    without it."""
    import os

    out = os.environ.get("DDPTOP_TEST_COST")
    if not out:
        return (yield)
    import json
    import resource
    import time

    group = _cpuacct_group()
    if group is not None:  # every process the test started, waited for or not (cgroup v1 cpuacct)
        def cpu() -> float:
            return int((group / "cpuacct.usage").read_text()) / 1e9
    else:
        def cpu() -> float:
            return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                          resource.getrusage(resource.RUSAGE_CHILDREN)))

    t0, c0, start = time.monotonic(), cpu(), time.time()
    try:
        return (yield)
    finally:
        with open(out, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "wall": round(time.monotonic() - t0, 2),
                                "cpu": round(cpu() - c0, 2), "start": round(start, 2),
                                "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                                "counted_by": "cgroup" if group is not None else "rusage"}) + "\n")


_cpuacct: list = []


def _cpuacct_group():
    """This worker's own cpuacct cgroup (made once, where cgroup v1 is writable): it counts the CPU of
    every process the worker's tests start, detached supervisors and killed ranks included, which
    getrusage's waited-for children miss. None where there is none to make."""
    import os

    if not _cpuacct:
        root = Path("/sys/fs/cgroup/cpuacct")
        # (a name of its own: in a worker's PID namespace every worker is pid 2)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        group = root / f"ddptop_test_{worker}_{os.urandom(4).hex()}"
        # the groups earlier runs' workers of this name left, empty now (not another worker's: it may have made
        # its own and not yet joined it)
        for old in root.glob(f"ddptop_test_{worker}_*"):
            try:
                old.rmdir()
            except OSError:
                pass
        try:
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
            _cpuacct.append(group)
        except OSError:
            _cpuacct.append(None)
    return _cpuacct[0]


def pytest_collection_modifyitems(config, items):
    import os

    skip = None
    if _in_xdist_worker(config) and not os.environ.get("DDPTOP_TEST_PIDNS"):
        skip = pytest.mark.skip(reason="own_pids: under -n this test needs its worker's own PID namespace, which "
                                       "`unshare --pid` refused here; run `python3 -m pytest -m own_pids` (no -n)")
    for item in items:
        tier = _tier(Path(item.path))
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
        if skip is not None and item.get_closest_marker("own_pids"):
            item.add_marker(skip)
    if _in_xdist_worker(config):
        # a test that measures a process's share of the CPU needs the cores without other workers'
        # jobs on them: left to the pass of its own that follows (`pytest -m serial`, no -n)
        serial = [item for item in items if item.get_closest_marker("serial")]
        if serial:
            config.hook.pytest_deselected(items=serial)
            items[:] = [item for item in items if not item.get_closest_marker("serial")]


# -- pytest -n: each worker in a PID namespace of its own ---------------------------------------------
# Tests that look for torchrun processes (`ddptop attach` with no target, the doctor's CPU budget) must
# find their own job only, never another worker's. Each xdist worker runs as the child of a small init
# (tests/support/pidns_init.py) in a PID namespace of its own, with its own /proc: it sees its tests' processes
# only, and whatever its tests leave running dies with it. Tests run one at a time in a worker, so a
# test sees its own jobs. Where namespaces are refused (not root, no unshare), the `own_pids` tests are
# skipped under -n, saying how to run them.
_PIDNS = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
_pidns_ok: bool | None = None


def _may_make_pid_namespaces() -> bool:
    global _pidns_ok
    if _pidns_ok is None:
        import shutil

        try:
            _pidns_ok = bool(shutil.which("unshare")) and subprocess.run(
                [*_PIDNS, "true"], capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            _pidns_ok = False
    return _pidns_ok


def _in_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    import os

    if not _in_xdist_worker(config):
        _compile_once()
    if getattr(config.option, "maxschedchunk", "absent") is None:
        # -n N hands the tests out one at a time (xdist's load scheduling sends each worker a first chunk
        # of a quarter of its share: consecutive tests, so one worker got the framework, GPU-form and
        # GPU-wait files, over 550 s of them, while the others had finished at 380 s)
        config.option.maxschedchunk = 1
    tx = getattr(config.option, "tx", None) or []
    if _in_xdist_worker(config) or not tx or any(spec != "popen" for spec in tx):
        return  # not pytest -n N (or a hand-made --tx: left as it is)
    if _may_make_pid_namespaces():
        init = SUPPORT / "pidns_init.py"
        os.environ["DDPTOP_TEST_PIDNS"] = "1"  # the workers inherit it: they are in their own
        config.option.tx = [f"popen//python={' '.join(_PIDNS)} {sys.executable} {init} {sys.executable}"] * len(tx)
        config._ddptop_pidns = True


def _compile_once() -> None:
    """Byte-compile ddptop and the examples once, before any test: the suite starts hundreds of ddptop
    processes (the CLI, supervisors, agents, `diagnose`), and where PYTHONDONTWRITEBYTECODE is set none of
    them may keep what it compiled, so each would compile every module it imports again (about 0.3 s of
    CPU each on 2 cores)."""
    import compileall

    for d in ("ddptop", "examples"):
        compileall.compile_dir(str(ROOT / d), quiet=2, workers=1)


def pytest_report_header(config):
    tx = getattr(config.option, "tx", None) or []
    if tx and not _in_xdist_worker(config):
        how = ("each in a PID namespace of its own" if getattr(config, "_ddptop_pidns", False) else
               "without PID namespaces (refused here): the own_pids tests are skipped")
        return (f"xdist workers: {len(tx)}, {how}; the serial tests are left out "
                "(then: python3 -m pytest -q -m serial)")
    return None
