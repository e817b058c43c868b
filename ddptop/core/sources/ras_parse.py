"""NCCL RAS's answers read: the status report in either of its formats
(``parse``: ``parse_json`` for 2.28.7+, ``parse_text`` for 2.24+; NCCL
2.28.x's JSON lacks a comma in ``missing_ranks``, which is repaired) and the
lines a ``MONITOR`` client is pushed (``parse_monitor_line``).  Pure: the
tests drive it with answers laid out as NCCL lays them out."""

from __future__ import annotations

import json
import re
from typing import Any

from ddptop.core.model.ras_types import PeerEvent, RasComm, RasRank, RasStatus
from ddptop.core.model.version_numbers import version_tuple


def parse(raw: str, fmt: str) -> RasStatus:
    st: RasStatus | None = None
    if fmt == "json":
        try:
            st = parse_json(raw)
        except ValueError:
            pass  # a server that said OK to the format but wrote text after all
    if st is None:
        st = parse_text(raw)
    v = version_tuple(st.version)
    if (st.format == "text" and (2, 26) <= v < (2, 29, 2) and len(st.comms) > 1
            and any(c.missing for c in st.comms)):
        # rasClientRunComms stepped over missing ranks wrongly when it walked the communicators
        # (fixed in 2.29.2, NVIDIA/nccl#1762): the communicators after one with missing ranks may be garbage
        st.unreliable = f"NCCL {st.version} may garble this report when ranks are missing (fixed in 2.29.2)"
    return st


# -- JSON (2.28.7+) ---------------------------------------------------------------

# NCCL 2.28.x (2.28.9 at least) leaves out the comma after "nvml_dev": N in missing_ranks entries:
# a value at the end of a line followed by a line that starts a new key
_MISSING_COMMA = re.compile(r'([\d"el}\]])(\s*\n\s*)("[^"\n]*"\s*:)')


# ncclResult_t, as NCCL's ncclErrorToString words them
_RESULTS = {1: "Unhandled CUDA error", 2: "System error", 3: "Internal error", 4: "Invalid argument",
            5: "Invalid usage", 6: "Remote process error", 8: "Timeout"}


def _hash(h: object) -> str:
    s = str(h or "").strip().lower()
    s = s.split(":")[0].removeprefix("0x").lstrip("0")
    return s or "0"


def _int(v: object, default: int = -1) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _obj(v: object) -> dict[str, Any]:
    """A JSON object, or {} for anything else."""
    return v if isinstance(v, dict) else {}


def parse_json(raw: str) -> RasStatus:
    try:
        d = json.loads(raw)
    except ValueError:
        d = json.loads(_MISSING_COMMA.sub(r"\1,\2\3", raw))  # ValueError again: not JSON at all
    if not isinstance(d, dict):
        raise ValueError("RAS JSON is not an object")
    st = RasStatus("json", version=str(d.get("nccl_version") or ""), raw=raw)
    ras = d.get("ras")
    if isinstance(ras, dict):
        st.timeouts = _int(ras.get("timeouts_count"), 0)
    for c in d.get("communicators") or []:
        if not isinstance(c, dict):
            continue
        comm = RasComm(_hash(c.get("hash")), size=_int(c.get("size"), 0))
        for r in c.get("ranks") or []:
            if not isinstance(r, dict):
                continue
            counts = _obj(r.get("collective_counts"))
            status = _obj(r.get("status"))
            err = ""
            for key, what in (("init_state", "initialisation"), ("async_error", "asynchronous")):
                code = _int(status.get(key), 0)
                if code not in (0, 7) and not err:  # (7: in progress)
                    err = f"{_RESULTS.get(code, 'Unexpected error')} ({what} error)"
            # (as NCCL's own report derives a rank's status from the flags)
            state = ("ABORT" if status.get("abort_flag") is True else
                     "FINALIZE" if status.get("finalize_called") is True or status.get("destroy_flag") is True else
                     "RUNNING" if _int(status.get("init_state"), 0) == 0 else "INIT")
            comm.ranks.append(RasRank(_int(r.get("rank")), str(r.get("host") or ""), _int(r.get("pid")),
                                      str(r.get("cuda_dev", "")),
                                      {str(k): _int(v, 0) for k, v in counts.items()}, error=err, status=state))
        for r in c.get("missing_ranks") or []:
            if not isinstance(r, dict):
                continue
            status = _obj(r.get("status"))
            # unresponsive false: its process answered, without this communicator (NOCOMM)
            unresponsive = status.get("unresponsive") is not False
            comm.missing.append(RasRank(_int(r.get("rank")), str(r.get("host") or ""), _int(r.get("pid")),
                                        str(r.get("cuda_dev", "")), missing=True, unresponsive=unresponsive,
                                        dead=bool(status.get("considered_dead")),
                                        status="" if unresponsive else "NOCOMM"))
        st.comms.append(comm)
    return st


