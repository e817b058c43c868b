"""`ddptop doctor`: check this machine for the causes behind multi-GPU hangs and crashes.

Each check is a small function that takes plain data (an NVML
:class:`~ddptop.core.gpu.nvml.Topology`, an environment dict, a sysfs root, a
``statvfs`` function...) and returns a :class:`Row`: a name, a status (ok /
warn / fail / skipped), a one-line summary, the evidence (what was read, with
numbers) and what to do.  :func:`run_checks` gathers the facts from the real
machine and calls them all; :func:`exit_code` maps the rows to 0 / 1 / 2.

Core module: no textual, rich, torch or pynvml here.  NVML goes through
:mod:`ddptop.core.gpu.nvml`; torch's and NCCL's versions come from package
metadata (a subprocess importing torch only when the metadata cannot say).
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ddptop.core.gpu.nvml import Topology, switch_links

OK, WARN, FAIL, SKIPPED = "ok", "warn", "fail", "skipped"
GiB = 1024**3
MiB = 1024**2

KNOWN_PROBLEMS = Path(__file__).resolve().parent.parent / "data" / "known_problems.toml"


@dataclass
class Row:
    name: str
    status: str  # ok | warn | fail | skipped
    summary: str  # one line
    evidence: list[str] = field(default_factory=list)  # what was read, with numbers
    advice: str = ""  # what to do ("" when nothing)
    data: dict = field(default_factory=dict)  # machine-readable details for --json

    def to_dict(self) -> dict:
        return asdict(self)


def exit_code(rows: Iterable[Row]) -> int:
    st = {r.status for r in rows}
    return 2 if FAIL in st else 1 if WARN in st else 0


def summary(rows: list[Row]) -> dict:
    out = {s: sum(r.status == s for r in rows) for s in (OK, WARN, FAIL, SKIPPED)}
    out["exit_code"] = exit_code(rows)
    return out


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def _vtuple(v: str | None) -> tuple[int, ...] | None:
    if not v:
        return None
    parts = re.findall(r"\d+", v.split("+")[0])
    return tuple(int(p) for p in parts) if parts else None


def _vcmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


# -- GPUs ------------------------------------------------------------------------


def check_gpus(topo: Topology | None, error: str | None, fault: str | None = None) -> Row:
    if topo is None:
        if fault:  # a driver that is there but broken: no job can use these GPUs
            return Row("GPUs", FAIL, error or "NVML failed", [], fault)
        return Row("GPUs", SKIPPED, error or "no NVIDIA driver")
    if not topo.gpus:
        return Row("GPUs", SKIPPED, "NVML found no GPU", [f"driver {topo.driver or '?'}"])
    ev = [f"GPU {g.index}: {g.name}, compute capability {g.cc or '?'}" + (" (LOST: fell off the bus)" if g.lost else "")
          for g in topo.gpus]
    names = sorted({g.name for g in topo.gpus if not g.lost})
    ccs = sorted({g.cc for g in topo.gpus if g.cc and not g.lost})
    data = {"count": len(topo.gpus), "gpus": [asdict(g) for g in topo.gpus]}
    summ = f"{len(topo.gpus)} GPU(s): " + ", ".join(f"{sum(g.name == n and not g.lost for g in topo.gpus)}x {n}"
                                                   for n in names)
    lost = [g.index for g in topo.gpus if g.lost]
    if lost:
        return Row("GPUs", FAIL, summ + f"; GPU {', '.join(map(str, lost))} lost", ev,
                   "a GPU that fell off the bus needs a reset or a reboot (see `dmesg` for the Xid)", data)
    if len(names) > 1 or len(ccs) > 1:
        first = {}
        for g in topo.gpus:
            first.setdefault(g.name, g.index)
        pin = ",".join(str(g.index) for g in topo.gpus if g.name == topo.gpus[0].name)
        return Row("GPUs", WARN, summ + f" (mixed: {len(names)} models, compute capabilities {', '.join(ccs)})", ev,
                   "mixed GPU models or compute capabilities in one job are a known cause of multi-GPU-only SIGSEGV; "
                   f"pin the job to one model, e.g. CUDA_VISIBLE_DEVICES={pin}", data)
    return Row("GPUs", OK, summ + (f", compute capability {ccs[0]}" if ccs else ""), ev, "", data)


# -- versions ----------------------------------------------------------------------


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
    except Exception:  # PackageNotFoundError, or broken metadata
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
    except Exception:
        requires = []
    for req in requires:
        m = re.match(r"\s*(nvidia-cuda-runtime-cu\d+)\s*==\s*([\d.]+)", req)
        if m and p.torch_cuda is None:
            v = _vtuple(m.group(2)) or (0,)
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
    t, d = _vtuple(pk.torch_cuda if pk.torch_cuda != "cpu" else None), _vtuple(topo.cuda_driver)
    if t and d:
        if t[0] > d[0]:
            return Row("Driver / CUDA / NCCL", FAIL, summ, ev,
                       f"torch is built for CUDA {pk.torch_cuda} but driver {topo.driver} supports CUDA up to "
                       f"{topo.cuda_driver}: CUDA will not initialise; update the driver or install a torch built for "
                       f"CUDA {d[0]}.x", data)
        if _vcmp(t, d) > 0:
            return Row("Driver / CUDA / NCCL", WARN, summ, ev,
                       f"torch is built for CUDA {pk.torch_cuda}, newer than the driver's {topo.cuda_driver}: it runs under "
                       "CUDA minor-version compatibility, but PTX JIT and newer features need a newer driver; "
                       "update the driver or use a torch built for the driver's CUDA", data)
        return Row("Driver / CUDA / NCCL", OK, summ, ev, "", data)
    return Row("Driver / CUDA / NCCL", OK, summ + " (torch's CUDA version unknown: fit not checked)", ev, "", data)


# -- known problems ----------------------------------------------------------------


@dataclass(frozen=True)
class KnownProblem:
    id: str
    symptom: str
    fix: str
    source: str
    driver: str | None = None
    driver_min: str | None = None
    driver_max: str | None = None
    nccl_min: str | None = None
    nccl_max: str | None = None
    gpu_name: str | None = None
    min_gpus: int = 0
    workaround_env: dict = field(default_factory=dict)
    see_also: tuple[str, ...] = ()

    def needs(self) -> set[str]:
        return {k for k in ("driver", "nccl", "gpus") if
                (k == "driver" and (self.driver or self.driver_min or self.driver_max))
                or (k == "nccl" and (self.nccl_min or self.nccl_max))
                or (k == "gpus" and (self.gpu_name or self.min_gpus))}


class KnownProblemsError(ValueError):
    pass


_KP_KEYS = {"id", "symptom", "fix", "source", "driver", "driver_min", "driver_max", "nccl_min", "nccl_max",
            "gpu_name", "min_gpus", "workaround_env", "see_also"}


def load_known_problems(path: Path = KNOWN_PROBLEMS) -> list[KnownProblem]:
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise KnownProblemsError(f"{path}: {e}") from None
    out = []
    for i, e in enumerate(doc.get("problem", [])):
        where = f"{path}: problem #{i + 1} ({e.get('id', 'no id')})"
        unknown = set(e) - _KP_KEYS
        if unknown:
            raise KnownProblemsError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        for k in ("id", "symptom", "fix", "source"):
            if not isinstance(e.get(k), str) or not e[k].strip():
                raise KnownProblemsError(f"{where}: `{k}` is required")
        if not e["source"].startswith("https://"):
            raise KnownProblemsError(f"{where}: `source` must be a public https URL")
        if not ({"driver", "driver_min", "driver_max", "nccl_min", "nccl_max", "gpu_name"} & set(e)):
            raise KnownProblemsError(f"{where}: matches nothing (give driver, nccl_min/max or gpu_name)")
        if e.get("gpu_name"):
            try:
                re.compile(e["gpu_name"])
            except re.error as err:
                raise KnownProblemsError(f"{where}: gpu_name: {err}") from None
        kw = dict(e)
        kw["see_also"] = tuple(kw.get("see_also", ()))
        out.append(KnownProblem(**kw))
    ids = [p.id for p in out]
    if len(ids) != len(set(ids)):
        raise KnownProblemsError(f"{path}: duplicate ids")
    return out


def _in_range(v: str | None, lo: str | None, hi: str | None) -> bool | None:
    """None when the version is unknown."""
    t = _vtuple(v)
    if t is None:
        return None
    if lo and _vcmp(t, _vtuple(lo) or ()) < 0:
        return False
    if hi and _vcmp(t, _vtuple(hi) or ()) >= 0:
        return False
    return True


def match_problem(p: KnownProblem, driver: str | None, nccl: str | None, gpu_names: list[str] | None) -> bool | None:
    """True / False, or None when a fact it needs is unknown."""
    if p.driver is not None or p.driver_min or p.driver_max:
        if driver is None:
            return None
        if p.driver is not None and driver.strip() != p.driver:
            return False
        if (p.driver_min or p.driver_max) and not _in_range(driver, p.driver_min, p.driver_max):
            return False
    if p.nccl_min or p.nccl_max:
        r = _in_range(nccl, p.nccl_min, p.nccl_max)
        if r is None:
            return None
        if not r:
            return False
    if p.gpu_name or p.min_gpus:
        if gpu_names is None:
            return None
        if len(gpu_names) < p.min_gpus:
            return False
        if p.gpu_name and not any(re.search(p.gpu_name, n, re.I) for n in gpu_names):
            return False
    return True


def check_known_problems(problems: list[KnownProblem], topo: Topology | None, error: str | None, nccl: str | None,
                         env: dict[str, str]) -> Row:
    driver = topo.driver if topo else None
    names = [g.name for g in topo.gpus] if topo else None
    facts = f"driver {driver or '?'}, NCCL {nccl or '?'}, {len(names) if names is not None else '?'} GPU(s)"
    hits, unknown, worked = [], 0, []
    for p in problems:
        m = match_problem(p, driver, nccl, names)
        if m is None:
            unknown += 1
        elif m:
            wa = {k: v for k, v in p.workaround_env.items() if env.get(k) == str(v)}
            (worked if wa and wa == {k: str(v) for k, v in p.workaround_env.items()} else hits).append(p)
    data = {"matched": [p.id for p in hits], "worked_around": [p.id for p in worked], "entries": len(problems),
            "not_checkable": unknown}
    ev = []
    for p in hits + worked:
        ev.append(f"{p.id}: {p.symptom}")
        ev.append(f"  source: {p.source}" + (f" (see also {', '.join(p.see_also)})" if p.see_also else ""))
        if p in worked:
            ev.append("  worked around here: " + ", ".join(f"{k}={v}" for k, v in p.workaround_env.items()) + " is set")
    if unknown:
        ev.append(f"{unknown} of {len(problems)} entries need facts this machine cannot give ({facts})")
    if hits:
        return Row("Known problems", WARN, f"{len(hits)} known problem(s) match: {', '.join(p.id for p in hits)}", ev,
                   "; ".join(f"{p.id}: {p.fix}" for p in hits), data)
    if unknown == len(problems):
        why = error or "no GPU facts"
        return Row("Known problems", SKIPPED, f"nothing to match: {why}, NCCL version unknown" if not nccl else
                   f"nothing to match: {why}", ev, "", data)
    summ = f"none of {len(problems)} entries match ({facts})"
    if worked:
        summ = f"{len(worked)} match but are worked around ({', '.join(p.id for p in worked)})"
    return Row("Known problems", OK, summ, ev, "", data)


# -- P2P, PCIe ACS, IOMMU -----------------------------------------------------------


def check_p2p(topo: Topology | None, error: str | None) -> Row:
    if topo is None:
        return Row("GPU P2P", SKIPPED, error or "no NVIDIA driver")
    if len(topo.gpus) < 2:
        return Row("GPU P2P", SKIPPED, f"needs 2 GPUs, found {len(topo.gpus)}")
    ev, bad = [], []
    for p in topo.pairs:
        ev.append(f"GPU {p.a} <-> GPU {p.b}: read {p.read}, write {p.write}, NVLink {p.nvlink}; via {p.ancestor}")
        if p.read != "ok" or p.write != "ok":
            bad.append(p)
    data = {"pairs": [asdict(p) for p in topo.pairs]}
    nvl = sum(p.nvlink == "ok" for p in topo.pairs)
    if bad:
        return Row("GPU P2P", WARN, f"P2P unavailable for {len(bad)} of {len(topo.pairs)} pair(s)", ev,
                   "NCCL falls back to shared memory / host copies for those pairs (slower); a pair reported as "
                   "`chipset`/`IOH topology not supported` often sits behind PCIe ACS or an IOMMU (see below). If a job "
                   "hangs in P2P instead, NCCL_P2P_DISABLE=1 (ddptop --profile p2p-off) confirms it", data)
    return Row("GPU P2P", OK, f"P2P read/write ok for all {len(topo.pairs)} pair(s)" + (f", {nvl} over NVLink" if nvl else ""),
               ev, "", data)


_HW_THROTTLE = {"hw-slowdown", "hw-thermal", "hw-power-brake", "sw-thermal"}


def check_gpu_health(health: dict | None, error: str | None) -> Row:
    """Memory errors that crash jobs on one GPU only (Xid 48, 63, 64, 94, 95 in
    the kernel log) and hardware throttling that makes one rank the straggler."""
    if health is None or (not health and error):
        return Row("GPU health", SKIPPED, error or "no NVIDIA driver")
    if not health:
        return Row("GPU health", SKIPPED, "no GPU")
    na = lambda v: "n/a" if v is None else v  # noqa: E731
    ev, fail, warn = [], [], []
    for i, h in sorted(health.items()):
        if h.lost:
            ev.append(f"GPU {i}: lost (fell off the bus)")
            fail.append(f"GPU {i} is lost")
            continue
        hw = [t for t in h.throttle if t in _HW_THROTTLE]
        ev.append(f"GPU {i} ({h.name}): uncorrected ECC errors {na(h.ecc_uncorrected)}, retired pages {na(h.retired_pages)}"
                  + (" (one pending)" if h.retired_pending else "")
                  + f", rows remapped after uncorrectable errors {na(h.remapped_uncorrectable)}"
                  + (" (one pending)" if h.remap_pending else "") + (" (a remap FAILED)" if h.remap_failure else "")
                  + (f", throttled by {', '.join(hw)}" if hw else ""))
        if h.remap_failure:
            fail.append(f"GPU {i}: a row remap failed")
        if h.remap_pending or h.retired_pending:
            warn.append(f"GPU {i}: a memory {'row remap' if h.remap_pending else 'page retirement'} waits for a reset")
        elif h.ecc_uncorrected:
            warn.append(f"GPU {i}: {h.ecc_uncorrected} uncorrected ECC error(s) since the driver loaded")
        if hw:
            warn.append(f"GPU {i}: throttled by {', '.join(hw)}")
    data = {"gpus": [{k: getattr(h, k) for k in ("index", "ecc_uncorrected", "retired_pages", "retired_pending",
                                                "remapped_uncorrectable", "remap_pending", "remap_failure", "throttle", "lost")}
                     for _, h in sorted(health.items())]}
    if fail:
        return Row("GPU health", FAIL, "; ".join(fail + warn), ev,
                   "take the GPU out of jobs (CUDA_VISIBLE_DEVICES without it) and have it serviced: a lost GPU or a failed "
                   "row remap is a hardware fault, and jobs on it crash (Xid 64/79 in `dmesg`)", data)
    if warn:
        return Row("GPU health", WARN, "; ".join(warn), ev,
                   "memory errors crash jobs on that GPU only (Xid 48/63/94/95 in `dmesg`): drain it and reset it "
                   "(`nvidia-smi -r -i N`) or reboot so the pending remap or retirement takes effect; a throttled GPU "
                   "makes its rank the straggler: check cooling and power (`nvidia-smi -q -d PERFORMANCE`)", data)
    return Row("GPU health", OK, f"{len(health)} GPU(s): no uncorrected memory errors, nothing pending, no hardware throttling",
               ev, "", data)


def check_nvlink(links: dict | None, error: str | None) -> Row:
    """NVLinks per GPU: a GPU with fewer links up than the others of its model
    has a link down (a failed link, a bad cable or bridge, a GPU that needs a
    reset): every collective through it slows down, or hangs."""
    if links is None or (not links and error):
        return Row("NVLink", SKIPPED, error or "no NVIDIA driver")
    if not links:
        return Row("NVLink", SKIPPED, "no GPU")
    with_nvl = {i: f for i, f in sorted(links.items()) if f.nvlink_remotes or f.nvlink_inactive}
    if not with_nvl:
        return Row("NVLink", OK, f"no NVLink on {'this GPU' if len(links) == 1 else f'these {len(links)} GPUs'}: "
                                 "peer traffic goes over PCIe")
    local = {f.bus for f in links.values()}
    to_switches = switch_links(links)
    ev, short = [], []
    by_model: dict[str, int] = {}
    for f in with_nvl.values():
        by_model[f.name] = max(by_model.get(f.name, 0), len(f.nvlink_remotes))
    for i, f in with_nvl.items():
        up = len(f.nvlink_remotes)
        peers = sorted({b for b in f.nvlink_remotes if b in local})
        switched = to_switches[i]
        ev.append(f"GPU {i} ({f.name}): {up} of {up + f.nvlink_inactive} NVLinks up"
                  + (f", {switched} to NVSwitches" if switched else "")
                  + (f", to {', '.join('GPU ' + str(j) for j, g in sorted(links.items()) if g.bus in peers)}" if peers else ""))
        if up < by_model[f.name]:
            short.append((i, f, by_model[f.name]))
    data = {"gpus": [{"index": i, "up": len(f.nvlink_remotes), "down": f.nvlink_inactive, "remotes": list(f.nvlink_remotes)}
                     for i, f in with_nvl.items()]}
    if short:
        return Row("NVLink", WARN, "; ".join(f"GPU {i} has {len(f.nvlink_remotes)} NVLinks up, "
                                             f"other {f.name} GPUs {best}" for i, f, best in short), ev,
                   "a link that is down slows every collective through that GPU and can hang NCCL: check "
                   "`nvidia-smi nvlink --status` and the error counters (`nvidia-smi nvlink -e`); a GPU reset "
                   "(`nvidia-smi -r`) or a reseated bridge/board often brings it back", data)
    total = sum(len(f.nvlink_remotes) for f in with_nvl.values())
    return Row("NVLink", OK, f"{total} NVLinks up on {len(with_nvl)} GPU(s), none down against the others of their model",
               ev, "", data)


def check_fabric(links: dict | None, error: str | None, driver: str | None = None) -> Row:
    """On NVSwitch systems (HGX/DGX) each GPU must be registered with the
    fabric by nvidia-fabricmanager before CUDA will start on it: until then
    every CUDA call fails with error 802, "system not yet initialized"."""
    name = "NVSwitch fabric"
    if links is None or (not links and error):
        return Row(name, SKIPPED, error or "no NVIDIA driver")
    switched = [i for i, n in sorted(switch_links(links).items()) if n]
    reg = {i: f for i, f in sorted(links.items()) if f.fabric}
    fm = ("`systemctl status nvidia-fabricmanager` and its log (/var/log/fabricmanager.log); it must run at the "
          f"driver's exact version{f' ({driver})' if driver else ''}")
    if not reg:
        if switched:
            return Row(name, SKIPPED, f"GPU {', '.join(map(str, switched))} on NVSwitches, but NVML reports no fabric "
                                      "state for them (before Hopper, or an older driver)", [],
                       f"if CUDA fails with error 802 ('system not yet initialized'): {fm}")
        return Row(name, SKIPPED, "no NVSwitch fabric on these GPUs" if links else "no GPU")
    ev = [f"GPU {i} ({f.name}): registration {f.fabric}" + (f", failed: {f.fabric_error}" if f.fabric_error else "")
          + (", NVLink bandwidth degraded" if f.fabric_degraded else "") for i, f in reg.items()]
    data = {"gpus": [{"index": i, "state": f.fabric, "error": f.fabric_error, "degraded": f.fabric_degraded}
                     for i, f in reg.items()]}
    bad = [i for i, f in reg.items() if f.fabric == "not started" or f.fabric_error]
    if bad:
        return Row(name, FAIL, f"GPU {', '.join(map(str, bad))} not registered with the NVSwitch fabric", ev,
                   "CUDA fails on these GPUs with error 802 ('system not yet initialized') until nvidia-fabricmanager "
                   f"registers them: {fm}", data)
    waiting = [i for i, f in reg.items() if f.fabric == "in progress"]
    if waiting:
        return Row(name, WARN, f"GPU {', '.join(map(str, waiting))}: fabric registration in progress", ev,
                   "usual for a minute after boot or a GPU reset, and CUDA fails with error 802 meanwhile; "
                   f"run doctor again, and if it stays: {fm}", data)
    slow = [i for i, f in reg.items() if f.fabric_degraded]
    if slow:
        return Row(name, WARN, f"GPU {', '.join(map(str, slow))}: NVLink bandwidth degraded (fabric health)", ev,
                   "an NVLink or an NVSwitch of the fabric is down, so collectives through these GPUs run slower: "
                   "`nvidia-smi nvlink --status`, the fabric manager log; a reset or a reboot of the node", data)
    return Row(name, OK, f"{len(reg)} GPU(s) registered with the NVSwitch fabric", ev, "", data)


# ACS control register bits (PCIe spec, ACS extended capability, offset 6)
_ACS_BITS = {0: "SV", 1: "TB", 2: "RR", 3: "CR", 4: "UF", 5: "EC", 6: "DT"}
_ACS_CAP_ID = 0x000D


def acs_control(config: bytes) -> int | None:
    """The ACS control register from a device's PCI config space, None without ACS."""
    off, seen = 0x100, set()
    while 0x100 <= off and off + 8 <= len(config) and off not in seen:
        seen.add(off)
        hdr = int.from_bytes(config[off:off + 4], "little")
        if hdr in (0, 0xFFFFFFFF):
            return None
        if hdr & 0xFFFF == _ACS_CAP_ID:
            return int.from_bytes(config[off + 6:off + 8], "little")
        off = (hdr >> 20) & 0xFFC
    return None


