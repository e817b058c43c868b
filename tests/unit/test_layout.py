"""The house: one name per module, imports at the top, every room drawn in docs/architecture.md."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from conftest import ROOT

PKG = ROOT / "ddptop"
# modules whose own-package imports stay inside functions, each for a measured reason (docs/performance.md)
LAZY = {
    "ddptop/cli.py": "`ddptop --help` imports neither the UI nor the sessions (0.06 s, not 0.6 s; "
                     "tests/integration/test_boundaries.py)",
    "ddptop/_inject/sitecustomize.py": "runs inside the ranks, before and beside the user's code (a hook must never "
                                       "fail their import)",
    "ddptop/_inject/bench_worker.py": "runs inside the ranks, as sitecustomize",
    "ddptop/core/sessions/factory.py": "opens a kind of session when one is asked for: reading a run (a replay, the "
                                       "TUI's first frame) does not load the pid, ssh, cluster and pod sessions",
    "ddptop/core/run/run_session.py": "a reader of a run never launches: the launcher and the profiles load for "
                                      "a launch or a relaunch",
    "ddptop/ui/commands.py": "the screens a key opens (dialogs, stacks, doctor, bench) and the profiles load when "
                             "first opened, after the first frame",
    "ddptop/ui/app.py": "the full screen (screen_body.py: Textual's tables, tabs, RichLog and footer) loads after the "
                        "first frame is painted (first_frame.py)",
    "ddptop/core/analysis/wording.py": "the native frames' reader (its patterns) loads when a stack is worded, not "
                                       "for the TUI's first frame",
}


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_two_modules_or_packages_share_a_name():
    seen: dict[str, list[str]] = defaultdict(list)
    for p in _modules():
        rel = p.relative_to(ROOT)
        if p.name in ("__init__.py", "__main__.py"):
            continue
        seen[p.stem].append(str(rel))
    for d in PKG.rglob("*"):
        if d.is_dir() and (d / "__init__.py").is_file():
            seen[d.name].append(str(d.relative_to(ROOT)) + "/")
    seen["themes"].append("themes/ (ddptop.themes)")  # the data packages, shipped as ddptop.themes and ddptop.data
    seen["data"].append("ddptop/data/")
    twice = {name: where for name, where in seen.items() if len(where) > 1}
    assert not twice, f"names used twice: {twice}"


def test_own_imports_sit_at_the_top_of_each_module():
    assert all((ROOT / rel).is_file() and why for rel, why in LAZY.items()), "a LAZY module gone, or without a reason"
    inside = []
    for p in _modules():
        rel = str(p.relative_to(ROOT))
        if rel in LAZY:
            continue
        tree = ast.parse(p.read_text(), rel)
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if id(node) in top or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(n == "ddptop" or n.startswith("ddptop.") for n in names):
                inside.append(f"{rel}:{node.lineno}")
    assert not inside, f"imports of ddptop's own modules inside functions or blocks: {inside}"


def test_no_private_name_is_imported_from_another_module():
    private = []
    for p in _modules():
        rel = str(p.relative_to(ROOT))
        for node in ast.walk(ast.parse(p.read_text(), rel)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddptop"):
                private += [f"{rel}:{node.lineno} {a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, private


def test_every_room_is_drawn_in_the_architecture_page():
    page = (ROOT / "docs" / "architecture.md").read_text()
    rooms = sorted(d for d in (PKG / "core").iterdir() if (d / "__init__.py").is_file())
    assert len(rooms) >= 6
    missing = [f"{room.name}/{p.name}" for room in rooms for p in sorted(room.rglob("*.py"))
               if p.name != "__init__.py" and p.name not in page]
    assert not missing, f"modules the architecture page does not name: {missing}"


def test_a_file_over_500_lines_says_in_its_first_lines_why_it_is_one_idea():
    long = []
    for p in _modules():
        text = p.read_text()
        if text.count("\n") > 500 and "over 500 lines" not in "\n".join(text.splitlines()[:60]):
            long.append(f"{p.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert not long, f"split these along their seams, or say why each is one idea: {long}"


def test_every_ddptop_import_in_the_tests_names_a_module_and_a_name_that_exist():
    """The tests that skip on this machine (tests/gpu: no GPU) never import what they name here, so a
    module moved or renamed would only break them on a GPU machine: each ``from ddptop... import x`` and
    ``import ddptop...`` in any test is checked against the package's files, by reading, not importing."""
    import importlib.util

    def module_file(name: str) -> Path | None:
        spec = importlib.util.find_spec(name)
        return Path(spec.origin) if spec is not None and spec.origin else None

    def defines(path: Path, name: str) -> bool:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return True
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return True
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                    return True
        return False

    bad = []
    for f in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            where = f"{f.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                bad += [f"{where} {a.name}" for a in node.names
                        if a.name.startswith("ddptop") and module_file(a.name) is None]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddptop"):
                src = module_file(node.module)
                if src is None:
                    bad.append(f"{where} {node.module}")
                    continue
                for a in node.names:
                    if not defines(src, a.name) and module_file(f"{node.module}.{a.name}") is None:
                        bad.append(f"{where} {node.module}.{a.name}")
    assert not bad, "imports of names ddptop does not have:\n" + "\n".join(bad)
