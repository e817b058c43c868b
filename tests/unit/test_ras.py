"""NCCL RAS: the client, both report formats, the known quirks, and who is behind.

The answers come from ``tests/support/ras_server.py``, a stand-in that speaks NCCL's
protocol and lays its reports out as NCCL's source does; each test chooses
the job (ranks, pids, counts) and the rank held back, so no answer is canned.

(A real job's RAS, through ddptop: tests/integration/test_ras_e2e.py; the rank table: tests/ui/test_app_ras.py.)"""

from __future__ import annotations

import random

import pytest

from ddptop.core.sources import ras_client as ras
from ddptop.core.sources import ras_parse
from ddptop.core.model.ras_types import RasError
from ddptop.core.analysis.ras_verdict import verdict as ras_verdict
from ras_server import Job, Rank, RasServer


def job_of(n: int, held: set[int], *, op: int = 4412, kind: str = "AllReduce", missing: set[int] = frozenset(),
           dead: set[int] = frozenset(), pid0: int = 5000, host: str = "10.0.0.7") -> Job:
    """``n`` ranks that launched ``op`` operations of ``kind``; the ``held`` ones one fewer."""
    return Job([Rank(r, pid0 + r, host, gpu=r, counts={kind: op - (1 if r in held else 0), "Broadcast": 2},
                     missing=r in missing, dead=r in dead) for r in range(n)])


@pytest.fixture
def server():
    made = []

    def make(job, version="2.29.2"):
        s = RasServer(lambda: job, version=version)
        made.append(s)
        return s
    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("version,fmt", [("2.29.2", "json"), ("2.28.9", "json"), ("2.27.3", "text"),
                                         ("2.25.1", "text")])
def test_the_rank_that_never_launched_the_collective_is_named(server, version, fmt):
    """JSON where the server has it (2.28.7+, 2.28.9's broken comma included),
    the text report otherwise (before 2.26: one count for every kind); the
    held-back rank, chosen at random here, is the culprit in either."""
    rng = random.Random(version)
    n = rng.choice([2, 4, 8])
    held = rng.randrange(n)
    s = server(job_of(n, {held}), version)
    st = ras.query(s.addr, timeout=5)
    assert st.format == fmt and st.version.startswith(version)
    assert s.queries[-1].split("|")[0] == "CLIENT PROTOCOL 2"
    v = ras_verdict(st)
    assert v.culprits == [held]
    kind = "AllReduce" if tuple(map(int, version.split("."))) >= (2, 26) else "collective"
    top = 4412 + 2 if kind == "collective" else 4412
    assert f"launched {kind} #{top}" in v.text and f"rank {held} stopped at #{top - 1}" in v.text
    assert v.text.endswith("(NCCL RAS)")


def test_global_ranks_from_host_and_pid(server):
    """A communicator's ranks are not the job's: the mapping goes by host and pid."""
    job = job_of(4, {2})
    s = server(job)
    by_pid = {r.pid: 10 + r.rank for r in job.ranks}  # the job's global ranks 10..13
    v = ras_verdict(ras.query(s.addr), lambda host, pid: by_pid.get(pid) if host == "10.0.0.7" else None)
    assert v.culprits == [12] and "ranks 10, 11, 13 launched AllReduce #4412; rank 12 stopped at #4411" in v.text
    assert v.behind == {12: "AllReduce #4411 (others #4412)"}


@pytest.mark.parametrize("version", ["2.29.2", "2.28.9", "2.27.3", "2.25.1"])
def test_missing_and_dead_ranks_are_named(server, version):
    job = job_of(4, set(), missing={3}, dead={3})
    s = server(job, version)
    st = ras.query(s.addr)
    v = ras_verdict(st)
    assert 3 in v.culprits
    assert "rank 3" in v.text and ("dead" in v.text or "missing" in v.text)
    if st.format == "json":
        assert st.comms[0].missing[0].dead and st.comms[0].missing[0].pid == 5003


