"""Which GPU a rank uses, read from its environment as CUDA and the NVIDIA
container runtime read it, named as NVML names it.

Inside a container NVML's process list carries host pids, which the
container's own ``/proc`` cannot see, so a rank cannot be found on a GPU by
its pid.  Its device can still be found: the rank uses the GPU its
``LOCAL_RANK`` picks among the devices its CUDA can see.  Those are

* ``CUDA_VISIBLE_DEVICES``, in CUDA's forms: indexes, ``GPU-`` UUIDs or a
  leading part of one (with the ``GPU-``) that names one GPU, ``MIG-`` ids
  (``MIG-<uuid>``, or ``MIG-GPU-<uuid>/<gi>/<ci>`` of drivers before R470);
  the list ends at the first entry that is none of these (``-1``).  A list of
  one is the rank's GPU whatever its LOCAL_RANK;
* else the GPUs the container was given (``NVIDIA_VISIBLE_DEVICES``, as the
  NVIDIA container runtime and the Kubernetes device plugin set it: ``all``,
  ``none``, indexes of the host, UUIDs, ``MIG-`` ids or ``GPU:MIG`` pairs),
  in NVML's order (CUDA's, for GPUs of one model);
* else every GPU NVML sees.

Pure: the caller passes the GPUs NVML reports and a resolver of UUIDs and
MIG ids (the backend's :meth:`device_index`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Gpu", "RankDevice", "cuda_ids", "match_uuid", "rank_device"]

_MIG_PAIR = re.compile(r"^(\d+):(\d+)$")  # NVIDIA_VISIBLE_DEVICES' "GPU index:MIG index"


@dataclass(frozen=True)
class Gpu:
    """A GPU as NVML reports it: its index, UUID and model."""

    index: int
    uuid: str = ""
    name: str = ""


@dataclass(frozen=True)
class RankDevice:
    """The GPU a rank's environment gives it.

    ``index``: NVML's index, None when the environment names no GPU NVML sees.
    ``sure``: False where it is a guess (LOCAL_RANK past the list, or an index
    in CUDA's fastest-first order among GPUs of different models).
    ``by``: what named it (``uuid``, ``mig``, ``index``, ``local_rank``) and
    ``how``: in words, for a person."""

    index: int | None
    sure: bool
    by: str
    how: str


def cuda_ids(value: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES' entries as CUDA reads them: up to the first one
    that is neither an index nor a ``GPU-``/``MIG-`` id (``-1`` hides the rest)."""
    out = []
    for part in value.split(","):
        s = part.strip()
        if not (s.isdigit() or s.upper().startswith(("GPU-", "MIG-"))):
            break
        out.append(s)
    return out


def match_uuid(ident: str, uuids: Mapping[str, int]) -> int | None:
    """The index of the one GPU whose UUID is ``ident`` or starts with it
    (CUDA takes a leading part that names one GPU); None for none or several."""
    want = ident.strip().lower()
    if not want.startswith("gpu-") or len(want) <= 4:
        return None
    hits = {i for u, i in uuids.items() if u.lower() == want}
    if not hits:
        hits = {i for u, i in uuids.items() if u.lower().startswith(want)}
    return next(iter(hits)) if len(hits) == 1 else None


def _container_gpus(env: Mapping[str, str], gpus: Sequence[Gpu],
                    find: Callable[[str], int | None]) -> tuple[list[int], bool, str]:
    """The NVML indexes of the GPUs the rank's CUDA enumerates before
    CUDA_VISIBLE_DEVICES, in CUDA's order; whether that is sure; in words."""
    every = sorted(g.index for g in gpus)
    nvd = env.get("NVIDIA_VISIBLE_DEVICES")
    word = (nvd or "").strip().lower()
    # unset, empty or "void": the runtime left the container alone; "all"; a
    # path: the device plugin's volume-mounts strategy -- the container sees
    # its own GPUs, which are the ones NVML here sees when ddptop is inside it
    if nvd is None or word in ("", "void", "all") or word.startswith("/"):
        return every, True, ""
    if word == "none":
        return [], True, "NVIDIA_VISIBLE_DEVICES=none"
    ents = [e.strip() for e in nvd.split(",") if e.strip()]
    said = f"NVIDIA_VISIBLE_DEVICES={nvd}"
    hosts = [int(e.split(":")[0]) for e in ents if e.isdigit() or _MIG_PAIR.match(e)]
    if len(hosts) == len(ents) and len(set(hosts)) == len(every):
        # host indexes, and NVML sees as many GPUs: the container's own, renumbered from 0
        return every, True, said
    out, sure = set(), True
    for e in ents:
        m = _MIG_PAIR.match(e)
        i = int(e) if e.isdigit() else int(m.group(1)) if m else find(e)
        if i is None or i not in every:
            sure = False
        else:
            out.add(i)
    return sorted(out), sure, said


def rank_device(env: Mapping[str, str], local_rank: int, gpus: Sequence[Gpu],
                find: Callable[[str], int | None]) -> RankDevice:
    """The GPU a rank with this environment and LOCAL_RANK uses, among the
    ``gpus`` NVML reports; ``find`` resolves a UUID, a leading part of one or a
    MIG id to a GPU index (None when it names none here)."""
    base, base_sure, said = _container_gpus(env, gpus, find)
    by_index = {g.index: g for g in gpus}
    models = {by_index[i].name for i in base if i in by_index}
    # CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID (NVML's
    # order); among GPUs of one model, fastest first is bus order too
    ordered = env.get("CUDA_DEVICE_ORDER", "").strip().upper() == "PCI_BUS_ID" or len(models) <= 1
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = cuda_ids(cvd)
        if not ids:
            return RankDevice(None, True, "", f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU")
        if len(ids) == 1:
            k, sure = 0, True
        elif 0 <= local_rank < len(ids):
            k, sure = local_rank, True
        else:
            return RankDevice(None, False, "", f"LOCAL_RANK {local_rank} is past CUDA_VISIBLE_DEVICES={cvd}")
        ident = ids[k]
        how = f"CUDA_VISIBLE_DEVICES={cvd}" + (f", LOCAL_RANK {local_rank}" if len(ids) > 1 else "")
        if ident.isdigit():
            n = int(ident)
            idx = base[n] if n < len(base) else None
            return RankDevice(idx, sure and base_sure and ordered, "index", how + (f" ({said})" if said else ""))
        idx = find(ident)
        return RankDevice(idx, sure, "mig" if ident.upper().startswith("MIG-") else "uuid", how)
    how = f"LOCAL_RANK {local_rank}" + (f" of {said}" if said else "")
    if 0 <= local_rank < len(base):
        return RankDevice(base[local_rank], base_sure and ordered, "local_rank", how)
    if len(base) == 1 and said:  # the container has one GPU: the ranks past the first may share it
        return RankDevice(base[0], False, "local_rank", how)
    return RankDevice(None, False, "", how + f": past the {len(base)} GPU(s) seen")
