"""Architecture rules: the core never pulls in the UI stack or torch."""

import subprocess
import sys

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
        "assert 'ddptop.core.attach_pid' in names, names\n"
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