# -- text (2.24+) -----------------------------------------------------------------
#
# The layout of NCCL's src/ras/client_support.cc (rasClientRunComms,
# rasClientBreakDownErrors).  Within a communicator's MISMATCH or ERROR
# section, ranks that share a value come as a group line ("6 ranks have
# launched up to operation 4412", "2 ranks have status ABORT", "2 ranks
# reported Remote process error"), followed, when the group is an outlier, by
# one "Rank N -- GPU ... managed by process P on node H" line per member; a
# group of one is a single line that says both ("Rank N has launched up to
# operation X -- ..."). A rank whose process RAS cannot name says
# "[process information not found]" instead of its GPU, process and node.

_VERSION = re.compile(r"^[NR]CCL version (\S+)", re.M)
_COMM_HEAD = re.compile(r"^#\d+-\d+ \(([0-9a-fA-F]+)\) (INCOMPLETE|ERROR|MISMATCH)\s*$")
_WHO = (r"(?:GPU (?P<gpu>[^\n]*?) managed by process (?P<pid>\d+) on node (?P<host>\S+)"
        r"|\[process information not found\])")
_MEMBER = re.compile(r"^\s+Rank (?P<rank>\d+) -- " + _WHO + r"\s*$")
_OLD_MISSING = re.compile(r"^\s+The missing ranks?: (?P<ranks>[\d, ]+)\s*$")
_KIND_DIFF = re.compile(r"^\s+Communicator ranks have different (?P<kind>\w+) operation counts\s*$")
_STATUS_DIFF = re.compile(r"^\s+Communicator ranks have different status\s*$")
_MANY_UP_TO = re.compile(r"^\s+(?P<n>\d+) ranks have launched up to operation (?P<op>\d+)\s*$")
_MANY_NONE = re.compile(r"^\s+(?P<n>\d+) ranks have not launched any operations\s*$")
_MANY_STATUS = re.compile(r"^\s+(?P<n>\d+) ranks have status (?P<status>[A-Z]+)\s*$")
_MANY_ERROR = re.compile(r"^\s+(?P<n>\d+) ranks reported (?P<err>.+?)\s*$")
_ONE_UP_TO = re.compile(r"^\s+Rank (?P<rank>\d+) has launched up to operation (?P<op>\d+) -- " + _WHO + r"\s*$")
_ONE_NONE = re.compile(r"^\s+Rank (?P<rank>\d+) has not launched any operations -- " + _WHO + r"\s*$")
_ONE_STATUS = re.compile(r"^\s+Rank (?P<rank>\d+) has status (?P<status>[A-Z]+) -- " + _WHO + r"\s*$")
_ONE_ERROR = re.compile(r"^\s+Rank (?P<rank>\d+) reported (?P<err>.+?) -- " + _WHO + r"\s*$")
_ERRORS_OF = re.compile(r"^\s+(?P<what>Initialization|Asynchronous) errors? on \d+ ranks?\s*$")
_PROCESS = re.compile(r"^\s+Process (?P<pid>\d+) on node (?P<host>\S+) managing GPUs? (?P<gpu>.*?)\s*$")
_TABLE_ROW = re.compile(r"^\s*\d+\s+\d+\s+\d+\s+[\d-]+\s+(?P<size>\d+)\s+\d+\s+(?P<status>[A-Z]+)\s+(?P<err>[A-Z,]+)\s*$")
_TIMEOUTS = re.compile(r"Encountered (\d+) communication timeouts?")


