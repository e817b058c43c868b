"""A wheel built from this tree holds everything a pip-installed ddptop needs:
every module (the package list in pyproject.toml is explicit, so a new
subpackage left out of it fails here), the step hook, the known-problem list
and the themes from the top-level themes/ folder."""

import subprocess
import sys
import zipfile

from conftest import ROOT


def test_the_wheel_ships_every_module_the_hook_and_the_data(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, timeout=300, capture_output=True)
    wheel = next(tmp_path.glob("ddptop-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ddptop").rglob("*")
            if p.is_file() and p.suffix in (".py", ".toml") and "__pycache__" not in p.parts}
    want |= {f"ddptop/themes/{p.name}" for p in (ROOT / "themes").glob("*.toml")}
    assert "ddptop/_inject/sitecustomize.py" in want and "ddptop/data/known_problems.toml" in want
    assert any(n.startswith("ddptop/themes/") for n in want)
    missing = sorted(want - names)
    assert not missing, f"not in {wheel.name}: {missing}"
