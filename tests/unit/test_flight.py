"""Flight-recorder dumps: ddptop's reading of them.

(What runs processes: tests/integration/test_flight_e2e.py.)"""

import io
import json
import pickle

from ddptop.core.sources import flight_recorder as flight


def entry(seq, op="gloo:all_reduce", sizes=((4,),), state="scheduled", pg=("0", "default_pg"), p2p=False):
    return {"record_id": seq, "pg_id": 0, "process_group": pg, "collective_seq_id": seq, "p2p_seq_id": 0,
            "profiling_name": op, "input_sizes": [list(s) for s in sizes], "state": state, "is_p2p": p2p}


def dump(*entries):
    return {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": list(entries)}


def test_the_rank_that_never_joined_is_named():
    rep = flight.analyse({0: dump(entry(40), entry(41, sizes=((1,),))), 1: dump(entry(39), entry(40)),
                          2: dump(entry(41, sizes=((1,),)))})
    assert rep.culprits == [1]
    assert rep.findings == ["process group 0 (default_pg): ranks 0, 2 are in collective #41 (gloo:all_reduce [[1]]); "
                            "rank 1 stopped at #40 (gloo:all_reduce [[4]], scheduled): rank 1 never joined"]


def test_a_collective_mismatch_is_named():
    rep = flight.analyse({0: dump(entry(7)), 1: dump(entry(7)), 2: dump(entry(7, op="gloo:broadcast"))})
    assert rep.culprits == [2]
    assert "collective #7 differs between ranks" in rep.summary()
    assert "rank 2 gloo:broadcast [[4]]" in rep.summary() and "ranks 0, 1 gloo:all_reduce [[4]]" in rep.summary()


def test_ranks_in_step_and_missing_dumps():
    rep = flight.analyse({0: dump(entry(3, state="completed")), 1: dump(entry(3, state="completed"))})
    assert rep.culprits == [] and "every rank is at the same collective: process group 0 (default_pg) at #3" in rep.summary()
    rep = flight.analyse({0: dump(entry(3))}, expected=[0, 1])
    assert rep.culprits == [1] and rep.findings[0].startswith("no dump from rank 1")
    assert flight.analyse({0: dump(entry(1, p2p=True))}).findings == ["no collective recorded yet on any rank"]


def test_dumps_load_as_plain_data_only(tmp_path):
    (tmp_path / "rank_0").write_bytes(pickle.dumps(dump(entry(1))))
    (tmp_path / "rank_1").write_text(json.dumps(dump(entry(1))))
    (tmp_path / "rank_2").write_bytes(pickle.dumps(io.BytesIO(b"x")))  # a class: refused, never instantiated
    (tmp_path / "rank_3").write_bytes(b"\x00garbage")
    (tmp_path / "notes.txt").write_text("not a dump")
    dumps, problems = flight.load_dir(tmp_path)
    assert sorted(dumps) == [0, 1]
    assert len(problems) == 2 and problems[0].startswith("rank_2: unreadable (UnpicklingError: refusing to load")
    assert problems[1].startswith("rank_3: unreadable")