def test_a_rank_ahead_of_the_rest_is_said_but_not_blamed(server):
    """A rank that went on into a collective the others never launched waits there for them:
    NCCL's counts cannot tell whether it or they went astray, so it is said, not blamed."""
    job = job_of(4, set())
    job.ranks[1].counts["AllReduce"] += 1
    v = ras_verdict(ras.query(server(job).addr))
    assert v.culprits == [] and "rank 1 went on to #4413 (and waits there)" in v.text
    # with two ranks, the higher count is the one the others wait in
    job = job_of(2, set())
    job.ranks[0].counts["AllReduce"] += 1
    v = ras_verdict(ras.query(server(job).addr))
    assert v.culprits == [1] and "rank 1 stopped at #4412" in v.text


@pytest.mark.parametrize("version,verbose", [("2.29.2", True), ("2.27.3", True), ("2.27.3", False),
                                             ("2.25.1", True)])
def test_ranks_held_back_together_are_each_named(server, version, verbose):
    """NCCL lists a group of two or more ranks that share a count as "N ranks have launched up
    to operation X" and then one "Rank R -- GPU ..." line per member (a group of one says both in
    one line); every member is a culprit, in JSON and in each text layout, verbose or not."""
    rng = random.Random(f"{version}{verbose}")
    n = 8
    held = set(rng.sample(range(n), 2))
    s = server(job_of(n, held), version)
    st = ras.query(s.addr, json_format=version >= "2.29", verbose=verbose)
    v = ras_verdict(st)
    assert sorted(v.culprits) == sorted(held), (v.text, st.raw[-600:])
    if st.format == "text":
        assert "2 ranks have launched up to operation" in st.raw  # (the layout this test is about)
        assert f"Rank {min(held)} -- GPU" in st.raw


def test_a_group_too_large_to_list_is_said_as_counts(server):
    """Plain STATUS lists a group's members only while it is small (at most 10 ranks and a
    quarter of the communicator): a larger one is said as counts, with no rank to blame."""
    s = server(job_of(16, {1, 3, 5, 7, 9}), "2.27.3")
    v = ras_verdict(ras.query(s.addr, json_format=False, verbose=False))
    assert v.culprits == [] and "11 ranks launched AllReduce #4412; 5 ranks are at #4411" in v.text


@pytest.mark.parametrize("version", ["2.29.2", "2.27.3"])
@pytest.mark.parametrize("state,says", [("ABORT", "aborted its communicator"),
                                        ("FINALIZE", "finalized or destroyed its communicator"),
                                        ("nocomm", "not in this communicator")])
def test_a_rank_in_another_state_than_the_others_is_named(server, version, state, says):
    """A rank that aborted, finalized or no longer has the communicator, while the others run
    in it: NCCL says so in the status part of MISMATCH (text) or in its flags (JSON)."""
    rng = random.Random(f"{version}{state}")
    odd = rng.randrange(4)
    job = job_of(4, set())
    if state == "nocomm":
        job.ranks[odd].nocomm = True
    else:
        job.ranks[odd].status = state
    v = ras_verdict(ras.query(server(job, version).addr))
    assert v.culprits == [odd] and says in v.text, v.text


@pytest.mark.parametrize("version", ["2.29.2", "2.27.3"])
def test_ranks_that_reported_an_error_are_named_with_it(server, version):
    job = job_of(8, set())
    bad = random.Random(version).sample(range(8), 2)
    for r in bad:
        job.ranks[r].async_error = 6  # ncclRemoteError
    v = ras_verdict(ras.query(server(job, version).addr))
    assert sorted(v.culprits) == sorted(bad)
    assert f"rank {bad[0]} reported Remote process error (asynchronous error)" in v.text


def test_a_rank_whose_process_ras_cannot_name_is_still_named(server):
    job = job_of(4, {2})
    job.ranks[2].known = False
    st = ras.query(server(job, "2.27.3").addr)
    assert "-- [process information not found]" in st.raw
    assert ras_verdict(st).culprits == [2]


@pytest.mark.parametrize("version", ["2.29.2", "2.27.3", "2.25.1"])
def test_a_stopped_process_is_named_by_its_pid(server, version):
    """A process that does not answer (stopped, or hung in the kernel) is listed by pid in the
    job's INCOMPLETE part (text) or as an unresponsive missing rank (JSON); the pid maps to its
    global rank even where the communicator part gives only its number (2.24/2.25)."""
    job = job_of(4, set(), missing={1})
    by_pid = {r.pid: 20 + r.rank for r in job.ranks}
    st = ras.query(server(job, version).addr)
    v = ras_verdict(st, lambda host, pid: by_pid.get(pid))
    assert v.culprits == [21], v.text
    assert "does not answer" in v.text


