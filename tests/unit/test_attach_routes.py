"""Which `ddptop attach` requests watch other nodes (ssh, srun, kubectl): the UI reads those in a process of its
own (``factory.reaches_nodes``), decided as ``open_target`` decides, without opening anything."""

from __future__ import annotations

import pytest

from conftest import write_run
from ddptop.core.sessions.factory import AttachRequest, K8sRequest, OpenError, reaches_nodes


@pytest.fixture
def a_run(tmp_path, monkeypatch):
    monkeypatch.setenv("DDPTOP_RUNS_DIR", str(tmp_path / "runs"))
    run = write_run(tmp_path / "runs", run_id="20260101-000000-00001", events=[], logs={0: "step 1\n"})
    return run.rename(tmp_path / "runs" / "20260101-000000-00001")


@pytest.mark.parametrize("req, nodes", [
    (AttachRequest(), False),  # the newest run here, or the one torchrun job here
    (AttachRequest(targets=("20260101-000000-00001",)), False),  # a run id here
    (AttachRequest(targets=("latest",)), False),
    (AttachRequest(targets=("./some/run/dir",)), False),  # a path: this machine's (or an error)
    (AttachRequest(targets=("pid:4242",)), False),
    (AttachRequest(pid=4242), False),
    (AttachRequest(targets=("node-a",)), True),  # not a run here: a host
    (AttachRequest(targets=("node-a:latest",)), True),
    (AttachRequest(targets=("node-a", "node-b")), True),
    (AttachRequest(hosts=("node-a",)), True),  # --hosts-file
    (AttachRequest(slurm_job="42", slurm_hosts=("n1", "n2")), True),
    (AttachRequest(targets=("node-a",), pid=4242), True),  # a job by pid on that node
    (AttachRequest(k8s=K8sRequest(name="train")), True),
])
def test_what_reaches_other_nodes(a_run, req, nodes):
    assert reaches_nodes(req) is nodes


def test_what_open_target_refuses_is_refused_before_anything_opens(a_run):
    with pytest.raises(OpenError, match="--pid cannot be combined with a RUN"):
        reaches_nodes(AttachRequest(targets=("20260101-000000-00001",), pid=4242))
    with pytest.raises(OpenError, match="--pid takes one HOST at most"):
        reaches_nodes(AttachRequest(targets=("node-a", "node-b"), pid=4242))
