"""One sentence builder for a stall: says what the evidence shows, nothing more.

It knows the phase (start-up, training, evaluation, saving), where progress
came from (the step hook, the ranks' logs, their stacks only), and says per
rank where it is in the user's terms: who waits on the GPU and at which line,
who is elsewhere, where, and its GPU state.  Pure: no I/O.
"""

from __future__ import annotations

import signal
from typing import Iterable

from ddptop.core.analysis.rank_state import RankState
from ddptop.core.model.evidence import (
    HOT_UTIL,
    IDLE_UTIL,
    StackEvidence,
    Where,
    ranks_text,
)

HEADLINES = {
    "lost-peer": "Lost peer: a rank ended while the others wait for it in a collective, where they stay until "
                 "NCCL's watchdog ends them (10 minutes by default): its last lines say why it ended",
    "mismatch": "Collective mismatch: the ranks wait in different collectives, so none can finish: one rank took "
                "another code path (a branch on the rank, its data or a condition), or the order of collectives "
                "differs between ranks",
    "hot": "Hot stall: GPUs busy but no step progress, the signature of ranks waiting in a collective that one "
           "rank never joined (an NCCL hang: its kernels spin on the GPU)",
    "collective": "Collective hang: the other ranks wait for the odd rank out in a collective it never joined",
    "idle": "Idle stall: no progress and nothing busy",
    "cpu-bound": "CPU-bound stall: no progress while the CPU is pegged (data loading?)",
    "unknown": "Stall: no step progress",
}


COUNT_FROM = 8  # a group of more ranks than this is said with its count first


def exit_words(code: int) -> str:
    """``exited with code -11 (SIGSEGV)``."""
    what = f"exited with code {code}"
    if code < 0:
        try:
            what += f" ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return what


def phase_of(pool: Iterable[RankState]) -> str:
    """"start-up" (no step yet), "eval" or "save" (the hook says the model is
    evaluating or saving since the last step), else "train"."""
    pool = list(pool)
    if all(st.last_progress is None for st in pool):
        return "start-up"
    phases = {st.phase for st in pool if st.phase in ("eval", "save") and st.last_batch is not None
              and (st.last_progress is None or st.last_batch >= st.last_progress)}
    if phases:
        return "save" if phases == {"save"} else "eval"
    return "train"


def silence_words(pool: list[RankState], silent: float, expected: float | None) -> str:
    """How long, without what: in the job's phase, from its source of progress."""
    phase = phase_of(pool)
    if phase == "start-up":
        if all(st.watched is not None for st in pool):
            return (f"{silent:.0f} s without a change in any rank's stack (ddptop did not launch this job and reads "
                    "no step from it: its stacks are its sign of life)")
        if any(st.last_output is not None for st in pool) and all(st.batches is None for st in pool):
            return f"{silent:.0f} s without new output (ddptop recognises no training step in this job's log)"
        return f"{silent:.0f} s since start-up without a first training step"
    notes = []
    if phase == "eval":
        text = f"{silent:.0f} s without progress in evaluation (no evaluation batch drawn)"
    elif phase == "save":
        text = f"{silent:.0f} s without progress while saving"
    else:
        text = f"{silent:.0f} s without a training step"
        sources = {st.source for st in pool if st.source}
        if sources == {"log"}:
            text += " in the ranks' logs"
        elif sources == {"hook"}:
            notes.append("counted inside the ranks")
    if expected and phase == "train":
        notes.append(f"steps came every {expected:.2g} s: {silent / expected:.0f}x the usual interval")
    if notes:
        text += f" ({'; '.join(notes)})"
    return text


def gpu_words(st: RankState | None) -> str:
    if st is None or st.util is None:
        return ""
    u = st.util
    state = "busy" if u >= HOT_UTIL else "idle" if u <= IDLE_UTIL else "partly busy"
    return f"its GPU {state} ({u:.0f}%)"


