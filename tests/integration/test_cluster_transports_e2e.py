"""Attach where ssh does not reach (issue 27): a SLURM job's nodes through
``srun --jobid J --overlap``, Kubernetes pods through ``kubectl exec``, with
the same merged view and resume as over ssh.  srun and kubectl are stood in
for at the cluster boundary (tests/support/fake_cluster.py); ssh is the real sshd.

(The pure parts: tests/unit/test_cluster_transports.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import EXAMPLE, ROOT, TIMEOUT, ddptop_cmd, json_events, rank_started, wait_for, write_run
from fake_cluster import BIN, FakeCluster, _child, ddptop_words, unshare_works
from helpers import free_port, per_line
from test_attach_ssh import drain

from ddptop.core.sessions import k8s_pods as k8s
from ddptop.core.run.journal import load_meta, rank_log_files
from ddptop.core.run.run_session import Session
from ddptop.core.sessions.ssh import RemoteSession
from ddptop.core.sessions.transports import Kubectl, Srun

REMOTE = " ".join(ddptop_words())


@pytest.fixture(scope="module")
def slurm_queries_only(tmp_path_factory):
    """A PATH with SLURM's squeue and scontrol stand-ins but no srun (a login node without it)."""
    d = tmp_path_factory.mktemp("bin")
    for tool in ("squeue", "scontrol"):
        (d / tool).symlink_to(BIN / tool)
    return d


@pytest.fixture
def cluster(tmp_path):
    c = FakeCluster(tmp_path / "cluster")
    yield c
    c.close()


def finished_run(root, rank: int, text: str):
    return write_run(root, events=[rank_started(1.0, rank, 11), {"t": 2.0, "kind": "state", "state": "succeeded",
                                                                   "exit_code": 0}],
                     logs={rank: text}, nproc=1, exit={"state": "succeeded", "exit_code": 0})


# ---- SLURM ------------------------------------------------------------------------------------------------


def test_attach_slurm_reaches_each_node_through_srun(tmp_path, cluster):
    for n, rank in (("node-a", 0), ("node-b", 1)):
        finished_run(tmp_path / n, rank, f"hello from {n}\n")
    cluster.slurm_job("4242", {"node-a": tmp_path / "node-a", "node-b": tmp_path / "node-b"})
    r = subprocess.run(ddptop_cmd("--json", "attach", "--slurm", "4242", "--remote-ddptop", REMOTE),
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, env=cluster.env())
    assert r.returncode == 0, r.stderr
    assert "through srun (job 4242, --overlap)" in r.stderr
    ev = json_events(r.stdout)
    ups = [e for e in ev if e["kind"] == "link" and e["state"] == "connecting"]
    assert {e["node"] for e in ups} == {"node-a", "node-b"}
    assert all(e["message"].startswith("srun --jobid=4242 --nodelist=") for e in ups), ups
    assert {(e["node"], e["text"]) for e in ev if e["kind"] == "log"} == {("node-a", "hello from node-a"),
                                                                           ("node-b", "hello from node-b")}
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "succeeded"


def test_attach_slurm_errors_are_clear(tmp_path, cluster, slurm_queries_only):
    cluster.slurm_job("4242", {"node-a": tmp_path / "node-a"})
    r = subprocess.run(ddptop_cmd("--json", "attach", "--slurm", "99", "--remote-ddptop", REMOTE),
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, env=cluster.env())
    assert r.returncode == 2 and "Invalid job id specified" in r.stderr, r.stderr
    r = subprocess.run(ddptop_cmd("attach", "--slurm", "4242", "--via", "srun"), capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=ROOT, env=dict(cluster.env(), PATH=f"{slurm_queries_only}:/usr/bin:/bin"))
    assert r.returncode == 2 and "--via srun needs `srun`" in r.stderr, r.stderr
    r = subprocess.run(ddptop_cmd("attach", "--via", "ssh", "node-a"), capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=ROOT)
    assert r.returncode == 2 and "--via chooses how to reach a --slurm job's nodes" in r.stderr


PYTORCHJOB = {"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/operator-name": "pytorchjob-controller"}


# ---- Kubernetes ---------------------------------------------------------------------------------------------


