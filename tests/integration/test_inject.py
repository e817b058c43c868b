"""The step hook injected into ranks, and ddptop.beat()."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, json_events, run_ddptop


def progress(events, rank, source=None):
    """Optimizer steps (hook or beat), or with ``source="batch"`` the DataLoader batches drawn."""
    return [e["step"] for e in events if e["kind"] == "progress" and e["rank"] == rank
            and (e["source"] == source if source else e["source"] != "batch")]


# (the hook counting a healthy job's steps and batches: test_launch_e2e.py, on its run; --no-inject turning it
# off: test_detection_e2e.py, on a hang whose steps ddptop learns from the log lines alone)


def test_existing_sitecustomize_still_runs_and_a_broken_hook_never_breaks_the_script(runs_dir, tmp_path):
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import os, torch\n"
        "import torch.optim.optimizer as o\n"
        "print('user sitecustomize ran:', os.environ.get('USER_SITECUSTOMIZE_RAN'))\n"
        "m = torch.nn.Linear(2, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(3):\n"
        "    m(torch.ones(1, 2)).sum().backward(); opt.step()\n"
        "print('done')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(user_site))
    r = run_ddptop("--json", "torchrun", "--nproc-per-node", "1", str(script), env=env)
    assert r.returncode == 0, r.stdout[-2000:]
    events = json_events(r.stdout)
    texts = [e["text"] for e in events if e["kind"] == "log" and e["rank"] == 0]
    assert "user sitecustomize ran: 1" in texts and "done" in texts
    assert progress(events, 0)[-1] == 3
    # a beat directory that cannot be written: the hook disables itself, the script runs on
    r2 = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                        env=dict(env, PYTHONPATH=f"{ROOT / 'ddptop' / '_inject'}{os.pathsep}{user_site}",
                                 DDPTOP_BEAT_DIR=str(tmp_path / "missing" / "dir"), RANK="0"))
    assert r2.returncode == 0 and "done" in r2.stdout and "user sitecustomize ran: 1" in r2.stdout


def test_beat_is_a_no_op_outside_ddptop_and_writes_inside(tmp_path):
    code = "import ddptop; [ddptop.beat(i) for i in range(5)]; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={k: v for k, v in os.environ.items() if k != "DDPTOP_BEAT_DIR"})
    assert r.stdout.strip() == "ok"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env=dict(os.environ, DDPTOP_BEAT_DIR=str(tmp_path), RANK="3"))
    assert r.stdout.strip() == "ok"
    step, t = (tmp_path / "beat.3").read_text().split()
    assert int(step) == 4 and float(t) > 0


def test_beat_does_not_import_torch_or_anything_heavy():
    r = subprocess.run([sys.executable, "-c", "import sys, ddptop; ddptop.beat(1); print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch','textual','rich','psutil')))"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.stdout.strip() == "[]"


def batch_phases(script) -> tuple[list[str], list[str]]:
    """The phases the batch hook published for a 1-rank run of ``script``: each change once, and all."""
    r = run_ddptop("--json", "torchrun", "--nproc-per-node", "1", str(script))
    assert r.returncode == 0, r.stdout[-2000:]
    phases = [e["phase"] for e in json_events(r.stdout) if e["kind"] == "progress" and e["source"] == "batch"]
    return [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]], phases


@pytest.mark.parametrize("script_text", [
    # eval() starts an evaluation; Lightning ends it by setting ``.training`` on every module (no train()
    # call): the next batch drawn still says train
    pytest.param(
        "import time, torch\n"
        "from torch.utils.data import DataLoader\n"
        "m = torch.nn.Linear(2, 1)\n"
        "def draw(n):\n"
        "    for _ in DataLoader(list(range(n)), batch_size=1):\n"
        "        time.sleep(0.06)\n"
        "m.train(); draw(3)\n"
        "m.eval(); draw(3)\n"
        "print('evaluated', flush=True)\n"
        "for mod in m.modules():\n"
        "    mod.training = True\n"
        "draw(3)\n"
        "print('done')\n",
        id="a-framework-sets-every-modules-flag-directly"),
    # Lightning calls eval() on the DDP wrapper and, after the validation, restores ``.training`` on the
    # wrapped module's modules only: the wrapper's own flag stays False, training goes on
    pytest.param(
        "import time, torch, torch.distributed as dist\n"
        "from torch.utils.data import DataLoader\n"
        "dist.init_process_group('gloo')\n"
        "inner = torch.nn.Linear(2, 1)\n"
        "m = torch.nn.parallel.DistributedDataParallel(inner)\n"
        "def draw(n):\n"
        "    for _ in DataLoader(list(range(n)), batch_size=1):\n"
        "        time.sleep(0.06)\n"
        "m.train(); draw(3)\n"
        "m.eval(); draw(3)\n"
        "print('evaluated', flush=True)\n"
        "for mod in inner.modules():\n"
        "    mod.training = True\n"
        "assert not m.training\n"
        "draw(3)\n"
        "print('done')\n",
        id="only-the-wrapped-models-flags-are-restored"),
])
def test_the_phase_follows_the_models_mode_when_a_framework_sets_its_flags(runs_dir, tmp_path, script_text):
    """eval() starts an evaluation and a framework ends it by setting ``.training`` itself (no train()
    call): the next batch drawn still says train."""
    script = tmp_path / "train.py"
    script.write_text(script_text)
    collapsed, phases = batch_phases(script)
    assert collapsed == ["train", "eval", "train"], phases