def where_words(w: Where) -> str:
    """Where one rank is, in the user's terms."""
    from ddptop.core.analysis.native_frames import library_words

    at = w.at
    src = w.code.split("  #", 1)[0].strip()
    code = f" `{src}`" if src and len(src) <= 80 else ""
    lib = w.library or library_words(w.gpu)
    call = w.native.rsplit(" (", 1)[0] if w.native and not w.native.startswith("in ") else ""
    others = f"; {'; '.join(w.others)}" if w.others else ""
    if w.kind == "gpu-wait":
        how = (f"`{call}`, {lib}" if call else f"in {lib}" if w.native else
               "at a synchronisation, no native frames" if w.gpu == "sync" else
               "on one line while its GPU is busy, no native frames")
        return f"waits on the GPU at {at}{code} ({how}){others}"
    if w.kind == "gpu-lock":
        return (f"is blocked on a lock in {lib} at {at}{code}" + (f", inside `{call}`" if call else "") +
                ", a call that does not wait for GPU work: a deadlock, not GPU work" + others)
    if w.kind == "nccl":
        return f"{w.text.split(' called from ')[0].split(' in `')[0]} at {at}{code}{others}"
    if w.kind == "collective":
        return f"waits in `{w.call or w.innermost}` at {at}{code}"
    if w.kind == "backward":
        return f"waits in backward (DDP's all-reduce) at {at}{code}"
    if w.kind == "io":
        return f"is in I/O at {at}{code}"
    if w.kind == "data":
        return f"waits for data at {at}{code}"
    call = f" (`{w.call}`)" if w.call else ""
    fn = f"`{w.function}` " if w.function and w.function != "<module>" else ""
    moving = {"moving": ", moving", "busy": ", on the CPU"}.get(w.status, "")
    return f"is {'in ' + fn if fn else ''}at {at}{call}{code}{moving}"


def _groups_of(ws: list[Where]) -> list[tuple[list[int], Where]]:
    """Ranks at the same place, said once."""
    out: dict[tuple, tuple[list[int], Where]] = {}
    for w in ws:
        key = (w.kind, w.file, w.line, w.call, w.gpu)
        out.setdefault(key, ([], w))[0].append(w.rank)
    return list(out.values())


def stall_message(kind: str, pool: list[RankState], everyone: list[RankState], silent: float,
                  expected: float | None, v: StackEvidence | None, culprits: list[int], ras_text: str = "",
                  note: str = "") -> str:
    by_rank = {st.rank: st for st in everyone}
    odd = sorted(set(culprits))
    head = HEADLINES[kind]
    if kind in ("hot", "collective", "unknown") and not odd and v is not None and v.hung and v.waiting:
        # every rank waits at one place: nobody is the odd one out (or only one rank is watched)
        stalled = "Hot stall: GPUs busy but no step progress" if kind == "hot" else "Stall: no step progress"
        if len(everyone) == 1:
            head = stalled + ": the only rank watched waits, with no other rank to compare it with"
        else:
            head = (stalled + ": every rank waits in the same collective, none is the odd one out"
                    + (" (before the first step: the broken peer-to-peer start-up hang, or peers that never "
                       "connect)" if phase_of(pool) == "start-up" else ""))
    parts = [head + ".", silence_words(pool, silent, expected) + "."]
    # (each rank's node, as its events say, when the job spans several nodes)
    nodes = {st.rank: st.node for st in everyone if st.node}
    nodes = nodes if len(set(nodes.values())) > 1 else {}
    several_nodes = bool(nodes) or (v is not None and (not v.node or len({w.node for w in v.where.values()}) > 1))
    if odd:
        said = []
        for r in odd:
            w = v.where.get(r) if v is not None else None
            gpu = gpu_words(by_rank.get(r))
            st = by_rank.get(r)
            node = w.node if w is not None and w.node else nodes.get(r, "")
            who = f"rank {r}" + (f" on {node}" if node and several_nodes else "")
            if st is not None and not st.alive:
                said.append(f"{who} " + (exit_words(st.exit_code) if st.exit_code is not None else "ended"))
            elif w is not None and w.status != "unknown" and v is not None and v.hung:
                said.append(f"{who} {where_words(w)}" + (f", {gpu}" if gpu else ""))
            else:
                said.append(who + (f" ({gpu})" if gpu else ""))
        parts.append("Odd rank out: " + "; ".join(said) + ".")
    if v is not None and v.hung:
        waiting = [v.where[r] for r in v.waiting if r in v.where and r not in odd]
        for rs, w in _groups_of(waiting):
            utils = [u for u in (by_rank[r].util for r in rs if r in by_rank) if u is not None]
            gpu = (f", {'its GPU' if len(rs) == 1 else 'GPUs'} at {min(utils):.0f}%" +
                   (f"-{max(utils):.0f}%" if max(utils) - min(utils) >= 1 else "")) if utils else ""
            text = where_words(w)
            verb = text.split(" ", 1)
            if len(rs) > 1 and verb[0] in ("waits", "is"):
                text = {"waits": "wait", "is": "are"}[verb[0]] + " " + verb[1]
            who = ranks_text(rs)
            if len(rs) > COUNT_FROM:  # a large job: how many, then which ("1,023 ranks (0-776,778-1023)")
                who = f"{len(rs):,} ranks ({who.removeprefix('ranks ')})"
            parts.append(f"{who[:1].upper()}{who[1:]} {text}{gpu}.")
    if note:
        parts.append(note[:1].upper() + note[1:] + ".")
    if ras_text:
        parts.append(f"{ras_text[:1].upper()}{ras_text[1:]}.")
    return " ".join(parts)


