"""The UI's pieces as plain functions, with no app running: theme files, the header's link states, the GPU
pane's sparkline, the alarm box, a rank's row, the benchmark's heat map.  (The app itself, under Pilot, is
tests/ui.)"""

from __future__ import annotations

import pytest

pytest.importorskip("textual")

from textual.content import Content  # noqa: E402

from ddptop.core.model.events import LinkEvent  # noqa: E402
from ddptop.core.tools.p2p_bench import Row  # noqa: E402
from ddptop.ui.alarm_box import alarm_markup  # noqa: E402
from ddptop.ui.gpu_pane import sparkline  # noqa: E402
from ddptop.ui.header import link_markup  # noqa: E402
from ddptop.ui.theme_files import load_themes  # noqa: E402
from ddptop.ui.tool_screens import matrix_text  # noqa: E402


def test_a_broken_theme_file_is_skipped_and_named_with_its_line(tmp_path):
    good = load_themes()
    (tmp_path / "broken.toml").write_text('name = "mine"\nprimary = \n')
    errors: list[str] = []
    assert load_themes([tmp_path], errors=errors) == []
    assert len(errors) == 1 and "broken.toml" in errors[0] and "line 2" in errors[0], errors
    assert good  # (the shipped ones still load)


def test_link_states_in_the_header():
    t = 1000.0

    def plain(links, now=t):
        return Content.from_markup(link_markup(links, now)).plain

    assert link_markup({}, t) == ""
    links = {"node-a": LinkEvent(t, node="node-a", state="up"),
             "node-b": LinkEvent(t, node="node-b", state="down", message="reset", retry_in=2.0)}
    assert plain(links, t + 0.2) == "attached  node-a ● up   node-b ○ down, retry in 2s"
    assert plain(links, t + 1.5).endswith("retry in 1s")
    assert plain(links, t + 3).endswith("○ down, retrying…")
    many = {f"n{i}": LinkEvent(t, node=f"n{i}", state="up") for i in range(7)}
    many["n3"] = LinkEvent(t, node="n3", state="failed", message="no ddptop")
    many["n5"] = LinkEvent(t, node="n5", state="connecting")
    assert plain(many) == "attached  7 nodes: 5 up, 1 failed, 1 connecting   n3 ✗ failed   n5 ◌ connecting"


def test_sparkline():
    assert sparkline([0, 50, 100], 5) == "  ▁▅█"
    assert sparkline([None, 100], 2) == " █"
    assert len(sparkline(range(100), 24)) == 24


def test_alarm_box_offers_r_only_for_jobs_ddptop_can_relaunch():
    from ddptop.core.model.events import AlarmEvent
    from ddptop.core.analysis.job_state import JobState

    model = JobState()
    model.apply([AlarmEvent(1.0, type="stall", id="stall-hang", culprits=(1,), message="no step for 10 s",
                            suggested_profiles=("p2p-off",))])
    ours, level = alarm_markup(model)
    theirs, _ = alarm_markup(model, can_relaunch=False)
    assert level == "error" and "--profile p2p-off" in ours and "--profile p2p-off" in theirs
    assert "(r relaunches)" in ours
    assert "r relaunches" not in theirs and "did not start this job" in theirs


def test_an_ended_rank_shows_no_live_process_figures():
    """After a rank exits its row must not keep saying `running` at 66% CPU."""
    from ddptop.core.model.events import ProcEvent
    from ddptop.core.analysis.job_state import RankInfo
    from ddptop.ui.rank_rows import rank_cells

    sample = ProcEvent(1.0, rank=0, pid=42, cpu=66.0, rss=300 << 20, status="running", threads=4,
                       children=2, children_cpu=10.0, gpu=0, gpu_mapping="nvml")
    live = rank_cells(RankInfo(0, pid=42, alive=True, proc=sample), False, None)
    assert str(live["cpu"]) == "66%" and str(live["status"]) == "running" and live["workers"] == "2 (10%)"
    gone = rank_cells(RankInfo(0, pid=42, alive=False, proc=sample), False, None)
    assert str(gone["cpu"]) == "-" and str(gone["status"]) == "ended" and gone["workers"] == "-"
    assert str(gone["rss"]) == "300 MiB" and gone["gpu"] == "0"  # last size and where it ran


def test_the_heat_map_marks_slow_and_hung_pairs():
    rows = [Row("copy p2p", "0->1", gbs=40.0, pct=90.0), Row("copy p2p", "1->0", gbs=10.0, pct=22.0),
            Row("copy p2p", "0->2", status="hang", message="no answer"), Row("copy p2p", "2->0", gbs=39.0),
            Row("copy p2p", "1->2", gbs=38.0), Row("copy p2p", "2->1", gbs=12.0), Row("allreduce", "2 ranks")]
    t = matrix_text(rows)
    lines = t.plain.splitlines()
    assert lines[1].split() == ["0", "1", "2"]
    assert lines[2].split() == ["0", "-", "40.0", "HANG"]
    styles = {t.plain[s.start:s.end].strip(): str(s.style) for s in t.spans}
    assert styles["40.0"] == "black on green" and styles["10.0"] == "white on red"  # 90% / 22% of the link
    assert styles["HANG"] == "bold white on red"
    assert styles["12.0"] == "white on red" and styles["38.0"] == "black on green"  # no link rate: vs the best pair
    assert matrix_text([Row("allreduce", "2 ranks")]) is None