def test_ranks_of_a_sub_communicator_are_not_taken_for_the_jobs(server):
    """A sub-group's communicator numbers its ranks from 0: without a pid mapping its culprit is
    said with its communicator, never blamed as the job's rank of that number; with the
    mapping it is the job's rank."""
    world = job_of(4, set(), op=100)
    sub = Job([Rank(i, world.ranks[g].pid, world.ranks[g].host, gpu=g, counts={"AllReduce": 50 - (g == 3)})
               for i, g in enumerate((2, 3))], comm_hash=0x51B)
    world.others.append(sub)
    s = server(world)
    v = ras_verdict(ras.query(s.addr))
    assert v.culprits == [] and "rank 1 of communicator 51b (2 ranks" in v.text
    by_pid = {r.pid: r.rank for r in world.ranks}
    v = ras_verdict(ras.query(s.addr), lambda host, pid: by_pid.get(pid))
    assert v.culprits == [3]


def test_the_query_waits_out_nccls_own_wait_and_keeps_a_cut_report(server):
    """NCCL may take its TIMEOUT plus 5 s when a peer does not answer: the query allows for it;
    a server that stops in the middle of its report gives what came, marked as cut."""
    s = RasServer(lambda: job_of(4, {3}), gather=6.0)
    try:
        st = ras.query(s.addr, timeout=9)
        assert not st.partial and ras_verdict(st).culprits == [3]
        assert s.queries[-1].split("|")[1] == "TIMEOUT 3"
    finally:
        s.close()
    job = job_of(4, {3})
    full = RasServer(lambda: job, version="2.27.3").text_report(job)
    cut = full.index("Rank 3 has launched") + len(full[full.index("Rank 3 has launched"):].split("\n")[0]) + 1
    s = RasServer(lambda: job, version="2.27.3", stall_at=cut)
    try:
        st = ras.query(s.addr, timeout=2, json_format=False)
        v = ras_verdict(st)
        assert st.partial and v.culprits == [3] and "cut at ddptop's deadline" in v.text
    finally:
        s.close()


def test_a_report_known_to_be_garbled_by_its_version_says_so(server):
    world = job_of(4, set(), missing={1})
    world.others.append(Job([Rank(0, 5000, "10.0.0.7", counts={"AllReduce": 3}),
                             Rank(1, 5001, "10.0.0.7", counts={"AllReduce": 3}, missing=True)], comm_hash=0xABC))
    for version, garbled in (("2.27.3", True), ("2.29.2", False)):
        v = ras_verdict(ras.query(server(world, version).addr, json_format=False))
        assert ("may garble this report" in v.text) is garbled, v.text


def test_a_healthy_job_says_nothing(server):
    v = ras_verdict(ras.query(server(job_of(4, set())).addr))
    assert v.culprits == [] and v.text == ""


def test_whole_second_timeouts_and_no_json_before_2_28_7(server):
    """ddptop sends TIMEOUT as an integer (fractions are refused up to
    2.29.2), and reads the text report when SET FORMAT is unknown."""
    s = server(job_of(2, {1}), "2.27.3")
    ras.query(s.addr, timeout=2.5)
    cmds = s.queries[-1].split("|")
    assert cmds[1] == "TIMEOUT 1" and cmds[-1] == "VERBOSE STATUS" and "SET FORMAT json" in cmds


def test_no_server_and_not_a_ras_server_are_clear_errors():
    import socket

    port = ras.free_port()
    with pytest.raises(RasError, match="refused"):
        ras.query(f"127.0.0.1:{port}", timeout=1)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        import threading

        def hello():
            c, _ = srv.accept()
            c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            c.close()
        threading.Thread(target=hello, daemon=True).start()
        with pytest.raises(RasError, match="is not NCCL RAS"):
            ras.query(f"127.0.0.1:{srv.getsockname()[1]}", timeout=2)
    finally:
        srv.close()


def test_addresses_as_nccl_reads_them():
    assert ras.parse_addr("localhost:28028") == ("localhost", 28028)
    assert ras.parse_addr("[::1]:12345") == ("::1", 12345)
    for bad in ("localhost", "host:0", ":28028", "a b:1"):
        with pytest.raises(ValueError):
            ras.parse_addr(bad)