def test_pods_are_found_and_ordered_by_each_operators_labels(tmp_path, cluster):
    """No pod needs to run for discovery: `kubectl get pods -o json`, as the API answers it."""
    def listed(name, labels, annotations=None, containers=("pytorch",), phase="Running"):
        cluster.data["k8s"]["pods"].append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": labels, "annotations": annotations or {}},
            "spec": {"containers": [{"name": c} for c in containers]},
            "status": {"phase": phase, "containerStatuses": [{"name": c, "restartCount": 2} for c in containers]}})

    listed("bert-worker-1", {**PYTORCHJOB, "training.kubeflow.org/replica-type": "worker",
                             "training.kubeflow.org/replica-index": "1"})
    listed("bert-master-0", {**PYTORCHJOB, "training.kubeflow.org/replica-type": "master",
                             "training.kubeflow.org/replica-index": "0"})
    listed("bert-worker-0", {**PYTORCHJOB, "training.kubeflow.org/replica-type": "worker",
                             "training.kubeflow.org/replica-index": "0"})
    js = {"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/replicatedjob-name": "node"}
    listed("llama-node-0-1-x7k2p", {**js, "jobset.sigs.k8s.io/job-index": "0",
                                    "batch.kubernetes.io/job-completion-index": "1"},
           containers=("initializer", "node"))
    listed("llama-node-0-0-q9w4z", {**js, "jobset.sigs.k8s.io/job-index": "0",
                                    "batch.kubernetes.io/job-completion-index": "0"},
           containers=("initializer", "node"))
    listed("vc-train-worker-1", {"volcano.sh/job-name": "vc-train", "volcano.sh/task-spec": "worker"},
           annotations={"volcano.sh/task-index": "1"})
    listed("vc-train-worker-0", {"volcano.sh/job-name": "vc-train", "volcano.sh/task-spec": "worker"},
           annotations={"volcano.sh/task-index": "0"})
    cluster.save()
    env = cluster.env()
    old = dict(os.environ)
    os.environ.update(env)
    try:
        what, pods = k8s.find_pods("bert")
        assert what == "PyTorchJob" and [p.node for p in pods] == ["master-0", "worker-0", "worker-1"]
        assert {p.container for p in pods} == {"pytorch"} and pods[0].restarts == 2
        what, pods = k8s.find_pods("llama")
        assert what == "JobSet" and [(p.node, p.name, p.container) for p in pods] == [
            ("node-0", "llama-node-0-0-q9w4z", "node"), ("node-0-1", "llama-node-0-1-x7k2p", "node")]
        what, pods = k8s.find_pods("vc-train")
        assert what == "Volcano job" and [p.node for p in pods] == ["worker-0", "worker-1"]
        what, pods = k8s.find_pods(selector="training.kubeflow.org/replica-type=worker")
        assert [p.name for p in pods] == ["bert-worker-0", "bert-worker-1"]
        with pytest.raises(k8s.K8sError, match="no pods of a job named 'gpt'"):
            k8s.find_pods("gpt")
        with pytest.raises(k8s.K8sError, match="has no container 'main'"):
            k8s.find_pods("bert", container="main")
        with pytest.raises(k8s.K8sError, match="does not exist"):
            k8s.find_pods("bert", context="prod")
        # a name the cluster gives that could become an option is refused before use
        listed("-rf", {"app": "evil"})
        cluster.save()
        with pytest.raises(ValueError, match="not a valid name"):
            k8s.find_pods(selector="app=evil")
    finally:
        os.environ.clear()
        os.environ.update(old)


def pod_job(steps: int, *extra) -> list[str]:
    """A pod's command: ddptop in front of a one-rank torchrun of the example."""
    return [*ddptop_words(), "--headless", "--gpu", "sim", "torchrun", "--nproc-per-node", "1",
            EXAMPLE, "--steps", str(steps), "--step-time", "0.02", *extra]


needs_pid_namespaces = pytest.mark.skipif(unshare_works() is not None, reason=f"{unshare_works()}")