def check_acs(root: Path = Path("/"), n_gpus: int = 0, is_root: bool | None = None) -> Row:
    devs = root / "sys/bus/pci/devices"
    if not devs.is_dir():
        return Row("PCIe ACS", SKIPPED, f"{devs} not found (no PCI sysfs here)")
    is_root = (os.geteuid() == 0) if is_root is None else is_root
    bridges, unread, redirect, noacs = [], [], [], 0
    for d in sorted(devs.iterdir()):
        try:
            cls = (d / "class").read_text().strip()
        except OSError:
            continue
        if not cls.lower().startswith("0x0604"):
            continue  # PCI-to-PCI bridges (and PCIe switch / root ports)
        bridges.append(d.name)
        try:
            cfg = (d / "config").read_bytes()
        except OSError:
            unread.append(d.name)
            continue
        if len(cfg) <= 0x100:
            if len(cfg) <= 0x40 or not is_root:
                unread.append(d.name)  # the kernel gives non-root only the first 64 bytes
            else:
                noacs += 1  # no extended config space, so no ACS
            continue
        ctl = acs_control(cfg)
        if ctl is None:
            noacs += 1
        elif ctl & 0b1100:  # P2P request / completion redirect
            redirect.append((d.name, ctl))
    data = {"bridges": len(bridges), "acs_redirect": [b for b, _ in redirect], "unreadable": unread}
    if not bridges:
        return Row("PCIe ACS", OK, "no PCI-to-PCI bridges (class 0x0604): nothing to redirect P2P", [str(devs)], "", data)
    ev = [f"{len(bridges)} PCI bridge(s) under {devs}; {noacs} without ACS"]
    ev += [f"{b}: ACS control 0x{c:04x} ({' '.join(n for bit, n in _ACS_BITS.items() if c >> bit & 1)})"
           for b, c in redirect]
    if unread and len(unread) == len(bridges):
        return Row("PCIe ACS", SKIPPED, f"needs root: the extended config space of {len(bridges)} bridge(s) is "
                   "readable only by root (sudo ddptop doctor, or sudo setpci -s BUS ECAP_ACS+6.w)", ev, "", data)
    if unread:
        ev.append(f"{len(unread)} bridge(s) unreadable (needs root): {', '.join(unread[:8])}")
    if redirect:
        st = WARN if n_gpus >= 2 else OK
        why = "" if st == WARN else f" (matters only for P2P between GPUs; {n_gpus} GPU(s) here)"
        return Row("PCIe ACS", st, f"ACS P2P redirect on {len(redirect)} bridge(s){why}", ev,
                   "ACS redirects GPU peer-to-peer traffic through the root complex: slow P2P or NCCL hangs. Disable it "
                   "on bare metal (BIOS, or `setpci -s BUS ECAP_ACS+6.w=0000` for each bridge, as NCCL's "
                   "troubleshooting guide shows), or run with NCCL_P2P_DISABLE=1" if st == WARN else "", data)
    return Row("PCIe ACS", OK, f"no ACS P2P redirect on {len(bridges) - len(unread)} readable bridge(s)", ev, "", data)


