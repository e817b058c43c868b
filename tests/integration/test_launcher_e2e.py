"""`ddptop torchrun ...` that cannot start says so before anything starts.

(The launch as planned: tests/unit/test_launcher.py.)"""

import os

from conftest import EXAMPLE, run_ddptop


def test_missing_torchrun_is_a_clear_error_before_anything_starts(tmp_path, runs_dir):
    env = dict(os.environ, PATH=str(tmp_path))  # no torchrun here
    r = run_ddptop("--headless", "torchrun", "--nproc-per-node", "2", EXAMPLE, env=env)
    assert r.returncode == 2
    assert "torchrun: not found on PATH" in r.stderr and "Nothing was started" in r.stderr
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_missing_script_is_a_clear_error_before_anything_starts(runs_dir):
    r = run_ddptop("--headless", "torchrun", "--nproc-per-node", "2", "no_such_train.py")
    assert r.returncode == 2
    assert "no_such_train.py: no such file" in r.stderr
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def test_missing_script_argument(runs_dir):
    r = run_ddptop("--headless", "torchrun", "--nproc-per-node", "2")
    assert r.returncode == 2 and "no training script given" in r.stderr