def launch_words(ranks: list[int]) -> str:
    """Ranks stopped inside a kernel *launch* (not a sync): what holds a launch, and the profile that tells."""
    who = ranks_text(ranks)
    return (f"{who} {'waits' if len(ranks) == 1 else 'wait'} inside a kernel launch, which returns at once unless the "
            "GPU holds it: under CUDA's lazy module loading a kernel's first launch waits for the kernels running (a "
            "kernel waiting for a peer never ends), and under CUDA_LAUNCH_BLOCKING=1 every launch waits for its "
            "kernel; CUDA_MODULE_LOADING=EAGER (profile eager-load) rules out the first")


# --------------------------------------------------------------------------- the other alarms' sentences


def gpu_lost_words(index: int, ranks: list[int]) -> str:
    on = f"; rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} ran on it" if ranks else ""
    return f"GPU {index} fell off the bus (NVML: GPU is lost){on}"


# What the common Xids mean and whose they are, after NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors):
# an Xid is the driver's report of a GPU event, and many are the application's own doing (a kernel that faulted),
# not a broken GPU; a person must not take one for the other at 2 a.m.
_APP = "as a rule the application's own fault (a kernel that faulted: a device-side assert, an illegal address), not the GPU's"
_HW = "a hardware fault: take this GPU out of service (`nvidia-smi -q`; a reset or a reboot may be needed)"
XIDS: dict[int, tuple[str, str]] = {
    13: ("graphics engine exception", _APP),
    31: ("GPU memory page fault", _APP),
    43: ("GPU stopped processing", _APP),
    45: ("preemptive cleanup after earlier errors", "a consequence: its processes were ended (look at the errors before it)"),
    48: ("double-bit ECC error", _HW),
    63: ("ECC page retirement or row remapping recorded", "memory repaired itself; a reset applies it"),
    64: ("ECC page retirement or row remapping failed", _HW),
    74: ("NVLink error", "a link between GPUs failed: " + _HW),
    79: ("GPU has fallen off the bus", _HW),
    92: ("high single-bit ECC error rate", _HW),
    94: ("contained ECC error", "the memory error was contained to the application that met it: restart it"),
    95: ("uncontained ECC error", _HW),
    119: ("GSP RPC timeout", "the GPU's firmware stopped answering: reset the GPU"),
    120: ("GSP error", "the GPU's firmware failed: reset the GPU"),
}


def xid_words(xid: int, index: int) -> str:
    known = XIDS.get(xid)
    if known is None:
        return f"Xid {xid} critical error on GPU {index} (look it up in NVIDIA's Xid catalogue)"
    what, whose = known
    return f"Xid {xid} critical error on GPU {index}: {what}, {whose}"


def lingering_words(rank: int, seconds: float) -> str:
    return (f"Rank {rank} is still running {seconds:.0f} s after NCCL's watchdog timed out its collective: its abort "
            "can wait for ever behind a GPU kernel that does not end, so the job may not end by itself until torch's "
            "heartbeat monitor ends the process (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC). Stop it (q, or --on-stall kill).")


def peer_dead_words(ras_text: str) -> str:
    return (f"NCCL RAS: {ras_text}. The other ranks will wait for it in their next collective (until NCCL's "
            "watchdog ends them): look at this rank's last lines and how it ended.")


def signature_words(signature: str, who: str, explanation: str, evidence: str) -> str:
    return f"{signature} ({who}): {explanation}  Evidence: {evidence[:300]}"


def folded_words(message: str, said: list[str]) -> str:
    return f"{message} Folded into this alarm, the nodes' own view: {'; '.join(said)}."


def cause_elsewhere_words(message: str, node: str, elsewhere: list[str]) -> str:
    return (f"{message} None of {node}'s ranks is the odd one out, and the cross-node view raised no stall: the "
            f"cause may be on {', '.join(elsewhere)}.")
