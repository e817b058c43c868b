"""The environment row: the ``NCCL_*`` and ``TORCH_*`` variables that are set
(secrets masked), each flagged when its value is known to hurt (P2P or SHM
off, debug logging, blocking waits, async error handling off...), unless a
matching known problem needs it as its workaround.
"""

from __future__ import annotations

from typing import Iterable

from ddptop.core.run.profiles import mask_env
from ddptop.core.tools.doctor.report import OK, WARN, Row

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