def check_iommu(root: Path = Path("/"), n_gpus: int = 0) -> Row:
    units = sorted(p.name for p in (root / "sys/class/iommu").glob("*")) if (root / "sys/class/iommu").is_dir() else []
    try:
        cmdline = (root / "proc/cmdline").read_text().split()
    except OSError:
        cmdline = []
    opts = [a for a in cmdline if a.split("=")[0] in ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough")]
    types = {}
    groups = root / "sys/kernel/iommu_groups"
    if groups.is_dir():
        for g in groups.iterdir():
            try:
                t = (g / "type").read_text().strip()
            except OSError:
                continue
            types[t] = types.get(t, 0) + 1
    ev = [f"/sys/class/iommu: {', '.join(units) if units else 'no entries'}",
          f"/proc/cmdline IOMMU options: {' '.join(opts) if opts else 'none'}"]
    if types:
        ev.append("IOMMU group types: " + ", ".join(f"{n}x {t}" for t, n in sorted(types.items())))
    data = {"units": units, "cmdline": opts, "group_types": types}
    if not units and not types:
        return Row("IOMMU", OK, "no IOMMU active", ev, "", data)
    translated = sum(n for t, n in types.items() if t.startswith("DMA"))
    passthrough = "iommu=pt" in opts or "iommu.passthrough=1" in opts or (types and not translated)
    if passthrough:
        return Row("IOMMU", OK, f"IOMMU on, passthrough mode ({len(units)} unit(s))", ev, "", data)
    mode = "translated DMA" if translated else "mode unknown"
    st = WARN if n_gpus >= 2 else OK
    return Row("IOMMU", st, f"IOMMU on, {mode} ({len(units)} unit(s))" + ("" if st == WARN else
               f"; matters only for P2P between GPUs ({n_gpus} GPU(s) here)"), ev,
               "IOMMU translation is a classic cause of GPU P2P hangs and slow P2P on bare metal: boot with iommu=pt "
               "(passthrough), or run with NCCL_P2P_DISABLE=1" if st == WARN else "", data)


# -- memory, limits, disk -----------------------------------------------------------


def check_shm(path: str = "/dev/shm", statvfs: Callable = os.statvfs) -> Row:
    try:
        st = statvfs(path)
    except OSError as e:
        return Row("/dev/shm", WARN, f"{path} unreadable: {e.strerror or e}", [f"statvfs({path}): {e}"],
                   "NCCL's SHM transport and DataLoader workers need /dev/shm; mount a tmpfs there "
                   "(docker --shm-size=16g or --ipc=host) or use the shm-off profile")
    total, free = st.f_frsize * st.f_blocks, st.f_frsize * st.f_bavail
    ev = [f"statvfs({path}): {_gib(total)} total, {_gib(free)} free"]
    data = {"total_bytes": total, "free_bytes": free}
    if total < GiB:
        return Row("/dev/shm", WARN, f"{_gib(total)}: too small", ev,
                   "containers default to 64 MB: NCCL's SHM transport and DataLoader workers break (bus error, "
                   "`unhandled system error`); docker --shm-size=16g (or --ipc=host), or ddptop --profile shm-off", data)
    if free < GiB:
        return Row("/dev/shm", WARN, f"{_gib(free)} free of {_gib(total)}", ev,
                   "something fills /dev/shm (leftover segments of crashed jobs?): `ls -la /dev/shm`", data)
    return Row("/dev/shm", OK, f"{_gib(total)} ({_gib(free)} free)", ev, "", data)


def check_memlock(ib_devices: list[str], getrlimit: Callable = resource.getrlimit) -> Row:
    soft, hard = getrlimit(resource.RLIMIT_MEMLOCK)

    def fmt(v):
        return "unlimited" if v == resource.RLIM_INFINITY else f"{v // 1024} KiB"
    ev = [f"RLIMIT_MEMLOCK soft {fmt(soft)}, hard {fmt(hard)}"]
    data = {"soft": None if soft == resource.RLIM_INFINITY else soft, "hard": None if hard == resource.RLIM_INFINITY else hard}
    if soft == resource.RLIM_INFINITY:
        return Row("ulimit -l", OK, "unlimited", ev, "", data)
    if ib_devices:
        return Row("ulimit -l", WARN, f"{fmt(soft)} with InfiniBand present ({', '.join(ib_devices)})", ev,
                   "RDMA pins memory: a small locked-memory limit makes NCCL's IB transport fail to register buffers; "
                   "set `ulimit -l unlimited` (/etc/security/limits.conf memlock, or docker --ulimit memlock=-1)", data)
    return Row("ulimit -l", OK, f"{fmt(soft)} (matters for InfiniBand/RDMA only; none here)", ev, "", data)


def check_disk(path: Path, statvfs: Callable = os.statvfs) -> Row:
    p = Path(path)
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = statvfs(str(probe))
    except OSError as e:
        return Row("Run directory disk", WARN, f"{probe} unreadable: {e}", [], "")
    free = st.f_frsize * st.f_bavail
    ev = [f"runs directory {p}" + ("" if probe == p else f" (not created yet; measured at {probe})"),
          f"statvfs: {_gib(free)} free of {_gib(st.f_frsize * st.f_blocks)}"]
    data = {"path": str(p), "free_bytes": free}
    if free < 100 * MiB:
        return Row("Run directory disk", FAIL, f"{_gib(free)} free", ev,
                   "rank logs and the journal will not fit: free space or point DDPTOP_RUNS_DIR elsewhere", data)
    if free < GiB:
        return Row("Run directory disk", WARN, f"{_gib(free)} free", ev,
                   "a long job's rank logs can fill this; free space or set DDPTOP_RUNS_DIR", data)
    return Row("Run directory disk", OK, f"{_gib(free)} free", ev, "", data)


# -- CPU budget ----------------------------------------------------------------------


@dataclass
class JobWorkers:
    torchrun_pid: int
    ranks: int
    workers_per_rank: int  # the most data-loader (child) processes any rank has


def torchrun_jobs(uid: int | None = None) -> list:
    """This user's running torchrun processes (psutil.Process), newest first."""
    import psutil

    from ddptop.core.attach_pid import torchrun_args

    uid = os.getuid() if uid is None else uid
    out = []
    for p in psutil.process_iter(["cmdline", "uids", "create_time"]):
        try:
            if p.info["uids"] is None or p.info["uids"].real != uid or p.pid == os.getpid():
                continue
            if torchrun_args(p.info["cmdline"] or []) is not None:
                out.append(p)
        except psutil.Error:
            continue
    out.sort(key=lambda p: (p.info.get("create_time") or 0, p.pid), reverse=True)
    return out


def job_workers(proc) -> JobWorkers | None:
    """A torchrun's ranks (its children) and the most child processes (data-loader workers) any rank has."""
    import psutil

    try:
        ranks = proc.children()
    except psutil.Error:
        return None
    per = []
    for r in ranks:
        try:
            per.append(len(r.children(recursive=True)))
        except psutil.Error:
            per.append(0)
    return JobWorkers(proc.pid, len(ranks), max(per, default=0))


def running_job_workers() -> JobWorkers | None:
    jobs = torchrun_jobs()
    return job_workers(jobs[0]) if jobs else None


def check_cpu(cores: int, n_gpus: int, workers: int | None, job: JobWorkers | None = None) -> Row:
    ev = [f"{cores} core(s) usable by this process (os.sched_getaffinity)"]
    src = "--workers"
    if workers is None and job is not None:
        workers, src = job.workers_per_rank, f"torchrun pid {job.torchrun_pid}: {job.ranks} rank(s), up to " \
                                             f"{job.workers_per_rank} child process(es) each"
        n_gpus = job.ranks or n_gpus
    if workers is None:
        return Row("CPU budget", SKIPPED, "no worker count: pass --workers N (data-loader workers per GPU), "
                   "or run doctor while the job runs", ev)
    ev.append(f"workers per GPU: {workers} ({src})")
    if n_gpus <= 0:
        return Row("CPU budget", SKIPPED, "no GPUs (and no running job's ranks) to multiply the workers by", ev)
    need = workers * n_gpus
    ev.append(f"{workers} worker(s) x {n_gpus} GPU(s) = {need} data-loader processes for {cores} core(s)")
    data = {"cores": cores, "gpus": n_gpus, "workers": workers, "needed": need}
    if need > cores:
        fit = max(cores // n_gpus, 0)
        return Row("CPU budget", WARN, f"{need} workers for {cores} cores", ev,
                   f"rule of thumb: workers x GPUs <= cores; starved ranks fall behind until the NCCL watchdog kills "
                   f"the job. Use num_workers <= {fit} (ddptop --profile fewer-workers halves them)", data)
    return Row("CPU budget", OK, f"{need} workers for {cores} cores", ev, "", data)


# -- network -------------------------------------------------------------------------


def infiniband_devices(root: Path = Path("/")) -> dict[str, list[str]]:
    """IB device -> its ports' states ("4: ACTIVE")."""
    base = root / "sys/class/infiniband"
    out = {}
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        states = []
        for port in sorted((d / "ports").glob("*")):
            try:
                states.append(f"port {port.name}: {(port / 'state').read_text().strip()}")
            except OSError:
                pass
        out[d.name] = states
    return out


def check_infiniband(ib: dict[str, list[str]]) -> Row:
    if not ib:
        return Row("InfiniBand", OK, "no InfiniBand devices (/sys/class/infiniband): multi-node traffic uses TCP sockets",
                   [], "", {"devices": {}})
    ev = [f"{d}: {', '.join(s) or 'no ports'}" for d, s in ib.items()]
    active = [d for d, s in ib.items() if any("ACTIVE" in x for x in s)]
    if not active:
        return Row("InfiniBand", WARN, f"{len(ib)} device(s), no port ACTIVE", ev,
                   "check cabling and the subnet manager (ibstat); NCCL falls back to sockets or fails", {"devices": ib})
    return Row("InfiniBand", OK, f"{len(ib)} device(s), {len(active)} with an active port", ev, "", {"devices": ib})


def nccl_list_match(spec: str, names: Iterable[str]) -> list[str]:
    """The names an NCCL interface list selects (NCCL_SOCKET_IFNAME, NCCL_IB_HCA):
    comma-separated prefixes; a leading ``^`` excludes instead; a leading ``=``
    (after ``^``) makes the items exact names.  ``:port`` suffixes (IB) are ignored."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    if exclude:
        spec = spec[1:]
    exact = spec.startswith("=")
    if exact:
        spec = spec[1:]
    items = [i.split(":")[0].strip() for i in spec.split(",") if i.split(":")[0].strip()]

    def hit(n):
        return any(n == i if exact else n.startswith(i) for i in items)
    return [n for n in names if hit(n) != exclude]


def check_nccl_net(env: dict[str, str], ifaces: list[str] | str, ib: dict[str, list[str]]) -> Row:
    """``ifaces``: the machine's interface names, or why they could not be listed."""
    if isinstance(ifaces, str):
        set_ = [k for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if k in env]
        return Row("NCCL network", SKIPPED if not set_ else WARN,
                   f"could not list this machine's network interfaces ({ifaces})"
                   + (f": {' and '.join(set_)} not checked" if set_ else ""), [], "", {"error": ifaces})
    ev = [f"interfaces: {', '.join(ifaces) or 'none'}"]
    bad, warns = [], []
    data = {"interfaces": ifaces}
    spec = env.get("NCCL_SOCKET_IFNAME")
    if spec is not None:
        m = nccl_list_match(spec, ifaces)
        ev.append(f"NCCL_SOCKET_IFNAME={spec} selects: {', '.join(m) or 'nothing'}")
        data["nccl_socket_ifname"] = m
        if not m:
            bad.append(f"NCCL_SOCKET_IFNAME={spec} matches no interface here (NCCL: `no socket interface found`)")
        elif spec.lstrip("^=") and all(n == "lo" for n in m):
            warns.append("NCCL_SOCKET_IFNAME selects only loopback: fine on one node, multi-node jobs cannot connect")
    gspec = env.get("GLOO_SOCKET_IFNAME")
    if gspec is not None:
        missing = [n for n in gspec.split(",") if n.strip() and n.strip() not in ifaces]
        ev.append(f"GLOO_SOCKET_IFNAME={gspec}" + (f" (missing: {', '.join(missing)})" if missing else ""))
        if missing:
            bad.append(f"GLOO_SOCKET_IFNAME names interface(s) that do not exist: {', '.join(missing)} (gloo wants exact names)")
    hca = env.get("NCCL_IB_HCA")
    if hca is not None:
        m = nccl_list_match(hca, list(ib))
        ev.append(f"NCCL_IB_HCA={hca} selects: {', '.join(m) or 'nothing'} (IB devices: {', '.join(ib) or 'none'})")
        if not ib:
            warns.append("NCCL_IB_HCA is set but this machine has no InfiniBand devices")
        elif not m:
            bad.append(f"NCCL_IB_HCA={hca} matches none of the IB devices ({', '.join(ib)})")
    if spec is None and gspec is None and hca is None:
        return Row("NCCL network", OK, "NCCL_SOCKET_IFNAME / NCCL_IB_HCA not set: NCCL picks interfaces itself", ev, "", data)
    if bad:
        return Row("NCCL network", FAIL, bad[0], ev + bad[1:] + warns,
                   "fix the variable to name interfaces that exist on every node (see `ip -br addr`)", data)
    if warns:
        return Row("NCCL network", WARN, warns[0], ev + warns[1:], "check the variable against the interfaces of every node", data)
    return Row("NCCL network", OK, "interface variables match this machine's interfaces", ev, "", data)


def port_owner(port: int) -> str | None:
    try:
        import psutil

        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
                if c.pid:
                    try:
                        return f"pid {c.pid} ({' '.join(psutil.Process(c.pid).cmdline()[:4])})"
                    except psutil.Error:
                        return f"pid {c.pid}"
                return "another process"
    except Exception:  # AccessDenied on some systems
        return None
    return None


def try_bind(host: str, port: int) -> str | None:
    """None when ``host:port`` can be bound (as torch's TCPStore would, with SO_REUSEADDR), else the error."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno)) + f" ({e.strerror})"
    return None


def check_master_port(port: int, bind: Callable[[str, int], str | None] = try_bind,
                      owner: Callable[[int], str | None] = port_owner) -> Row:
    res = {h: bind(h, port) for h in ("127.0.0.1", "0.0.0.0")}
    ev = [f"bind {h}:{port}: {'free' if e is None else e}" for h, e in res.items()]
    if all(e is None for e in res.values()):
        return Row("Master port", OK, f"{port} is free", ev, "", {"port": port, "free": True})
    who = owner(port)
    if who:
        ev.append(f"listening: {who}")
    return Row("Master port", WARN, f"{port} is in use" + (f" by {who}" if who else ""), ev,
               f"a job using --master-port {port} on this node as its master will fail with `address already in use`; "
               "pick another port (torchrun --master-port P, or --rdzv-endpoint HOST:P)", {"port": port, "free": False})


# -- environment ---------------------------------------------------------------------

_HURTS = [
    ("NCCL_P2P_DISABLE", lambda v: v == "1", "P2P off: intra-node collectives go through host memory and cost "
     "bandwidth; keep it only if P2P really hangs here"),
    ("NCCL_SHM_DISABLE", lambda v: v == "1", "SHM transport off: slower intra-node traffic when P2P is off too; fix "
     "/dev/shm instead"),
    ("NCCL_DEBUG", lambda v: v.upper() in ("INFO", "TRACE"), "NCCL debug logging on: large logs and slower start-up; "
     "unset it (or use WARN) once the problem is found"),
    ("NCCL_BLOCKING_WAIT", lambda v: v == "1", "blocking wait: each collective blocks the host thread (slower); "
     "prefer async error handling"),
    ("TORCH_NCCL_BLOCKING_WAIT", lambda v: v == "1", "blocking wait: each collective blocks the host thread (slower); "
     "prefer TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", lambda v: v == "0", "async error handling off: a hung collective is never "
     "aborted, the job hangs forever"),
    ("NCCL_ASYNC_ERROR_HANDLING", lambda v: v == "0", "async error handling off: a hung collective is never aborted"),
    ("TORCH_NCCL_ENABLE_MONITORING", lambda v: v == "0", "heartbeat monitor off: a stuck watchdog never ends the job"),
    ("TORCH_DISTRIBUTED_DEBUG", lambda v: v.upper() == "DETAIL", "DETAIL adds consistency checks around every "
     "collective: slower; unset it after debugging"),
    ("CUDA_LAUNCH_BLOCKING", lambda v: v == "1", "every CUDA launch is synchronous: much slower; a debugging setting"),
]


def check_env(env: dict[str, str], ib: dict[str, list[str]] | None = None, needed: Iterable[str] = ()) -> Row:
    from ddptop.core.profiles import mask_env

    shown = {k: v for k, v in env.items() if k.startswith(("NCCL_", "TORCH_")) or k == "CUDA_LAUNCH_BLOCKING"}
    masked = mask_env(shown)
    ev = [f"{k}={masked[k]}" for k in sorted(masked)]
    flags = []
    needed = set(needed)
    for name, bad, why in _HURTS:
        v = env.get(name)
        if v is not None and bad(v.strip()) and name not in needed:
            flags.append(f"{name}={v}: {why}")
    if env.get("NCCL_IB_DISABLE") == "1" and ib:
        flags.append(f"NCCL_IB_DISABLE=1 on a machine with InfiniBand ({', '.join(ib)}): multi-node traffic falls back "
                     "to TCP sockets")
    for name in sorted(needed & set(env)):
        ev.append(f"{name}: kept, a matching known problem needs it")
    data = {"variables": masked, "flagged": [f.split(":")[0] for f in flags]}
    if not shown:
        return Row("Environment", OK, "no NCCL_* or TORCH_* variables set", [], "", data)
    if flags:
        return Row("Environment", WARN, f"{len(shown)} set, {len(flags)} known to hurt", ev + ["flagged: " + f for f in flags],
                   "unset the flagged variables unless you set them on purpose for this machine", data)
    return Row("Environment", OK, f"{len(shown)} NCCL_*/TORCH_* variable(s) set, none known to hurt", ev, "", data)


# -- all of it ------------------------------------------------------------------------


def run_checks(*, workers: int | None = None, master_port: int = 29500, root: Path = Path("/"),
               env: dict[str, str] | None = None, backend=None, packages: Packages | None = None,
               problems: list[KnownProblem] | None = None) -> list[Row]:
    """Every check against this machine (or against what is injected)."""
    env = dict(os.environ) if env is None else env
    if backend is None:
        from ddptop.core.gpu.nvml import NvmlBackend

        backend = NvmlBackend()
    try:
        topo = backend.topology()
        links, health = backend.links(), backend.health()  # {} without a driver
        error, fault = backend.error, getattr(backend, "fault", None)
    finally:
        backend.shutdown()
    n_gpus = len(topo.gpus) if topo else 0
    pk = packages if packages is not None else read_packages(probe=probe_torch)
    problems = load_known_problems() if problems is None else problems
    ib = infiniband_devices(root)
    rows = [check_gpus(topo, error, fault)]
    if fault:
        error = "NVML failed to start (see GPUs)"
    rows += [check_gpu_health(health, error), check_versions(topo, error, pk)]
    kp = check_known_problems(problems, topo, error, pk.nccl, env)
    rows.append(kp)
    rows += [check_p2p(topo, error), check_nvlink(links, error), check_fabric(links, error, topo.driver if topo else None),
             check_acs(root, n_gpus), check_iommu(root, n_gpus)]
    from ddptop.core.journal import runs_home

    rows += [check_shm(str(root / "dev/shm")), check_memlock(list(ib)), check_disk(runs_home())]
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    job = running_job_workers() if workers is None else None
    rows.append(check_cpu(cores, n_gpus, workers, job))
    ifaces: list[str] | str
    try:
        import psutil

        ifaces = sorted(psutil.net_if_addrs())
    except Exception as e:  # not an empty list: "matches no interface" would be a false FAIL
        ifaces = f"{type(e).__name__}: {e}"
    rows += [check_infiniband(ib), check_nccl_net(env, ifaces, ib), check_master_port(master_port)]
    needed = {k for p in problems if p.id in kp.data.get("worked_around", []) for k in p.workaround_env}
    rows.append(check_env(env, ib, needed))
    return rows


def format_rows(rows: list[Row]) -> str:
    w = max(len(r.name) for r in rows)
    lines = [f"{'STATUS':<8} {'CHECK':<{w}}  SUMMARY"]
    for r in rows:
        lines.append(f"{r.status:<8} {r.name:<{w}}  {r.summary}")
        pad = " " * 11
        lines += [pad + e for e in r.evidence]
        if r.advice:
            lines.append(pad + "-> " + r.advice)
    s = summary(rows)
    lines.append(f"\n{s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['skipped']} skipped (exit {s['exit_code']})")
    return "\n".join(lines)


def to_json(rows: list[Row]) -> str:
    return json.dumps({"rows": [r.to_dict() for r in rows], "summary": summary(rows)}, indent=2)


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="ddptop doctor", description=(
        "Check this machine for causes of multi-GPU hangs and crashes. Exit 0: all ok (or skipped), 1: warnings, "
        "2: failures."))
    ap.add_argument("--json", action="store_true", help="rows and a summary as JSON")
    ap.add_argument("--workers", type=int, metavar="N", help="data-loader workers per GPU (default: read from a running "
                    "torchrun of yours, else the CPU budget is skipped)")
    ap.add_argument("--master-port", type=int, default=29500, metavar="P", help="port to check is free (default 29500)")
    ap.add_argument("--host", action="append", default=[], metavar="HOST",
                    help="check HOST instead, over your ssh (its ddptop runs the checks there); repeatable")
    ap.add_argument("--ssh", metavar="CMD", help="ssh command line (default: ssh, or $DDPTOP_SSH)")
    ap.add_argument("--remote-ddptop", metavar="CMD", help="ddptop on the remote nodes (default: ddptop, or $DDPTOP_REMOTE)")
    a = ap.parse_args(argv)
    if a.host:
        return _remote_main(a)
    rows = run_checks(workers=a.workers, master_port=a.master_port)
    print(to_json(rows) if a.json else format_rows(rows))
    return exit_code(rows)


def remote_rows(host: str, ssh: list[str], remote_cmd: str, args: list[str], timeout: float = 120) -> list[Row]:
    """The doctor's rows on HOST, run there by its own ddptop over ssh; a host
    that cannot be reached, or has no ddptop, is one failed row saying so."""
    import shlex
    import subprocess

    from ddptop.core.remote import SSH_OPTIONS

    argv = [*ssh, *SSH_OPTIONS, host, shlex.join([*shlex.split(remote_cmd), "doctor", "--json", *args])]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [Row("ssh", FAIL, f"{host}: no answer in {timeout:g} s", [" ".join(argv)])]
    except OSError as e:
        return [Row("ssh", FAIL, f"could not run ssh: {e}", [" ".join(argv)])]
    try:
        d = json.loads(r.stdout)
        return [Row(**{k: v for k, v in row.items() if k in Row.__dataclass_fields__}) for row in d["rows"]]
    except (ValueError, KeyError, TypeError):
        err = (r.stderr or r.stdout).strip().splitlines()
        last = err[-1] if err else f"exit {r.returncode}"
        if r.returncode == 127 or "command not found" in r.stderr or "No module named ddptop" in r.stderr:
            from ddptop import __version__

            return [Row("ddptop", FAIL, f"ddptop is not installed on {host}", [last],
                        f"install it there: pip install 'ddptop=={__version__}' (or point --remote-ddptop at it)")]
        return [Row("ssh", FAIL, f"{host}: {last}", [" ".join(argv)],
                    "check that `ssh HOST` works without a password prompt (keys or agent)")]


def _remote_main(a) -> int:
    import shlex

    ssh = shlex.split(a.ssh or os.environ.get("DDPTOP_SSH", "ssh"))
    remote_cmd = a.remote_ddptop or os.environ.get("DDPTOP_REMOTE", "ddptop")
    args = (["--workers", str(a.workers)] if a.workers is not None else []) + ["--master-port", str(a.master_port)]
    per_host = {h: remote_rows(h, ssh, remote_cmd, args) for h in a.host}
    if a.json:
        print(json.dumps({"hosts": {h: {"rows": [r.to_dict() for r in rows], "summary": summary(rows)}
                                    for h, rows in per_host.items()}}, indent=2))
    else:
        print("\n\n".join(f"== {h} ==\n{format_rows(rows)}" for h, rows in per_host.items()))
    return max(exit_code(rows) for rows in per_host.values())
