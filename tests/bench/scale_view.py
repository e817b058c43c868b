"""The TUI side of ``bench.py scale``: ``ddptop attach --slurm JOB`` in Textual's
headless driver (160x45, as ``bench.py ui64``), in this process, so that the
bench measures it from outside (RSS, CPU, threads, fds) and it measures its own
event-loop lag (a 50 ms timer's lateness) and sees the events the view is fed
(the session's ``poll``, wrapped; the session read in a process of its own, as
``ddptop attach`` does for the UI, or with ``--in-process`` here: when each node's link came up, the stall
alarms and when they came).  Writes what it saw to ``--out`` (JSON) when the
job has ended or ``--until`` (a unix time) has passed.

    python tests/bench/scale_view.py --slurm 4242 --remote "PYTHON -m ddptop" --until T --out F

(PATH, $DDPTOP_FAKE_CLUSTER and $DDPTOP_SCALE_*: as ``bench.py scale`` sets them.)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--slurm", required=True)
    p.add_argument("--remote", required=True)
    p.add_argument("--until", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--size", default="160x45")
    p.add_argument("--in-process", action="store_true", help="read the job in this process (before issue 35's hosting)")
    a = p.parse_args()
    t_start = time.time()

    from ddptop.cli import _slurm_hosts
    from ddptop.core.model.events import AlarmEvent, LinkEvent, LogBatch
    from ddptop.core.sessions.factory import AttachRequest, open_target
    from ddptop.core.sessions.hosted import HostedSession
    from ddptop.ui.app import make_app

    hosts = _slurm_hosts(a.slurm)
    req = AttachRequest(slurm_job=a.slurm, slurm_hosts=tuple(hosts), via="srun", remote_cmd=a.remote)
    if a.in_process:
        session = open_target(req).session
    else:  # as `ddptop attach` opens it for the UI: read in a process of its own
        session = HostedSession.start(functools.partial(open_target, req)).session
    seen: dict = {"ups": {}, "links": [], "alarms": [], "notes": 0, "lines": 0, "lat": [], "first_frame": None}
    poll = session.poll

    def watched():
        evs = poll()
        now = time.time()
        for e in evs:
            if isinstance(e, LogBatch):
                seen["lines"] += len(e.texts)
                if seen["lines"] % 97 < len(e.texts):
                    seen["lat"].append((now, now - e.t))
            elif isinstance(e, LinkEvent):
                seen["links"].append((now, e.node, e.state, e.message))
                if e.state == "up":
                    seen["ups"].setdefault(e.node, now)
            elif isinstance(e, AlarmEvent) and e.type == "stall":
                seen["alarms"].append({"t": now, "culprits": list(e.culprits), "node": e.node,
                                       "where_nodes": {str(r): w.node for r, w in e.where.items()},
                                       "id": e.id, "message": e.message[:600]})
            elif e.kind == "note":
                seen["notes"] += 1
        return evs

    session.poll = watched
    w, h = (int(x) for x in a.size.split("x"))
    lags: list[tuple[float, float]] = []

    async def run() -> None:
        app = make_app(session)
        async with app.run_test(size=(w, h)) as pilot:
            await pilot.pause()
            seen["first_frame"] = time.time() - t_start
            last = [time.monotonic()]

            def beat() -> None:
                now = time.monotonic()
                lags.append((time.time(), (now - last[0] - 0.05) * 1000))
                last[0] = now

            app.set_interval(0.05, beat)
            while time.time() < a.until and not session.finished:
                await pilot.pause(0.5)

    try:
        asyncio.run(run())
    except Exception as e:  # noqa: BLE001 - said in the output, the bench prints it
        seen["error"] = f"{type(e).__name__}: {e}"
    finally:
        session.close()
    seen["lags"] = lags
    Path(a.out).write_text(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