def test_damaged_answers_never_crash_the_parsers():
    """Truncated and garbled reports: parsed as far as they go, never an exception."""
    s = RasServer(lambda: job_of(4, {1}, missing={2}))
    try:
        for fmt, body in (("json", s.json_report(s.job())), ("text", s.text_report(s.job()))):
            rng = random.Random(fmt)
            for cut in range(0, len(body), max(1, len(body) // 60)):
                ras_verdict(ras_parse.parse(body[:cut], fmt))
            for _ in range(50):
                b = list(body)
                for _ in range(10):
                    b[rng.randrange(len(b))] = rng.choice("{}[]\",:0 \nA")
                ras_verdict(ras_parse.parse("".join(b), fmt))
    finally:
        s.close()


def test_monitor_lines_as_nccl_writes_them():
    e = ras_parse.parse_monitor_line("[2025-12-19 13:07:07] PEER_DEAD: Process 1524345 on node 172.16.64.245 managing GPU 1 ")
    assert (e.event, e.pid, e.host, e.details) == ("PEER_DEAD", 1524345, "172.16.64.245", "")
    e = ras_parse.parse_monitor_line("[2025-12-19 13:07:07] PEER_UNRESPONSIVE: Process 7 on node 10.0.0.2 managing GPUs "
                               "0,1 peer not responding for 5s (keepalive warning)")
    assert e.pid == 7 and e.details == "peer not responding for 5s (keepalive warning)"
    e = ras_parse.parse_monitor_line("[2025-12-19 13:07:07] PEER_DEAD: 10.0.0.9<28028>")
    assert e.pid == -1 and e.details == "10.0.0.9<28028>"
    assert ras_parse.parse_monitor_line("RAS Monitor Mode - watching") is None


def test_without_monitor_before_2_29_it_is_said_once(server):
    """An older server answers MONITOR with an error: the follower says so once and stops asking."""
    import threading
    from pathlib import Path

    from ddptop.core.model.events import NoteEvent
    from ddptop.core.sources.ras_probe import RasProbe

    s = server(job_of(2, set()), "2.28.9")
    got: list = []
    done = threading.Event()

    def emit(evs):
        got.extend(evs)
        done.set()
    probe = RasProbe(lambda: s.addr, Path("/nonexistent"), lambda: {}, emit)
    probe.start_monitor()
    assert done.wait(10)
    assert probe._monitor.wait(5)  # (the follower has ended)
    assert len(got) == 1 and isinstance(got[0], NoteEvent) and "NCCL before 2.29" in got[0].message


def test_one_version_parser_reads_nccls_package_versions():
    """NCCL's package versions carry a build part (2.29.1-1): the guard for the versions whose RAS must not
    be asked often (2.26 to 2.29.1) must see 2.29.1, not 2.29.11."""
    from ddptop.core.model.version_numbers import version_tuple

    assert version_tuple("2.29.1-1") == (2, 29, 1) and version_tuple("2.29.2+cuda12.8") == (2, 29, 2)
    assert (2, 26) <= version_tuple("2.29.1-1") < (2, 29, 2)
    assert version_tuple("2.4.0+cu121") == (2, 4, 0) and version_tuple("") == () and version_tuple(None) == ()


def test_two_answers_in_one_second_are_both_kept_and_diagnose_reads_the_later(server, tmp_path):
    """The raw answers beside a stall's stacks: a second query within the same second keeps its own file (it
    used to overwrite the first), named so that it sorts after it, as `ddptop diagnose` takes the last."""
    from pathlib import Path

    from ddptop.core.tools.diagnose import ras_reports
    from ddptop.core.sources.ras_probe import RasProbe
    from helpers import wait_for

    s = server(job_of(2, {1}))
    got: list = []
    probe = RasProbe(lambda: s.addr, tmp_path, lambda: {}, got.extend)
    for n in (1, 2):
        assert probe.request()
        wait_for(lambda: len(got) >= n, what=f"answer {n}")
    files = sorted((tmp_path / "stacks").glob("*-ras.*"))
    assert len({e.file for e in got}) == 2 and sorted(e.file for e in got) == [str(f) for f in files]
    assert files[-1] == Path(got[-1].file)  # (the later answer sorts last)
    assert ras_reports([str(tmp_path)])[0]["file"] == got[-1].file
