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