@needs_pid_namespaces
def test_attach_k8s_shows_each_pod_as_a_node(tmp_path, cluster):
    for i, role in enumerate(("master", "worker")):
        labels = {**PYTORCHJOB, "training.kubeflow.org/replica-type": role, "training.kubeflow.org/replica-index": "0"}
        cluster.pod(f"bert-{role}-0", labels, pod_job(30), tmp_path / f"runs-{i}",
                    env={"PET_MASTER_PORT": str(free_port())})
    for i in range(2):
        wait_for(lambda: any((tmp_path / f"runs-{i}").glob("*/meta.json")), what=f"pod {i}'s run")
    r = subprocess.run(ddptop_cmd("--json", "attach", "--k8s", "bert", "--remote-ddptop", REMOTE),
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, env=cluster.env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "PyTorchJob bert: master-0 (pod bert-master-0, container pytorch), worker-0" in r.stderr
    ev = json_events(r.stdout)
    steps = {(e["node"], e["text"]) for e in ev if e["kind"] == "log" and e["text"].startswith("step 30 ")}
    assert {n for n, _ in steps} == {"master-0", "worker-0"}, steps
    connecting = [e["message"] for e in ev if e["kind"] == "link" and e["state"] == "connecting"]
    assert any(m.startswith("kubectl exec bert-master-0 -c pytorch") for m in connecting), connecting
    # each pod's ddptop is its container's first process; it waited for the agent to send the run's end before
    # it exited (which ended the container, and the agent exec'd into it): the end is the run's own, not the
    # cluster's word
    ends = [e["message"] for e in ev if e["kind"] == "note" and "job succeeded" in e["message"]]
    assert len(ends) == 2 and all("torchrun exited with 0" in m for m in ends), ends


@needs_pid_namespaces
def test_a_pod_without_ddptop_says_what_to_add_to_the_image(tmp_path, cluster):
    labels = {**PYTORCHJOB, "training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"}
    cluster.pod("bert-master-0", labels, ["sleep", "600"], tmp_path / "runs", has_ddptop=False)
    r = subprocess.run(ddptop_cmd("--json", "attach", "--k8s", "bert"), capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=ROOT, env=cluster.env())
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "ddptop is not installed in pod bert-master-0's container pytorch" in out, out[-2000:]
    assert "Add it to the training image" in out and "--logs-only" in out


# ---- the same resume, whichever way the link goes ----------------------------------------------------------


def local_lines(run):
    s = Session.open(run)
    evs = []
    while not s.finished:
        evs += s.poll()
    return [(e.path, e.offset, e.text) for e in per_line(evs) if e.kind == "log" and not e.transient]


def steps_written(run) -> int:
    """How many step lines the run's ranks have written to their log files so far."""
    meta = load_meta(run)
    return sum(1 for _, _, stream, f in rank_log_files(Path(meta.log_dir)) if stream == "stdout"
               for line in f.read_text(errors="replace").splitlines() if line.startswith("step "))


def resumed(evs, after: int) -> bool:
    """A link made after the first ``after`` connections is up and has brought lines."""
    ups = [i for i, e in enumerate(evs) if e.kind == "link" and e.state == "up" and e.connects > after]
    return bool(ups) and any(e.kind == "log" and not e.transient for e in per_line(evs[ups[0] + 1:]))


DROP_STEPS = 400  # the job's steps (2 ranks: 2 x DROP_STEPS step lines)
MAX_DROPS = 5  # cuts of the link


class CutLink:
    """One link to the job, cut over and over: each cut once the new link carries lines again, and only while the
    job has more than 40 % of its lines still to write (so that it writes on after the last cut too)."""

    def __init__(self, via: str, rs: RemoteSession, drop):
        self.via, self.rs, self.drop = via, rs, drop
        self.evs: list = []
        self.drops = 0
        self.after = 0  # the connections made before the last cut
        self.written_at_drops: list[int] = []  # the job's step lines on disk at each cut

    def step(self, run) -> None:
        rs = self.rs
        self.evs += rs.poll()
        if len(self.written_at_drops) < MAX_DROPS and not rs.finished and rs.link == "up" and resumed(self.evs, self.after):
            written = steps_written(run)
            if written < 0.6 * 2 * DROP_STEPS:
                self.after = rs.connects
                n = self.drop()
                self.drops += n
                if n:
                    self.written_at_drops.append(written)


@pytest.mark.parametrize("vias", [("ssh", "srun"), ("kubectl",)], ids=["ssh+srun", "kubectl"])
def test_dropped_links_lose_and_duplicate_no_line(tmp_path, cluster, request, monkeypatch, vias):
    """The link cut over and over while a live job writes: every line arrives once, in order.  Every
    reconnection resumes a stream that goes on.  A job on this machine is followed through ssh and srun at once,
    each link cut on its own; kubectl reaches a job in its pod."""
    monkeypatch.setenv("PET_MASTER_PORT", str(free_port()))  # (a rendezvous port of its own)
    runs = tmp_path / "runs"
    job_args = ["--nproc-per-node", "2", EXAMPLE, "--steps", str(DROP_STEPS), "--step-time", "0.004"]
    job = None
    if "kubectl" in vias:
        if unshare_works() is not None:
            pytest.skip(unshare_works())
        # (the container stays up after the job, as one running `...; sleep infinity` does: a completed pod
        # cannot be exec'd into, so the run's end is read while it lives)
        cluster.pod("trainer-0", {"app": "t"}, ["sh", "-c", '"$@" > /dev/null; sleep 600', "sh", *ddptop_words(),
                                                "--json", "--gpu", "sim", "torchrun", *job_args], runs)
    else:
        env = dict(os.environ, DDPTOP_RUNS_DIR=str(runs))
        job = subprocess.Popen(ddptop_cmd("--json", "--gpu", "sim", "torchrun", *job_args), cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    run = wait_for(lambda: next((d for d in runs.glob("*") if (d / "meta.json").exists()), None)
                   if runs.exists() else None, what="the run directory")
    for k, v in cluster.env().items():
        monkeypatch.setenv(k, v)
    links: list[CutLink] = []
    if "ssh" in vias:
        from sshd import remote_ddptop

        sshd = request.getfixturevalue("sshd")
        links.append(CutLink("ssh", RemoteSession("node-a", ssh=sshd.ssh, remote_cmd=remote_ddptop(runs), backoff=(0.2,)),
                             sshd.drop_links))
    if "srun" in vias:
        cluster.slurm_job("77", {"node-a": runs})
        links.append(CutLink("srun", RemoteSession("node-a", remote_cmd=REMOTE, backoff=(0.2,), transport=Srun("77", "node-a")),
                             cluster.drop_links))
    if "kubectl" in vias:
        links.append(CutLink("kubectl", RemoteSession("trainer-0", remote_cmd=REMOTE, backoff=(0.2,),
                                           transport=Kubectl("trainer-0", "pytorch")), cluster.drop_links))
    try:
        for link in links:
            rs = link.rs
            link.evs += drain(rs, lambda es, rs=rs: rs.link == "up"
                              and any(e.kind == "logs" and e.rank is not None for e in es), what="the first rank line")
        while not all(link.rs.finished for link in links):
            time.sleep(0.2)
            for link in links:
                link.step(run)
        for link in links:
            link.evs += drain(link.rs, lambda es, rs=link.rs: rs.finished, what="the end")
    finally:
        for link in links:
            link.rs.close()
        if job is not None:
            try:
                job.wait(timeout=TIMEOUT)
            finally:
                if job.poll() is None:
                    os.killpg(job.pid, signal.SIGKILL)
                    job.wait()
    want = local_lines(run)
    for link in links:
        rs, evs = link.rs, link.evs
        assert link.drops >= 3 and rs.connects >= 3, (link.via, link.drops, rs.connects)
        # (each cut with 40 % of the job's lines still to write; a link made after the last one brought them)
        assert link.written_at_drops and resumed(evs, link.after), (link.via, link.written_at_drops)
        got = [(e.path, e.offset, e.text) for e in per_line(evs) if e.kind == "log" and not e.transient]
        assert len(got) == len(set(got)), f"a line arrived twice through {link.via}"
        assert sorted(got) == sorted(want), link.via
        for path in {p for p, _, _ in want}:
            assert [x for x in got if x[0] == path] == [x for x in want if x[0] == path]
        assert sum(1 for p, _, t in got if t.startswith("step ")) == 2 * DROP_STEPS


@needs_pid_namespaces
def test_logs_only_follows_pods_without_ddptop_and_analyses_them_here(tmp_path, cluster):
    """An image without ddptop: the pods' logs through `kubectl logs -f --prefix`, the analysis on the client."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--tee", "3"]
    job = [*torchrun, EXAMPLE, "--steps", "40", "--step-time", "0.02", "--fault", "segv", "--fault-rank", "1",
           "--fault-step", "20"]
    labels = {**PYTORCHJOB, "training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"}
    cluster.pod("bert-master-0", labels, job, tmp_path / "runs", has_ddptop=False,
                env={"PET_MASTER_PORT": str(free_port())}, restart_policy="Never")
    r = subprocess.run(ddptop_cmd("--json", "attach", "--k8s", "bert", "--logs-only", "--restart-wait", "0"),
                       capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT, env=cluster.env())
    assert "LOGS ONLY" in r.stderr, r.stderr
    ev = json_events(r.stdout)
    lines = [e for e in ev if e["kind"] == "log"]
    assert {e["node"] for e in lines} == {"master-0"}
    assert {e["rank"] for e in lines if e["text"].startswith("step ")} == {0, 1}  # (torchrun's --tee prefixes)
    crashes = [e for e in ev if e["kind"] == "alarm" and e["type"] == "crash"]
    assert crashes and 1 in crashes[0]["ranks"], [e for e in ev if e["kind"] == "alarm"]
    # the job's end is the pod's own (restartPolicy Never: Failed, with torchrun's exit code)
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "failed" and ev[-1]["exit_code"] == 1, ev[-1]
    assert "pod bert-master-0 failed" in ev[-1]["message"] and r.returncode == 1


@needs_pid_namespaces
def test_a_cross_pod_hang_names_the_culprit_and_its_pod(tmp_path, cluster):
    """Two pods of one 2-node job (one rank each, each pod in its own PID namespace, ddptop in each); rank 1,
    in the second pod, hangs in its data loading.  The merged view raises one stall alarm, naming rank 1 and
    the second pod's node (worker-0) in its fields."""
    from conftest import journal_events

    port = free_port()
    for i, role in enumerate(("master", "worker")):
        labels = {**PYTORCHJOB, "training.kubeflow.org/replica-type": role, "training.kubeflow.org/replica-index": "0"}
        cluster.pod(f"bert-{role}-0", labels, [
            *ddptop_words(), "--headless", "--gpu", "sim", "torchrun", "--nnodes", "2", "--node-rank", str(i),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), EXAMPLE,
            "--steps", "100000", "--step-time", "0.05", "--fault", "hang", "--fault-rank", "1", "--fault-step", "30"],
            tmp_path / f"runs-{i}")
    w, seen = _attach_json(cluster, "--k8s", "bert")

    def stalls():
        return [e for e in seen if e["kind"] == "alarm" and e["type"] == "stall"]
    try:
        wait_for(lambda: stalls() or w.poll() is not None, timeout=TIMEOUT, what="the stall alarm")
        alarm = stalls()[0]
        assert alarm["culprits"] == [1], alarm
        assert alarm["node"] == "worker-0", alarm  # the culprit's pod, as the merged view names it
        assert not [e for e in stalls() if e["node"] == "master-0"]
    finally:
        if w.poll() is None:
            os.killpg(w.pid, signal.SIGKILL)  # (the attachment only: it started nothing)
        w.wait(timeout=30)
        cluster.close()  # each pod's ddptop stops its own job
    # each pod's ranks are gone: a PID namespace whose first process has exited has no process left (the
    # journal's pids are the pod's own, which mean other processes out here)
    for pod, rt in cluster.data["k8s"]["runtime"].items():
        assert not os.path.exists(f"/proc/{rt['pid']}"), f"{pod} still runs"
    for i in range(2):
        (run,) = (tmp_path / f"runs-{i}").glob("*/meta.json")
        assert {e["state"] for e in journal_events(run.parent) if e["kind"] == "state"} & {"stopped", "failed"}


# ---- a pod that restarts is a new attempt of its node -------------------------------------------------------


def _attach_json(cluster, *args):
    """``ddptop --json attach ...`` started, and its events as they come (a list a thread fills)."""
    w = subprocess.Popen(ddptop_cmd("--json", "attach", *args, "--remote-ddptop", REMOTE), cwd=ROOT,
                         env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    seen: list[dict] = []
    threading.Thread(target=lambda: seen.extend(json.loads(ln) for ln in w.stdout if ln.endswith(b"\n")),
                     daemon=True).start()
    return w, seen


def _through(w, seen, says=None, then=None, what="the view"):
    """The view's events to its end: first until they satisfy ``says`` (the view still on), when ``then()``
    acts (restarts a container, starts a pod).  The attachment never outlives the test (it started nothing)."""
    try:
        if says is not None:
            wait_for(lambda: says(seen) or w.poll() is not None, timeout=TIMEOUT, what=what)
            assert w.poll() is None, w.stderr.read().decode()[-3000:]
            then()
        w.wait(timeout=TIMEOUT)
    finally:
        if w.poll() is None:
            os.killpg(w.pid, signal.SIGKILL)
            w.wait(timeout=30)
    return list(seen)


def _link_says(text, node=None):
    """A node's link (any, or ``node``'s) has said ``text``."""
    return lambda seen: any(e["kind"] == "link" and text in e.get("message", "") and node in (None, e["node"])
                            for e in seen)


@needs_pid_namespaces
@pytest.mark.parametrize("how", ["failed", "oom-killed"])
def test_a_restarted_container_is_the_next_attempt_of_its_node(tmp_path, cluster, how):
    """A PyTorchJob's master pod (restartPolicy OnFailure), whose container the kubelet restarts; ddptop in it
    begins a new run, which succeeds.  The attachment follows the node through it: attempt 0's lines and its
    end, a new attempt of the same node (not a new node), attempt 1's lines, and the job's success at the end.

    ``failed``: the first run fails at step 15 on its own, and ddptop's runs directory outlives the container
    (an emptyDir): attempt 0's end is read from its journal, and the view says it waits while the container is
    in CrashLoopBackOff.  ``oom-killed``: the container is killed mid-run as the OOM killer would, and the runs
    directory went with it: the cluster's word (OOMKilled, exit code 137) is attempt 0's end."""
    labels = {**PYTORCHJOB, "training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"}
    env = {"PET_MASTER_PORT": str(free_port())}
    fault = ("--fault", "die", "--fault-rank", "0", "--fault-step", "15") if how == "failed" else ()
    cluster.pod("bert-master-0", labels, pod_job(2000, *fault), tmp_path / "runs", env=env)
    wait_for(lambda: any((tmp_path / "runs").glob("*/meta.json")), what="the first run")
    w, seen = _attach_json(cluster, "--k8s", "bert", "--restart-wait", "60")
    # failed: the container ended, the kubelet has not restarted it yet: the view says it waits for it
    says = (_link_says("CrashLoopBackOff") if how == "failed" else
            lambda seen: any(e["kind"] == "log" and e["text"].startswith("step 5 ") for e in seen))
    ev = _through(w, seen, says, lambda: cluster.restart("bert-master-0", keep_runs=how == "failed",
                                                          oom=how == "oom-killed", cmd=pod_job(30)),
                  what="the view to wait for the restart" if how == "failed" else "step 5")
    assert w.returncode == 0, w.stderr.read().decode()[-3000:]
    restarts = [i for i, e in enumerate(ev) if e["kind"] == "launch" and e.get("node_restart")]
    assert len(restarts) == 1, [e for e in ev if e["kind"] == "launch"]
    launch = ev[restarts[0]]
    assert launch["node"] == "master-0" and launch["node_restart"] == 1
    logs = [(i, e["text"]) for i, e in enumerate(ev) if e["kind"] == "log" and e["node"] == "master-0"]
    first = [t for i, t in logs if i < restarts[0] and t.startswith("step ")]
    second = [t for i, t in logs if i > restarts[0] and t.startswith("step ")]
    assert first and not any(t.startswith("step 30 ") for t in first), first[-3:]
    assert any(t.startswith("step 30 ") for t in second), second[-3:]
    assert {e["node"] for e in ev if e["kind"] == "log"} == {"master-0"}  # one node, two attempts
    ended = [e["message"] for e in ev if e["kind"] == "note" and "attempt 0 " in e["message"]]
    if how == "failed":
        assert ended and "master-0: attempt 0 failed, exit code 1" in ended[0], ended
    else:
        assert ended and "master-0: attempt 0 failed, exit code 137" in ended[0], ended
        assert "as the cluster tells it" in ended[0] and "OOMKilled" in ended[0] and "memory limit" in ended[0]
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "succeeded", ev[-1]


JOBSET = {"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/replicatedjob-name": "node",
          "jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": "0"}


@needs_pid_namespaces
def test_a_recreated_pod_is_the_next_attempt_of_the_same_node(tmp_path, cluster):
    """A JobSet's pod (restartPolicy Never) whose run fails: the pod is Failed, and the view waits for the job's
    controller; the JobSet recreates it under a new name, with a fresh filesystem.  It is the same node
    (node-0), its attempt 1, followed to its success."""
    env = {"PET_MASTER_PORT": str(free_port())}
    cluster.pod("llama-node-0-0-x7k2p", JOBSET, pod_job(2000, "--fault", "die", "--fault-rank", "0",
                                                            "--fault-step", "15"),
                tmp_path / "runs-1", env=env, container="node", restart_policy="Never")
    wait_for(lambda: any((tmp_path / "runs-1").glob("*/meta.json")), what="the first run")
    w, seen = _attach_json(cluster, "--k8s", "llama", "--restart-wait", "120")
    ev = _through(w, seen, _link_says("its job's controller may start another pod"),
                  lambda: cluster.recreate("llama-node-0-0-x7k2p", "llama-node-0-0-q9w4z", tmp_path / "runs-2",
                                           cmd=pod_job(30)), what="the wait for the controller")
    assert w.returncode == 0, w.stderr.read().decode()[-3000:]
    (launch,) = [e for e in ev if e["kind"] == "launch" and e.get("node_restart")]
    assert launch["node"] == "node-0" and launch["node_restart"] == 1
    assert {e["node"] for e in ev if e["kind"] == "log"} == {"node-0"}
    assert any(e["kind"] == "log" and e["text"].startswith("step 30 ") for e in ev)
    assert any(e["kind"] == "note" and e["message"].startswith("node-0: attempt 0 failed, exit code 1") for e in ev)
    assert "in pod llama-node-0-0-q9w4z's container node" in launch["reason"], launch
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "succeeded", ev[-1]


@needs_pid_namespaces
@pytest.mark.parametrize("sidecar", [False, True], ids=["alone", "with-a-sidecar"])
def test_a_pod_that_fails_for_good_ends_the_view_after_the_restart_wait(tmp_path, cluster, sidecar):
    """restartPolicy Never, and no controller makes another pod: the view waits --restart-wait seconds, says
    so, and ends with the attempt's failure (ddptop exits with the job's code).  With a sidecar the pod stays
    Running, its training container ended: the same end."""
    cluster.pod("bert-master-0", {**PYTORCHJOB, "training.kubeflow.org/replica-type": "master",
                                  "training.kubeflow.org/replica-index": "0"},
                pod_job(2000, "--fault", "die", "--fault-rank", "0", "--fault-step", "15"), tmp_path / "runs",
                env={"PET_MASTER_PORT": str(free_port())}, restart_policy="Never", sidecar=sidecar)
    wait_for(lambda: any((tmp_path / "runs").glob("*/meta.json")), what="the run")
    w, seen = _attach_json(cluster, "--k8s", "bert", "--restart-wait", "3")
    ev = _through(w, seen)
    assert w.returncode == 1, w.stderr.read().decode()[-3000:]
    assert not [e for e in ev if e["kind"] == "launch" and e.get("node_restart")]
    gave_up = [e["message"] for e in ev if e["kind"] == "note" and "no next attempt came within 3 s" in e["message"]]
    said = ("container pytorch ended: Error, exit code 1 and will not restart (restartPolicy Never)" if sidecar
            else "pod bert-master-0 failed")
    assert gave_up and said in gave_up[0], gave_up
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "failed" and ev[-1]["exit_code"] == 1, ev[-1]


@needs_pid_namespaces
def test_logs_only_follows_a_restarted_container_as_its_nodes_next_attempt(tmp_path, cluster):
    """Logs only, two pods (an image without ddptop).  The master's torchrun fails; the kubelet restarts its
    container (restartPolicy OnFailure) and the new one succeeds.  The master's next attempt is announced and
    its log followed from its start, while the worker's stream goes on: each of the worker's lines once."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--tee", "3", EXAMPLE,
                "--step-time", "0.02"]
    master = {**PYTORCHJOB, "training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"}
    worker = {**PYTORCHJOB, "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "0"}
    env = {"PET_MASTER_PORT": str(free_port())}
    cluster.pod("bert-master-0", master, [*torchrun, "--steps", "400", "--fault", "die", "--fault-rank", "0",
                                          "--fault-step", "15"], tmp_path / "runs-m", has_ddptop=False, env=env)
    cluster.pod("bert-worker-0", worker, ["sh", "-c", 'for i in $(seq 1 300); do echo "worker line $i"; sleep 0.1; '
                                          "done"], tmp_path / "runs-w", has_ddptop=False)
    w, seen = _attach_json(cluster, "--k8s", "bert", "--logs-only")
    ev = _through(w, seen, _link_says("CrashLoopBackOff", "master-0"),
                  lambda: cluster.restart("bert-master-0", keep_runs=False, cmd=[*torchrun, "--steps", "30"]),
                  what="the view to wait for the master's restart")
    assert w.returncode == 0, w.stderr.read().decode()[-3000:]
    (launch,) = [e for e in ev if e["kind"] == "launch" and e.get("node_restart")]
    assert launch["node"] == "master-0" and launch["node_restart"] == 1
    at = ev.index(launch)
    steps = [(i, e["text"]) for i, e in enumerate(ev) if e["kind"] == "log" and e["node"] == "master-0"
             and e["text"].startswith("step ")]
    assert any(i < at for i, _ in steps) and not any(t.startswith("step 30 ") for i, t in steps if i < at)
    assert any(t.startswith("step 30 ") for i, t in steps if i > at)
    lines = [e["text"] for e in ev if e["kind"] == "log" and e["node"] == "worker-0"]
    assert lines == [f"worker line {i}" for i in range(1, 301)], (len(lines), lines[:3], lines[-3:])
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "succeeded", ev[-1]


@needs_pid_namespaces
def test_one_pod_of_two_restarts_and_the_merged_view_follows_it(tmp_path, cluster):
    """Two pods in the merged view; the worker's run fails and the kubelet restarts its container while the
    master runs on.  The merged view shows the worker's next attempt (the same node), keeps the master's
    stream, and ends when both have succeeded."""
    for i, role in enumerate(("master", "worker")):
        labels = {**PYTORCHJOB, "training.kubeflow.org/replica-type": role, "training.kubeflow.org/replica-index": "0"}
        fault = ("--fault", "die", "--fault-rank", "0", "--fault-step", "10") if role == "worker" else ()
        cluster.pod(f"bert-{role}-0", labels, pod_job(600 if role == "master" else 2000, *fault),
                    tmp_path / f"runs-{i}", env={"PET_MASTER_PORT": str(free_port())})
    for i in range(2):
        wait_for(lambda: any((tmp_path / f"runs-{i}").glob("*/meta.json")), what=f"pod {i}'s run")
    w, seen = _attach_json(cluster, "--k8s", "bert", "--restart-wait", "60")
    ev = _through(w, seen, _link_says("CrashLoopBackOff", "worker-0"),
                  lambda: cluster.restart("bert-worker-0", keep_runs=True, cmd=pod_job(30)),
                  what="the view to wait for the worker's restart")
    assert w.returncode == 0, w.stderr.read().decode()[-3000:]
    (launch,) = [e for e in ev if e["kind"] == "launch" and e.get("node_restart")]
    assert launch["node"] == "worker-0"
    assert {e["node"] for e in ev if e["kind"] == "log"} == {"master-0", "worker-0"}
    for node, last in (("master-0", "step 600 "), ("worker-0", "step 30 ")):
        assert any(e["kind"] == "log" and e["node"] == node and e["text"].startswith(last) for e in ev), node
    master = [int(e["text"].split()[1]) for e in ev if e["kind"] == "log" and e["node"] == "master-0"
              and e["text"].startswith("step ")]
    assert master == list(range(1, 601))  # (the master's stream went on, whole, through the worker's restart)
    assert any(e["kind"] == "note" and e["message"].startswith("worker-0: attempt 0 failed") for e in ev)
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "succeeded", ev[-1]


@needs_pid_namespaces
def test_the_runs_own_end_reaches_the_view_before_its_container_ends(tmp_path, cluster):
    """A pod's ddptop is its container's first process: its exit ends the container, and the agent exec'd into
    it.  It waits (a few seconds at most) for a live agent to send the run's end first.  Here the agent is held
    (SIGSTOP) from step 90 of 100 until ddptop has printed the job's end, then let go: the view still gets the
    run's own end."""
    labels = {**PYTORCHJOB, "training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"}
    cluster.pod("bert-master-0", labels, pod_job(100), tmp_path / "runs", env={"PET_MASTER_PORT": str(free_port())})
    run = wait_for(lambda: next((d for d in (tmp_path / "runs").glob("*") if (d / "meta.json").exists()), None)
                   if (tmp_path / "runs").exists() else None, what="the run")
    w, seen = _attach_json(cluster, "--k8s", "bert")
    agent = None
    try:
        wait_for(lambda: (run / "readers").exists() and any((run / "readers").glob("*")), timeout=TIMEOUT,
                 what="the agent's readers/ entry")
        # the agent, as this machine numbers it (readers/ has its pid inside the pod): the process the kubectl
        # stand-in's nsenter started in the pod's namespace
        (link,) = list(cluster.links.iterdir())
        agent = wait_for(lambda: _child(int(link.name.split("-", 1)[1])), what="the agent's pid out here")
        assert "agent" in open(f"/proc/{agent}/cmdline").read()
        # (held near the end only: a hold longer than the link's silence limit would be a dropped link)
        wait_for(lambda: any(e["kind"] == "log" and e["text"].startswith("step 90 ") for e in seen),
                 timeout=TIMEOUT, what="step 90")
        os.kill(agent, signal.SIGSTOP)
        log = cluster.data["k8s"]["runtime"]["bert-master-0"]["log"]
        wait_for(lambda: "job succeeded" in open(log, errors="replace").read(), timeout=TIMEOUT,
                 what="the pod's ddptop to print the job's end")
        os.kill(agent, signal.SIGCONT)
        w.wait(timeout=TIMEOUT)
    finally:
        if agent is not None:
            try:
                os.kill(agent, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if w.poll() is None:
            os.killpg(w.pid, signal.SIGKILL)  # (the attachment only: it started nothing)
            w.wait(timeout=30)
    assert w.returncode == 0, w.stderr.read().decode()[-3000:]
    ev = list(seen)
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "succeeded", ev[-1]
    assert ev[-1]["message"] == "torchrun exited with 0", ev[-1]  # (the run's own end, not the cluster's word)


@needs_pid_namespaces
def test_a_restarted_container_that_never_runs_ddptop_ends_the_view_after_the_restart_wait(tmp_path, cluster):
    """The kubelet restarted the container, but the new one never begins a ddptop run (its command changed):
    the view does not wait forever for it."""
    labels = {**PYTORCHJOB, "training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"}
    cluster.pod("bert-master-0", labels, pod_job(2000, "--fault", "die", "--fault-rank", "0", "--fault-step",
                                                      "10"), tmp_path / "runs", env={"PET_MASTER_PORT": str(free_port())})
    wait_for(lambda: any((tmp_path / "runs").glob("*/meta.json")), what="the run")
    w, seen = _attach_json(cluster, "--k8s", "bert", "--restart-wait", "3")
    ev = _through(w, seen, _link_says("CrashLoopBackOff"),
                  lambda: cluster.restart("bert-master-0", keep_runs=True, cmd=["sleep", "600"]),
                  what="the view to wait for the restart")
    assert w.returncode == 1, w.stderr.read().decode()[-3000:]
    gave_up = [e["message"] for e in ev if e["kind"] == "note" and "no next attempt came within 3 s" in e["message"]]
    assert gave_up and "restarted (restart 1" in gave_up[0], gave_up
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "failed", ev[-1]


@needs_pid_namespaces
@pytest.mark.parametrize("logs_only", [False, True], ids=["exec", "logs-only"])
def test_attaching_while_the_pods_start_waits_for_them(tmp_path, cluster, logs_only):
    """Attached right after the job was submitted: the pod is Pending (its image being pulled), then its
    container runs and ddptop in it begins its run a moment later.  The view waits, then follows the run."""
    labels = {**PYTORCHJOB, "training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"}
    job = (pod_job(30) if not logs_only else
           [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--tee", "3", EXAMPLE, "--steps",
            "30", "--step-time", "0.02"])
    cluster.pod("bert-master-0", labels, job, tmp_path / "runs", env={"PET_MASTER_PORT": str(free_port())},
                start=False, has_ddptop=not logs_only)
    w, seen = _attach_json(cluster, "--k8s", "bert", *(["--logs-only"] if logs_only else []))
    ev = _through(w, seen, _link_says("ContainerCreating"), lambda: cluster.start("bert-master-0"),
                  what="the view to wait for the pod")
    assert w.returncode == 0, w.stderr.read().decode()[-3000:]
    assert any(e["kind"] == "log" and e["node"] == "master-0" and e["text"].startswith("step 30 ") for e in ev)
    assert ev[-1]["kind"] == "state" and ev[-1]["state"] == "succeeded", ev[-1]
