"""`ddptop diagnose` beyond its catalogue: the time stamps of each tool's lines, and the order of time.
(The real `ddptop diagnose --json` on open-world logs: tests/integration/test_open_world_e2e.py.)"""

from __future__ import annotations

import pytest

from ddptop.core.analysis.timestamps import Clock, line_time


# --------------------------------------------------------------------------- time stamps


@pytest.mark.parametrize("line,month,day,secs,year", [
    ("[rank1]:[E1126 13:56:19.368540810 ProcessGroupNCCL.cpp:632] [Rank 1] ...", 11, 26, 50179.368540810, None),
    ("E1126 13:56:19.368000 4711 torch/distributed/elastic/multiprocessing/api.py:1002] failed", 11, 26, 50179.368, None),
    ("[2024-11-26 13:56:19,368] torch.distributed.elastic.agent.server.api: [ERROR] ...", 11, 26, 50179.368, 2024),
    ("2024-11-26T13:56:19.368Z node-1:11:12 [0] NCCL WARN ...", 11, 26, 50179.368, 2024),
    ("slurmstepd: error: *** STEP 6053.0 ON node1 CANCELLED AT 2024-04-23T12:18:08 ***", 4, 23, 44288.0, 2024),
    ("[Tue Nov 26 13:56:19 2024] NVRM: Xid (PCI:0000:3b:00): 79", 11, 26, 50179.0, 2024),
])
def test_each_tools_stamp_is_read(line, month, day, secs, year):
    st = line_time(line)
    assert st is not None and (st.month, st.day, st.year) == (month, day, year)
    assert st.seconds == pytest.approx(secs)


def test_an_untimed_line_takes_the_time_before_it_and_a_yearless_stamp_the_files_year():
    c = Clock(year=2023)
    t1 = c.read("E1126 13:56:19.000000 1 x.py:1] a")
    assert c.read("    a line with no stamp") == t1
    assert line_time("E1126 13:56:19.000000 1 x.py:1] a").at(2023) == t1
    c2 = Clock(year=2020)
    c2.read("[2024-11-26 10:00:00,000] first")  # (the year the other stamps give wins over the file's)
    assert c2.read("E1126 10:00:01.000000 1 x.py:1] b") == line_time("[2024-11-26 10:00:01,000] x").at()
