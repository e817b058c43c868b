"""Python-only stack reads on a real GPU stack, and reads that come back without frames.

``py-spy dump --nonblocking`` reads a rank without stopping it, and so races it:
on a real H200 machine (Python 3.12.3, py-spy 0.4.3, torch 2.11 + CUDA 13) it
answered with the main thread and no frames at all (tests/data/h200/README.md
says when).  ddptop must not judge such an answer as a stack: it reads again,
then paused (for the milliseconds a Python-only read takes), and a rank whose
non-blocking reads keep coming back empty is read paused from then on.

py-spy here reads this machine's ranks fine, so the frameless answer comes from
a stand-in py-spy that replays the recorded dumps: frameless when asked for
``--nonblocking``, a real paused dump otherwise.  It logs every call.  The last
test reads a real native dump of the H200 machine.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from ddptop.core.analysis.stack_verdict import parse_dump, rank_state
from ddptop.core.sources import stack_pyspy
from ddptop.core.sources.stack_pyspy import dump_stacks, has_frames, python_dump

DATA = Path(__file__).resolve().parents[1] / "data"
FRAMELESS = sorted((DATA / "h200").glob("*.nonblocking.*.txt"))
PAUSED = DATA / "stacks" / "cuda_spin_sync.r0.1.txt"  # a real dump of a rank at its sync (stand-in CUDA runtime)


def fake_py_spy(tmp_path: Path, frameless: Path, paused: Path) -> tuple[Path, Path]:
    log = tmp_path / "calls.log"
    exe = tmp_path / "py-spy"
    exe.write_text(f"""#!{sys.executable}