def parse_text(raw: str) -> RasStatus:
    st = RasStatus("text", raw=raw)
    m = _VERSION.search(raw)
    if m:
        st.version = m.group(1)
    m = _TIMEOUTS.search(raw)
    if m:
        st.timeouts = int(m.group(1))
    comms: dict[str, RasComm] = {}
    comm: RasComm | None = None
    section = ""  # INCOMPLETE, ERROR, MISMATCH; DEAD, INCOMPLETE (the job's processes) with no comm
    kind = ""  # the collective kind whose counts differ ("status": the ranks' status differs)
    group: tuple[str, object] | None = None  # what the "N ranks ..." line before says of its members
    errors_of = ""  # "initialisation" or "asynchronous" (the ERROR section's part)
    for line in raw.splitlines():
        if not line.strip():
            continue
        t = _TABLE_ROW.match(line)
        if t and comm is None:
            continue
        h = _COMM_HEAD.match(line)
        if h:
            key = _hash(h.group(1))
            comm = comms.setdefault(key, RasComm(key))
            section, kind, group, errors_of = h.group(2), "", None, ""
            continue
        if line.strip() in ("INCOMPLETE", "DEAD", "TIMEOUT", "Errors", "Warnings") and not line.startswith(" "):
            comm, section, kind, group = None, line.strip(), "", None
            continue
        if comm is None:
            p = _PROCESS.match(line)
            if p and section == "DEAD":
                st.dead_processes.append((p.group("host"), int(p.group("pid"))))
            elif p and section == "INCOMPLETE":
                st.silent_processes.append((p.group("host"), int(p.group("pid"))))
            continue
        if section == "INCOMPLETE":
            r = _MEMBER.match(line)
            if r:
                rr = _rank_of(r, missing=True)
                rr.unresponsive = True  # (listed here: its process did not answer)
                comm.missing.append(rr)
                continue
            o = _OLD_MISSING.match(line)
            if o:
                comm.missing += [RasRank(int(x), missing=True, unresponsive=True)
                                 for x in re.findall(r"\d+", o.group("ranks"))]
            continue
        if section == "ERROR":
            e = _ERRORS_OF.match(line)
            if e:
                errors_of, group = ("initialisation" if e.group("what") == "Initialization" else "asynchronous"), None
                continue
            one = _ONE_ERROR.match(line)
            if one:
                _merge(comm, one).error = f"{one.group('err')} ({errors_of or 'an'} error)"
                group = None
                continue
            many = _MANY_ERROR.match(line)
            if many:
                group = ("error", many.group("err"))
                continue
            r = _MEMBER.match(line)
            if r and group is not None and group[0] == "error":
                _merge(comm, r).error = f"{group[1]} ({errors_of or 'an'} error)"
            continue
        # MISMATCH: the status, then the operation counts of each kind that differ
        if _STATUS_DIFF.match(line):
            kind, group = "status", None
            continue
        k = _KIND_DIFF.match(line)
        if k:
            kind, group = k.group("kind"), None
            continue
        if kind == "status":
            one = _ONE_STATUS.match(line)
            if one:
                _set_status(comm, one, one.group("status"))
                group = None
                continue
            many = _MANY_STATUS.match(line)
            if many:
                group = ("status", many.group("status"))
                comm.status_groups[many.group("status")] = int(many.group("n"))
                continue
            r = _MEMBER.match(line)
            if r and group is not None:
                _set_status(comm, r, str(group[1]), grouped=True)
            continue
        if not kind:
            continue
        many = _MANY_UP_TO.match(line) or _MANY_NONE.match(line)
        if many:
            op = int(many.group("op")) if "op" in many.groupdict() else 0
            comm.groups.setdefault(kind, []).append((int(many.group("n")), op))
            group = ("count", op)
            continue
        one = _ONE_UP_TO.match(line) or _ONE_NONE.match(line)
        if one:
            _merge(comm, one).counts[kind] = int(one.group("op")) if "op" in one.groupdict() else 0
            group = None
            continue
        r = _MEMBER.match(line)
        if r and group is not None and group[0] == "count":
            rr = _merge(comm, r)
            rr.counts[kind] = int(group[1])  # type: ignore[call-overload]
            rr.grouped.add(kind)  # (already counted in its group's line)
    st.comms = list(comms.values())
    return st


def _rank_of(m: re.Match, missing: bool = False) -> RasRank:
    g = m.groupdict()
    return RasRank(int(g["rank"]), g.get("host") or "", int(g["pid"]) if g.get("pid") else -1,
                   (g.get("gpu") or "").strip(), missing=missing)


def _merge(comm: RasComm, m: re.Match) -> RasRank:
    """The rank a line names, the one already seen in this communicator if any."""
    new = _rank_of(m)
    old = next((r for r in comm.ranks if r.rank == new.rank), None)
    if old is None:
        comm.ranks.append(new)
        return new
    if old.pid < 0 and new.pid >= 0:
        old.host, old.pid, old.gpu = new.host, new.pid, new.gpu
    return old


def _set_status(comm: RasComm, m: re.Match, status: str, grouped: bool = False) -> None:
    if status == "UNKNOWN":  # (2.24/2.25: the missing ranks, said in INCOMPLETE)
        return
    if status == "NOCOMM":  # its process answered, without this communicator: NCCL lists it as missing
        r = _rank_of(m, missing=True)
        r.status = status
        if not any(x.rank == r.rank for x in comm.missing):
            comm.missing.append(r)
        return
    r = _merge(comm, m)
    r.status = status
    if grouped:
        r.grouped.add("status")


# -- pushed events (MONITOR, 2.29+) ------------------------------------------------

_MONITOR_LINE = re.compile(r"^\[(?P<time>[^\]]*)\] (?P<event>[A-Z_]+): (?P<rest>.*?)\s*$")
_PEER = re.compile(r"Process (?P<pid>\d+) on node (?P<host>\S+) managing GPUs? (?P<gpu>\S+(?: \(NVML [\d,]+\))?)")


def parse_monitor_line(line: str) -> PeerEvent | None:
    """``[2025-12-19 13:07:07] PEER_DEAD: Process 1524345 on node 10.0.0.2 managing GPU 1``
    (NCCL's text format; a peer it cannot name is its bare address)."""
    m = _MONITOR_LINE.match(line.strip("\r\n"))
    if not m:
        return None
    rest = m.group("rest")
    p = _PEER.search(rest)
    if p:
        return PeerEvent(m.group("event"), p.group("host"), int(p.group("pid")), rest[p.end():].strip(), line)
    return PeerEvent(m.group("event"), details=rest, line=line)
