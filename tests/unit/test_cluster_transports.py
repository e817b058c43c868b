"""Attach where ssh does not reach (issue 27), the pure parts: names that never become options, which
readers a launching ddptop waits for, what a pod's state says about its node's next attempt.  (srun, kubectl
and ssh for real: tests/integration/test_cluster_transports_e2e.py.)"""

from __future__ import annotations

import pytest

from ddptop.core.sessions import k8s_pods as k8s
from ddptop.core.sessions.transports import Kubectl, Srun


# ---- SLURM ------------------------------------------------------------------------------------------------


def test_names_from_a_person_or_a_cluster_never_become_options():
    for bad in ("-x", "--overlap", "a b", "node;rm"):
        with pytest.raises(ValueError):
            Srun("4242", bad)
        with pytest.raises(ValueError):
            Kubectl(bad)
    with pytest.raises(ValueError):
        Srun("--jobid=1", "node-a")
    with pytest.raises(ValueError):
        Kubectl("trainer-0", container="-c")
    with pytest.raises(ValueError):
        Srun("1", "n").argv(["--help"])  # (the program must not look like an option)
    with pytest.raises(k8s.K8sError):
        k8s.selector_ok("--all-namespaces")
    words = Kubectl("trainer-0", "pytorch", "ml", "kind-x").argv(["ddptop", "agent", "--run", "a b;c"])
    assert words[-4:] == ["ddptop", "agent", "--run", "a b;c"] and "--" in words  # (one argv element each)


PYTORCHJOB = {"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/operator-name": "pytorchjob-controller"}


# ---- Kubernetes ---------------------------------------------------------------------------------------------


def test_a_launching_ddptop_waits_for_live_readers_only(tmp_path):
    """``readers/<pid>``: an agent streaming the run; a stale one (its process gone) holds nothing up."""
    from ddptop.core.model import run_dirs
    from ddptop.core.run import journal

    run = tmp_path / "run"
    run.mkdir()
    (run / run_dirs.READERS).mkdir()
    (run / run_dirs.READERS / "999999").write_text('{"pid": 999999, "create_time": 1.0}')
    assert journal.wait_for_readers(run, 10)  # (True: none left, not the 10 s run out)
    me = journal.add_reader(run)
    assert me is not None and not journal.wait_for_readers(run, 0.3)
    me.unlink()
    assert journal.wait_for_readers(run, 10)


# ---- a pod that restarts is a new attempt of its node -------------------------------------------------------


def _pod(phase="Running", state=None, last=None, restarts=0, policy="OnFailure", uid="u1", deleting=False):
    st = {"name": "pytorch", "restartCount": restarts, **({"state": state} if state else {}),
          **({"lastState": last} if last else {})}
    return k8s.describe({"metadata": {"name": "bert-worker-0", "uid": uid, "labels": {
        **PYTORCHJOB, "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"},
        **({"deletionTimestamp": "2026-11-26T05:00:00Z"} if deleting else {})},
        "spec": {"containers": [{"name": "pytorch"}], "restartPolicy": policy},
        "status": {"phase": phase, "containerStatuses": [st]}})


def test_the_cluster_says_whether_a_node_gets_another_attempt():
    """What `kubectl get pods -o json` says of a node whose run ended, read the kubelet's way."""
    running = {"running": {"startedAt": "2026-11-26T05:00:00Z"}}
    oom = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    before = _pod(state=running)
    assert k8s.outlook(_pod(state=running), before).kind == "same"
    # OnFailure, crashed: the kubelet backs off, then restarts it; the attempt's end is lastState
    look = k8s.outlook(_pod(state={"waiting": {"reason": "CrashLoopBackOff"}}, last=oom), before)
    assert (look.kind, look.exit_code, look.reason) == ("restarting", 137, "OOMKilled"), look
    assert "CrashLoopBackOff" in look.message
    look = k8s.outlook(_pod(state=running, last=oom, restarts=1), before)
    assert (look.kind, look.exit_code) == ("restarting", 137) and "restart 1" in look.message
    # a recreated pod (another uid) is the same node's next attempt
    assert k8s.outlook(_pod(uid="u2", phase="Pending"), before).kind == "restarting"
    # the pod completed: no next attempt
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    assert (k8s.outlook(_pod("Succeeded", done), before).kind, k8s.outlook(_pod("Succeeded", done), before).exit_code) \
        == ("ended", 0)
    # failed for good (Never): only the job's controller may make another pod
    look = k8s.outlook(_pod("Failed", {"terminated": {"exitCode": 1, "reason": "Error"}}, policy="Never"), before)
    assert (look.kind, look.exit_code) == ("unsure", 1) and "Never" in look.message
    assert k8s.outlook(None, before).kind == "unsure"
    assert k8s.outlook(_pod(state=running, deleting=True), before).kind == "unsure"
    # a pod kept Failed beside its Pending replacement (listed after it, by name): the replacement is the node
    failed = {"metadata": {"name": "bert-worker-0-zz", "uid": "u1", "creationTimestamp": "2026-11-26T05:00:00Z",
                           "labels": {**PYTORCHJOB, "training.kubeflow.org/replica-type": "worker",
                                      "training.kubeflow.org/replica-index": "0"}},
              "spec": {"containers": [{"name": "pytorch"}]}, "status": {"phase": "Failed"}}
    pending = {**failed, "metadata": {**failed["metadata"], "name": "bert-worker-0-aa", "uid": "u2",
                                      "creationTimestamp": "2026-11-26T05:03:00Z"}, "status": {"phase": "Pending"}}
    (node,) = k8s._nodes([pending, failed], "")
    assert node.name == "bert-worker-0-aa"
    assert k8s.outlook(node, before).kind == "restarting" and k8s.outlook(node, before).coming
