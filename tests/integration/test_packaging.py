"""A wheel built from this tree holds everything a pip-installed ddptop needs:
every module (the package list in pyproject.toml is explicit, so a new
subpackage left out of it fails here), the step hook, the known-problem list
and the themes from the top-level themes/ folder."""

import shutil
import subprocess
import sys
import zipfile

from conftest import ROOT


def source_tree(dst):
    """The tree as it is (untracked files too), without what earlier builds left in it: setuptools builds in
    the source tree, and a stale build/lib would put into the wheel what the tree no longer ships."""
    def ignored(folder, names):
        top = folder == str(ROOT)
        return [n for n in names if n == "__pycache__" or top and (n.startswith(".") or n in ("build", "dist")
                                                                  or n.endswith(".egg-info"))]
    shutil.copytree(ROOT, dst, ignore=ignored)
    return dst


def pip_wheel(src, out, *options) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *options, "-w", str(out),
                           str(src)], timeout=300, capture_output=True, text=True)


def test_the_wheel_ships_every_module_the_hook_and_the_data(tmp_path):
    src = source_tree(tmp_path / "src")
    # built with this environment's setuptools where it has what pyproject.toml's [build-system] requires (pip
    # checks it), else as pip builds by default, in a fresh build environment (a venv and a setuptools
    # install: ~25 s more)
    r = pip_wheel(src, tmp_path, "--no-build-isolation", "--check-build-dependencies")
    if r.returncode != 0:
        r = pip_wheel(src, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    wheel = next(tmp_path.glob("ddptop-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ddptop").rglob("*")
            if p.is_file() and p.suffix in (".py", ".toml") and "__pycache__" not in p.parts}
    want |= {f"ddptop/themes/{p.name}" for p in (ROOT / "themes").glob("*.toml")}
    assert "ddptop/_inject/sitecustomize.py" in want and "ddptop/data/known_problems.toml" in want
    assert any(n.startswith("ddptop/themes/") for n in want)
    missing = sorted(want - names)
    assert not missing, f"not in {wheel.name}: {missing}"
