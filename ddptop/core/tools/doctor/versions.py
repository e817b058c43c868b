"""Driver, CUDA, torch and NCCL versions, and whether they fit together:
:class:`Packages` (torch, the CUDA it was built for and NCCL, read from package
metadata without importing torch; :func:`probe_torch` asks a subprocess when
the metadata cannot say), :func:`check_versions` (torch's CUDA against what the
driver supports), and the version-string helpers the known-problems database
also uses.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

from ddptop.core.model.gpu_facts import Topology
from ddptop.core.model.version_numbers import version_cmp, version_tuple
from ddptop.core.tools.doctor.report import FAIL, OK, SKIPPED, WARN, Row

__all__ = ["version_cmp", "version_tuple"]


@dataclass
class Packages:
    """torch, its CUDA and NCCL, as the installed packages say."""

    python: str = sys.executable
    torch: str | None = None  # "2.4.0+cu121"
    torch_cuda: str | None = None  # "12.1", "cpu", or None when unknown
    nccl: str | None = None  # "2.21.5"
    nccl_from: str = ""  # where the NCCL version was read
    torch_cuda_from: str = ""
    note: str = ""


def _dist_version(name: str, metadata) -> str | None:
    try:
        return metadata.version(name)
    except (ImportError, OSError, ValueError):  # PackageNotFoundError (an ImportError), or unreadable metadata
        return None


def read_packages(metadata=None, probe: Callable[[], dict] | None = None) -> Packages:
    """Versions from package metadata, without importing torch.  ``probe`` (a
    subprocess importing torch) is asked only when torch is installed and the
    metadata cannot tell its CUDA or NCCL version."""
    if metadata is None:
        import importlib.metadata as metadata
    p = Packages()
    p.torch = _dist_version("torch", metadata)
    if p.torch:
        local = p.torch.partition("+")[2]
        m = re.fullmatch(r"cu(\d+)(\d)", local)
        if m:
            p.torch_cuda, p.torch_cuda_from = f"{m.group(1)}.{m.group(2)}", f"torch version suffix +{local}"
        elif local == "cpu" or local.startswith("rocm"):
            p.torch_cuda, p.torch_cuda_from = ("cpu" if local == "cpu" else local), f"torch version suffix +{local}"
    try:
        requires = (metadata.distribution("torch").requires or []) if p.torch else []
    except (ImportError, OSError, ValueError):  # as in _dist_version
        requires = []
    for req in requires:
        m = re.match(r"\s*(nvidia-cuda-runtime-cu\d+)\s*==\s*([\d.]+)", req)
        if m and p.torch_cuda is None:
            v = version_tuple(m.group(2)) or (0,)
            p.torch_cuda, p.torch_cuda_from = ".".join(map(str, v[:2])), f"torch requires {m.group(1)}=={m.group(2)}"
    for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        v = _dist_version(name, metadata)
        if v:
            p.nccl, p.nccl_from = v, f"package {name}"
            break
    if p.nccl is None:
        for req in requires:
            m = re.match(r"\s*(nvidia-nccl-cu\d+)\s*==\s*([\d.]+)", req)
            if m:
                p.nccl, p.nccl_from = m.group(2), f"torch requires {m.group(1)}=={m.group(2)}"
    if p.torch and p.torch_cuda != "cpu" and (p.torch_cuda is None or p.nccl is None) and probe is not None:
        got = probe()
        if got.get("error"):
            p.note = got["error"]
        if p.torch_cuda is None and "cuda" in got:
            p.torch_cuda, p.torch_cuda_from = got["cuda"] or "cpu", "torch.version.cuda (subprocess)"
        if p.nccl is None and got.get("nccl"):
            p.nccl, p.nccl_from = got["nccl"], "torch.cuda.nccl.version() (subprocess)"
    return p


_PROBE = ("import json, torch\n"
          "n = None\n"
          "try:\n"
          "    v = torch.cuda.nccl.version(); n = '.'.join(map(str, v)) if isinstance(v, tuple) else str(v)\n"
          "except Exception: pass\n"
          "print(json.dumps({'cuda': torch.version.cuda, 'nccl': n}))\n")


def probe_torch(python: str = sys.executable, timeout: float = 30) -> dict:
    """torch.version.cuda and NCCL's version from a subprocess (torch never enters this process)."""
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"`import torch` did not finish in {timeout:.0f} s"}
    except OSError as e:
        return {"error": f"could not run {python}: {e}"}
    if r.returncode != 0:
        return {"error": f"`import torch` failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}"}
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "unreadable answer from the torch probe"}