import sys
open({str(log)!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
print(open({str(frameless)!r} if "--nonblocking" in sys.argv else {str(paused)!r}).read(), end="")
""")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe, log


@pytest.fixture(autouse=True)
def _forget_paused_reads():
    stack_pyspy._PAUSED_READS.clear()
    yield
    stack_pyspy._PAUSED_READS.clear()


def test_the_recorded_frameless_dumps_have_no_frames_and_the_paused_ones_do():
    assert len(FRAMELESS) >= 2
    for f in FRAMELESS:
        text = f.read_text()
        assert text.startswith("Process ") and "Thread " in text  # a whole answer, not an error
        assert not has_frames(text), f
    assert has_frames(PAUSED.read_text())
    for f in (DATA / "stacks").glob("*.txt"):  # every dump recorded here has frames
        assert has_frames(f.read_text()), f


@pytest.mark.parametrize("frameless", FRAMELESS, ids=lambda p: p.name)
def test_a_frameless_nonblocking_read_is_retried_then_read_paused_and_that_rank_stays_paused(tmp_path, frameless):
    exe, log = fake_py_spy(tmp_path, frameless, PAUSED)
    r = python_dump(str(exe), 4242, timeout=10)
    assert r.returncode == 0 and has_frames(r.stdout) and "cudaStreamSynchronize" in r.stdout
    assert r.args[-1] == "paused"
    calls = log.read_text().splitlines()
    assert [("--nonblocking" in c) for c in calls] == [True, True, False], calls
    assert all(c.endswith("--pid 4242") for c in calls)
    # the next read of that rank goes straight to a paused one; another rank still tries non-blocking first
    python_dump(str(exe), 4242, timeout=10)
    python_dump(str(exe), 4343, timeout=10)
    calls = log.read_text().splitlines()[3:]
    assert [("--nonblocking" in c) for c in calls] == [False, True, True, False], calls


def test_a_nonblocking_read_with_frames_is_taken_as_it_is(tmp_path):
    exe, log = fake_py_spy(tmp_path, PAUSED, PAUSED)  # both forms answer with frames
    r = python_dump(str(exe), 4242, timeout=10, with_locals=True)
    assert has_frames(r.stdout) and r.args[-1] != "paused"
    assert log.read_text().splitlines() == ["dump --nonblocking --full-filenames --locals --pid 4242"]


def test_the_stall_sampler_groups_the_paused_read_not_an_empty_stack(tmp_path, monkeypatch):
    exe, _ = fake_py_spy(tmp_path, FRAMELESS[0], PAUSED)
    monkeypatch.setenv("DDPTOP_PY_SPY", str(exe))
    raw, groups, err = dump_stacks({0: 4242, 1: 4343})
    assert err is None and set(raw) == {0, 1}
    assert all(has_frames(d) for d in raw.values())
    assert len(groups) == 1 and groups[0].ranks == (0, 1) and "cudaStreamSynchronize" in groups[0].stack


def test_a_real_h200_native_dump_of_a_rank_at_item_reads_as_a_gpu_wait_at_its_line():
    """The driver's own frames (libcuda.so.580, mostly unnamed), the CUDA runtime of CUDA 13
    (libcudart.so.13) and torch's cu13 wheel: a wait on the GPU at the script's line, through the runtime."""
    st = rank_state(parse_dump((DATA / "h200" / "cuda_spin_item.native.txt").read_text()))
    assert st.kind == "gpu-wait" and st.gpu == "cuda-runtime", st
    assert st.native.startswith("cudaStreamSynchronize (libcudart.so.13)"), st.native
    assert st.user is not None and (st.user.file, st.user.line) == ("<string>", 5)
    # the same rank read Python-only: its line, running (a CPU-side spin), no claim about the GPU
    py = rank_state(parse_dump((DATA / "h200" / "cuda_spin_item.nonblocking.txt").read_text()))
    assert py.user == st.user and py.kind != "gpu-wait" and py.state == "active", py


@pytest.mark.parametrize("name, native, state, where", [
    # a kernel launch that waits: the first launch of torch's add kernel behind 20 queued seconds of
    # `torch.cuda._sleep`, under lazy module loading: cuLaunchKernel sat there until the sleeps ended
    ("launch_behind_sleeps", "cudaLaunchKernel (libcudart.so.13)", "active", ("child.py", 37)),
    # asleep on a blocking event (cudaEventBlockingSync): libc's wait under the driver, the thread idle
    ("cuda_event_sync", "cudaEventSynchronize (libcudart.so.13)", "idle", ("cuda_sync_rank.py", 45)),
    # spinning at `x.item()`
    ("cuda_spin_item", "cudaStreamSynchronize (libcudart.so.13)", "active", ("cuda_sync_rank.py", 49)),
])
def test_real_h100_native_dumps_read_as_gpu_waits_at_the_scripts_line(name, native, state, where):
    """Recorded on an H100 (tests/data/h100/README.md): three ways a rank waits on its GPU, each read as a
    wait on the GPU at the script's own line, through the CUDA runtime, whatever the thread's state."""
    st = rank_state(parse_dump((DATA / "h100" / f"{name}.native.txt").read_text()))
    assert st.kind == "gpu-wait" and st.gpu == "cuda-runtime", st
    assert st.native.startswith(native), st.native
    assert st.state == state, st
    assert st.user is not None and (Path(st.user.file).name, st.user.line) == where, st.user


def test_a_python_only_read_of_the_launch_blocked_rank_shows_it_running_at_its_line():
    """Without native frames the blocked launch looks like a rank running at its line (the driver spins):
    why ddptop reads a rank's native frames (or NVML) before it calls a busy rank the odd one out."""
    py = rank_state(parse_dump((DATA / "h100" / "launch_behind_sleeps.nonblocking.txt").read_text()))
    assert py.kind != "gpu-wait" and py.state == "active", py
    assert py.user is not None and (Path(py.user.file).name, py.user.line) == ("child.py", 37), py.user


def test_diagnose_of_a_saved_launch_wait_dump_names_eager_loading_and_of_a_sync_wait_does_not():
    """`ddptop diagnose` on the H100 dumps: a rank held in a kernel launch gets the launch sentence and the
    eager-load profile (text and JSON); a rank waiting at a sync gets neither."""
    from ddptop.core.tools.diagnose import stacks_report

    rep = stacks_report([str(DATA / "h100" / "launch_behind_sleeps.native.txt")])
    assert rep is not None and rep.to_dict()["suggested_profiles"] == ["eager-load"]
    text = "\n".join(rep.lines())
    # (one sample: a launch that waits and one caught on its way look alike, so the advice is conditional)
    assert "waits inside a kernel launch" in text and "if a second dump" in text and "--profile eager-load" in text
    sync = stacks_report([str(DATA / "h100" / "cuda_spin_item.native.txt")])
    assert sync is not None and sync.to_dict()["suggested_profiles"] == []
    assert "kernel launch" not in "\n".join(sync.lines())
