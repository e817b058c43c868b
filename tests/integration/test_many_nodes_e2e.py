"""16 nodes in one `ddptop --json attach --slurm`: more nodes than the other
multi-node tests, over the real wire protocol (issue 35).

The scale benchmark's set-up at a size a test can afford (tests/bench/scale_bench.py):
ddptop runs `srun ... ddptop agent` per node as on a cluster; node-0's is the
real `ddptop agent` reading a journal written to disk, the 15 others are
served by one simulator process speaking the same protocol (tests/bench/scale_sim.py).
Rank 25 (node-12) stops stepping 14 s in; every other rank blocks in the
next all-reduce; 40 s in, the job is stopped.
"""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from ddptop.core.analysis.note_folds import NoteFolder  # noqa: E402
from ddptop.core.model.events import NoteEvent  # noqa: E402
from scale_bench import run_one  # noqa: E402

NODES, PER_NODE = 16, 2


# (with the other tests, under -n: its 16 simulated nodes, their links and the viewer take about 2 CPU-s in
# 40 s; the alarm, about 6 s after the missed step when alone, has 26 s before the job's end)
def test_sixteen_nodes_one_alarm_naming_the_rank_and_its_node_and_their_notes_counted():
    o = run_one(NODES, PER_NODE, "issue", "headless", seconds=40.0, stop_at=14.0, burst=20, real_node="node-0",
                quiet=True)
    said = f"viewer stderr: {o['view_err'][-1500:]}\nsimulator stderr: {o['sim_err'][-800:]}"
    assert o["ups"] == NODES, said  # every link up
    # the hung job is stopped at its end (exit 143, as SIGTERM to its supervisor): the view ends with it, its code
    assert o["viewer_exit"] == 143, said
    assert not o["leftover"], o["leftover"]  # nothing this test started is left running
    # one hang, one alarm: the rank that stopped and its node, named
    assert o["stall_alarms"] == 1, said
    assert o["alarm_culprit"] and o["alarm_node"], o.get("alarm_message")
    # the notes every node makes alike (its stack capture's three, its own stall alarm folded into the one
    # shown, its job's end) are counted, not listed: no kind of note comes from more than a few nodes (the
    # first, and the count at the end of each 30 s window), where each would come from all 16
    kinds: dict = {}
    for n in o["note_list"]:
        ev = NoteEvent(0.0, n["level"], n["message"], node=n["node"])
        kinds.setdefault(NoteFolder.key(ev), set()).add(n["node"])
    assert kinds and max(len(nodes) for nodes in kinds.values()) <= 3, o["note_list"]
    assert any(" more notes like “" in n["message"] for n in o["note_list"]), o["note_list"]