def check_versions(topo: Topology | None, error: str | None, pk: Packages, n_gpus: int | None = None) -> Row:
    ev = [f"python: {pk.python}"]
    if not pk.torch:
        ev.append("torch: not installed in this Python")
    elif pk.torch_cuda == "cpu":
        ev.append(f"torch {pk.torch}: CPU-only build ({pk.torch_cuda_from})")
    elif pk.torch_cuda:
        ev.append(f"torch {pk.torch}: built for CUDA {pk.torch_cuda} ({pk.torch_cuda_from})")
    else:
        ev.append(f"torch {pk.torch}: CUDA version unknown")
    ev.append(f"NCCL {pk.nccl} ({pk.nccl_from})" if pk.nccl else "NCCL: no nvidia-nccl-cu* package and no pin in torch's metadata")
    if pk.note:
        ev.append(pk.note)
    data = {"driver": topo.driver if topo else None, "cuda_driver": topo.cuda_driver if topo else None,
            "torch": pk.torch, "torch_cuda": pk.torch_cuda, "nccl": pk.nccl}
    soft = f"torch {pk.torch or 'not installed'}" + (
        " (CPU-only)" if pk.torch_cuda == "cpu" else f" (CUDA {pk.torch_cuda})" if pk.torch_cuda else "") + (
        f", NCCL {pk.nccl}" if pk.nccl else "")
    if topo is None:
        return Row("Driver / CUDA / NCCL", SKIPPED, f"{error or 'no NVIDIA driver'}: driver fit not checked; {soft}",
                   ev, "", data)
    ev.insert(0, f"driver {topo.driver or '?'}, supports CUDA {topo.cuda_driver or '?'} (NVML)")
    summ = f"driver {topo.driver or '?'} (CUDA {topo.cuda_driver or '?'}), {soft}"
    n = len(topo.gpus) if n_gpus is None else n_gpus
    if not pk.torch:
        return Row("Driver / CUDA / NCCL", SKIPPED, summ, ev, f"torch is not installed in {pk.python}: run doctor "
                   "with the Python your job uses (python -m ddptop doctor)", data)
    if pk.torch_cuda == "cpu" and n:
        return Row("Driver / CUDA / NCCL", WARN, summ, ev, f"this torch is a CPU-only build and cannot use the {n} GPU(s); "
                   "install a CUDA build (pip install torch --index-url https://download.pytorch.org/whl/cuXYZ)", data)
    t, d = version_tuple(pk.torch_cuda if pk.torch_cuda != "cpu" else None), version_tuple(topo.cuda_driver)
    if t and d:
        if t[0] > d[0]:
            return Row("Driver / CUDA / NCCL", FAIL, summ, ev,
                       f"torch is built for CUDA {pk.torch_cuda} but driver {topo.driver} supports CUDA up to "
                       f"{topo.cuda_driver}: CUDA will not initialise; update the driver or install a torch built for "
                       f"CUDA {d[0]}.x", data)
        if version_cmp(t, d) > 0:
            return Row("Driver / CUDA / NCCL", WARN, summ, ev,
                       f"torch is built for CUDA {pk.torch_cuda}, newer than the driver's {topo.cuda_driver}: it runs under "
                       "CUDA minor-version compatibility, but PTX JIT and newer features need a newer driver; "
                       "update the driver or use a torch built for the driver's CUDA", data)
        return Row("Driver / CUDA / NCCL", OK, summ, ev, "", data)
    return Row("Driver / CUDA / NCCL", OK, summ + " (torch's CUDA version unknown: fit not checked)", ev, "", data)
