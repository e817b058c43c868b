"""Architecture rules: the core never pulls in the UI stack or torch."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=True,
    ).stdout
    return {m.split(".")[0] for m in out.split()}


def test_core_modules_import_neither_textual_nor_rich_nor_torch():
    code = (
        "import importlib, pkgutil, ddptop.core as core\n"
        "names = [m.name for m in pkgutil.walk_packages(core.__path__, 'ddptop.core.')]\n"
        "assert len(names) >= 8, names\n"
        "assert 'ddptop.core.sessions.pid' in names, names\n"
        "[importlib.import_module(n) for n in names]\n"
    )
    mods = _modules_after(code)
    assert "ddptop" in mods
    assert not mods & {"textual", "rich", "torch"}, mods & {"textual", "rich", "torch"}


def test_cli_help_does_not_import_the_ui():
    mods = _modules_after(
        "import io, contextlib, ddptop.cli as c\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: c.main(['--help'])\n"
        "    except SystemExit: pass\n"
    )
    assert not mods & {"textual", "rich", "torch", "pynvml"}


def test_help_lists_the_launch_form():
    r = subprocess.run([sys.executable, "-m", "ddptop", "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0
    assert "torchrun [TORCHRUN OPTIONS] SCRIPT" in r.stdout
    assert "attach [RUN | HOST" in r.stdout


@pytest.mark.parametrize("sub", [["attach"], ["diagnose"], ["doctor"], ["bench"], ["bench", "p2p"], ["fix"],
                                 ["runs"], ["profiles"]])
def test_every_sub_command_answers_help(sub, tmp_path):
    """`ddptop SUB --help` prints that sub-command's usage and exits 0: it is never taken for a path,
    a run, a profile listing or a torchrun command."""
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "ddptop", *sub, "--help"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    assert f"ddptop {sub[0]}" in r.stdout.splitlines()[0] or f"{sub[0]} " in r.stdout.splitlines()[0], r.stdout
    assert r.stdout.lstrip().startswith("usage:"), r.stdout
    assert "error" not in r.stderr


def test_diagnose_refuses_an_unknown_option(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ddptop", "diagnose", "--verbose", str(tmp_path)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "unrecognized arguments: --verbose" in r.stderr


def test_runs_lists_runs_as_text_and_json(tmp_path):
    from conftest import write_run

    home = tmp_path / "ddptop" / "runs"
    home.mkdir(parents=True, mode=0o700)
    write_run(home, events=[], logs={0: "step 1\n"}, exit={"state": "succeeded", "exit_code": 0})
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "ddptop", "runs", "--json"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["state"] == "succeeded"
    empty = subprocess.run([sys.executable, "-m", "ddptop", "runs"], capture_output=True, text=True, timeout=60,
                           cwd=ROOT, env=dict(os.environ, XDG_STATE_HOME=str(tmp_path / "none")))
    assert empty.returncode == 0 and empty.stdout == "" and "no runs in" in empty.stderr


def test_the_agent_streams_a_run_without_the_ui_stack(tmp_path):
    """`ddptop agent` runs on every node of a job: core only, whatever it streams."""
    from conftest import rank_started, write_run

    run = write_run(tmp_path, events=[rank_started(1.0, 0, 11), {"t": 2.0, "kind": "state", "state": "succeeded",
                                                                  "exit_code": 0}],
                    logs={0: "step 1 loss 0.5\n"}, exit={"state": "succeeded", "exit_code": 0})
    # stdin stays open, as ssh keeps it (end of stdin = the client has gone)
    p = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "ddptop", "agent", "--run", str(run)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        p.wait(timeout=60)
        out, err = p.stdout.read(), p.stderr.read()
    finally:
        p.kill()
        p.stdin.close()
    assert p.returncode == 0, err[-2000:]
    assert '"text":"step 1 loss 0.5"' in out and '"kind":"bye"' in out
    imported = {l.split("|")[-1].strip().split(".")[0] for l in err.splitlines() if l.startswith("import time:")}
    assert "ddptop" in imported
    assert not imported & {"textual", "rich", "torch"}, imported & {"textual", "rich", "torch"}
