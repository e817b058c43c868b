"""`ddptop doctor`: check this machine for the causes behind multi-GPU hangs and crashes.

Each check is a small function that takes plain data (an NVML
:class:`~ddptop.core.model.gpu_facts.Topology`, an environment dict, a sysfs root, a
``statvfs`` function...) and returns a :class:`Row`: a name, a status (ok /
warn / fail / skipped), a one-line summary, the evidence (what was read, with
numbers) and what to do.  :func:`run_checks` (here) gathers the facts from the
real machine and calls them all; :func:`exit_code` maps the rows to 0 / 1 / 2;
:func:`main` is ``ddptop doctor``.  The checks live in a module per topic:

* :mod:`.report`: the :class:`Row`, the statuses, the exit code, the text table and the JSON;
* :mod:`.gpu`: GPUs, GPU health, P2P, NVLink, the NVSwitch fabric (NVML);
* :mod:`.versions`: driver, CUDA, torch and NCCL versions and their fit;
* :mod:`.known_problems`: the known-problems database and its matches;
* :mod:`.pci`: PCIe ACS and the IOMMU (sysfs);
* :mod:`.host`: /dev/shm, ``ulimit -l``, the runs directory's disk, the CPU budget;
* :mod:`.network`: InfiniBand, NCCL's interface variables, the master port;
* :mod:`.environment`: ``NCCL_*`` / ``TORCH_*`` variables known to hurt.

A running torchrun's ranks and workers (for the CPU budget) are found by
:mod:`ddptop.core.sources.proc_torchrun`; ``--host`` runs the doctor on other nodes over
ssh with :mod:`ddptop.core.sessions.ssh`.

Core package: no textual, rich, torch or pynvml here.  NVML goes through
:mod:`ddptop.core.sources.gpu_nvml`; torch's and NCCL's versions come from package
metadata (a subprocess importing torch only when the metadata cannot say).
"""

from __future__ import annotations

import os
from pathlib import Path

from ddptop.core.model.run_dirs import runs_home
from ddptop.core.sources.gpu_backend import GpuBackend
from ddptop.core.sources.gpu_nvml import NvmlBackend
from ddptop.core.sources.proc_torchrun import running_job_workers
from ddptop.core.tools.doctor.environment import check_env
from ddptop.core.tools.doctor.gpu import (
    check_fabric,
    check_gpu_health,
    check_gpus,
    check_nvlink,
    check_p2p,
)
from ddptop.core.tools.doctor.host import (
    check_cpu,
    check_disk,
    check_memlock,
    check_ptrace,
    check_shm,
)
from ddptop.core.tools.doctor.hosts import doctor_on_hosts
from ddptop.core.tools.doctor.known_problems import (
    KNOWN_PROBLEMS,
    KnownProblem,
    KnownProblemsError,
    check_known_problems,
    load_known_problems,
    match_problem,
)
from ddptop.core.tools.doctor.network import (
    check_infiniband,
    check_master_port,
    check_nccl_net,
    infiniband_devices,
    nccl_list_match,
    port_owner,
    try_bind,
)
from ddptop.core.tools.doctor.pci import acs_control, check_acs, check_iommu
from ddptop.core.tools.doctor.report import (
    FAIL,
    OK,
    SKIPPED,
    WARN,
    Row,
    exit_code,
    format_rows,
    summary,
    to_json,
)
from ddptop.core.tools.doctor.versions import (
    Packages,
    check_versions,
    probe_torch,
    read_packages,
)

__all__ = [
    "FAIL", "KNOWN_PROBLEMS", "OK", "SKIPPED", "WARN", "KnownProblem", "KnownProblemsError", "Packages", "Row",
    "acs_control", "check_acs", "check_cpu", "check_disk", "check_env", "check_fabric", "check_gpu_health",
    "check_gpus", "check_infiniband", "check_iommu", "check_known_problems", "check_master_port", "check_memlock",
    "check_nccl_net", "check_nvlink", "check_p2p", "check_ptrace", "check_shm", "check_versions", "exit_code", "format_rows",
    "infiniband_devices", "load_known_problems", "main", "match_problem", "nccl_list_match", "port_owner",
    "probe_torch", "read_packages", "run_checks", "summary", "to_json", "try_bind",
]


def run_checks(*, workers: int | None = None, master_port: int = 29500, root: Path = Path("/"),
               env: dict[str, str] | None = None, backend: GpuBackend | None = None, packages: Packages | None = None,
               problems: list[KnownProblem] | None = None) -> list[Row]:
    """Every check against this machine (or against what is injected)."""
    env = dict(os.environ) if env is None else env
    if backend is None:

        backend = NvmlBackend()
    try:
        topo = backend.topology()
        links, health = backend.links(), backend.health()  # {} without a driver
        error, fault = backend.error, backend.fault
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

    rows += [check_shm(str(root / "dev/shm")), check_memlock(list(ib)), check_disk(runs_home()), check_ptrace(root)]
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    job = running_job_workers() if workers is None else None
    rows.append(check_cpu(cores, n_gpus, workers, job))
    ifaces: list[str] | str
    import psutil

    try:
        ifaces = sorted(psutil.net_if_addrs())
    except (OSError, psutil.Error) as e:  # not an empty list: "matches no interface" would be a false FAIL
        ifaces = f"{type(e).__name__}: {e}"
    rows += [check_infiniband(ib), check_nccl_net(env, ifaces, ib), check_master_port(master_port)]
    needed = {k for p in problems if p.id in kp.data.get("worked_around", []) for k in p.workaround_env}
    rows.append(check_env(env, ib, needed))
    return rows


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
        # imported here, not at the top: the ssh client is needed only for --host (and it imports
        # ddptop.core.tools.doctor.report itself, inside its functions)

        return doctor_on_hosts(a.host, ssh=a.ssh, remote_ddptop=a.remote_ddptop, workers=a.workers,
                               master_port=a.master_port, as_json=a.json)
    rows = run_checks(workers=a.workers, master_port=a.master_port)
    print(to_json(rows) if a.json else format_rows(rows))
    return exit_code(rows)
