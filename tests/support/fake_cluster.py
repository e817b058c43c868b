"""A SLURM job's nodes and Kubernetes pods, stood in for at the cluster boundary.

The stand-ins are executables named ``srun`` and ``kubectl`` (tests/support/cluster/bin),
put first on PATH for the ddptop under test; they accept only the argument
forms of the real tools' documentation and refuse anything else.  Each fake
pod runs in its own PID namespace (``unshare --pid --fork --mount-proc``), and
``kubectl exec`` enters it (``nsenter``), so inside a pod /proc shows only the
pod's processes, as in a container.  ddptop's code does not know it talks to
stand-ins.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from helpers import wait_for

BIN = Path(__file__).parent / "cluster" / "bin"
# a pod: its own PID namespace, whose every process dies with unshare (--kill-child: its first process is
# killed, and with it the namespace)
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


def unshare_works() -> str | None:
    """None when this machine lets us make a PID namespace, else why not."""
    try:
        r = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "no unshare(1) here"
    return None if r.returncode == 0 else f"unshare refused: {r.stderr.strip()}"


class FakeCluster:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.file = root / "cluster.json"
        self.links = root / "links"
        self.links.mkdir(exist_ok=True)
        self.data: dict = {"slurm": {"jobs": {}, "nodes": {}},
                           "k8s": {"context": "kind-train", "contexts": ["kind-train"], "default_namespace": "default",
                                   "pods": [], "runtime": {}}}
        self._pods: list[subprocess.Popen] = []
        self.save()

    def save(self) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        tmp.replace(self.file)

    def env(self, base: dict | None = None) -> dict:
        env = dict(os.environ if base is None else base)
        env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
        env["DDPTOP_FAKE_CLUSTER"] = str(self.file)
        env["DDPTOP_FAKE_LINKS"] = str(self.links)
        return env

    def slurm_job(self, jobid: str, nodes: dict[str, Path], running_step: bool = True) -> None:
        """A running SLURM job on these nodes (node -> its runs directory)."""
        self.data["slurm"]["jobs"][jobid] = {"nodes": list(nodes), "running_step": running_step}
        for n, runs in nodes.items():
            self.data["slurm"]["nodes"][n] = {"env": {"DDPTOP_RUNS_DIR": str(runs)}}
        self.save()

    def pod(self, name: str, labels: dict[str, str], cmd: list[str], runs: Path, *, container: str = "pytorch",
            namespace: str = "default", has_ddptop: bool = True, env: dict | None = None,
            annotations: dict | None = None, restarts: int = 0, restart_policy: str = "OnFailure",
            sidecar: bool = False, start: bool = True) -> subprocess.Popen | None:
        """A running pod whose container runs ``cmd`` in its own PID namespace (its output is the pod's log).
        The container's state is the process's (the kubectl stand-in reads it): running while it lives, then
        terminated with its exit code, and the pod's phase as ``restart_policy`` makes it (the kubelet's
        restart itself is ``restart``).  ``sidecar``: a second container that keeps running (a proxy), so
        that the pod stays Running after the training container has ended, as Kubernetes keeps it.
        ``start=False``: the pod is Pending, its container being created, until ``start``."""
        pod_env = {"DDPTOP_RUNS_DIR": str(runs), **(env or {})}
        self.data["k8s"]["pods"].append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations or {},
                         "uid": f"uid-{name}-{len(self.data['k8s']['pods'])}"},
            "spec": {"containers": [{"name": container, "image": "trainer:latest"},
                                    *([{"name": "sidecar", "image": "proxy:1"}] if sidecar else [])],
                     "nodeName": "kind-worker", "restartPolicy": restart_policy},
            "status": {"phase": "Running", "podIP": "10.244.0.7",
                       "containerStatuses": [
                           {"name": container, "ready": True, "restartCount": restarts},
                           *([{"name": "sidecar", "ready": True, "restartCount": 0,
                               "state": {"running": {"startedAt": "2026-11-26T05:00:00Z"}}}] if sidecar else [])]}})
        self.data["k8s"]["runtime"][name] = {"env": pod_env, "has_ddptop": has_ddptop, "container": container,
                                             "log": str(self.root / f"{name}.log"), "runs": str(runs), "cmd": cmd,
                                             "exit": str(self.root / f"{name}.exit")}
        if not start:
            pod = self._pod(name)
            pod["status"]["phase"] = "Pending"
            pod["status"]["containerStatuses"][0].update(ready=False, state={"waiting": {"reason": "ContainerCreating"}})
            self.save()
            return None
        return self._start(name)

    def start(self, name: str) -> subprocess.Popen:
        """A Pending pod's container starts (its image pulled)."""
        pod = self._pod(name)
        pod["status"]["phase"] = "Running"
        pod["status"]["containerStatuses"][0].update(ready=True, state={})
        return self._start(name)

    def _start(self, name: str) -> subprocess.Popen:
        """The pod's container process (again, after a restart), its output kept as the kubelet keeps a
        container's log: a file of its own per container instance, each line "TIME STREAM F TEXT" (CRI)."""
        rt = self.data["k8s"]["runtime"][name]
        Path(rt["exit"]).unlink(missing_ok=True)
        rt["instance"] = rt.get("instance", -1) + 1
        rt["log"] = str(self.root / f"{name}.{rt['instance']}.log")
        p = subprocess.Popen([*UNSHARE, "--", *rt["cmd"]], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **rt["env"]},
                             cwd=Path(__file__).resolve().parents[2])  # the checkout
        self._pods.append(p)
        log = open(rt["log"], "ab", buffering=0)
        rt["pid"] = wait_for(lambda: _child(p.pid), timeout=30, what=f"pod {name}'s first process")
        self.save()

        def runtime():  # (as a container runtime: its log, then its exit code; 128+N for signal N)
            assert p.stdout is not None
            with log:
                for line in p.stdout:
                    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    log.write(stamp.encode() + b" stdout " + (b"F " + line if line.endswith(b"\n") else b"P " + line + b"\n"))
            code = p.wait()
            Path(rt["exit"]).write_text(str(code if code >= 0 else 128 - code))
        threading.Thread(target=runtime, daemon=True).start()
        return p

    def _pod(self, name: str) -> dict:
        return next(p for p in self.data["k8s"]["pods"] if p["metadata"]["name"] == name)

    def restart(self, name: str, *, keep_runs: bool, cmd: list[str] | None = None, oom: bool = False) -> None:
        """The kubelet restarts the pod's container (after it ended, or killing it first: ``oom``, as the
        kernel's OOM killer would).  ``keep_runs``: ddptop's runs directory outlives the container (an emptyDir
        or a volume), else it went with the container's own filesystem."""
        rt = self.data["k8s"]["runtime"][name]
        if oom and os.path.exists(f"/proc/{rt['pid']}"):
            rt["oom"] = True
            self.save()
            os.killpg(os.getpgid(rt["pid"]), signal.SIGKILL)
        wait_for(lambda: os.path.exists(rt["exit"]), timeout=60, what=f"pod {name}'s container to end")
        code = int(Path(rt["exit"]).read_text())
        st = next(c for c in self._pod(name)["status"]["containerStatuses"] if c["name"] == rt["container"])
        st["restartCount"] += 1
        st["lastState"] = {"terminated": {"exitCode": code, "reason": "OOMKilled" if rt.pop("oom", False) else
                                          "Completed" if code == 0 else "Error"}}
        if not keep_runs:
            shutil.rmtree(rt["runs"], ignore_errors=True)
        if cmd is not None:
            rt["cmd"] = cmd
        self._start(name)

    def recreate(self, name: str, new_name: str, runs: Path, *, cmd: list[str]) -> None:
        """The job's controller replaces a pod (after it ended, as JobSet does): the old pod is deleted and a
        new one, with the same labels and a new name and uid, starts with a fresh filesystem (``runs``)."""
        old = self._pod(name)
        rt = self.data["k8s"]["runtime"][name]
        wait_for(lambda: os.path.exists(rt["exit"]), timeout=60, what=f"pod {name}'s container to end")
        self.data["k8s"]["pods"].remove(old)
        del self.data["k8s"]["runtime"][name]
        self.pod(new_name, old["metadata"]["labels"], cmd, runs, container=rt["container"],
                 namespace=old["metadata"]["namespace"], env={k: v for k, v in rt["env"].items()
                                                              if k != "DDPTOP_RUNS_DIR"},
                 restart_policy=old["spec"]["restartPolicy"], sidecar=len(old["spec"]["containers"]) > 1)

    def drop_links(self) -> int:
        """Cut every live link an srun or kubectl stand-in carries (as a network drop would): how many."""
        n = 0
        for f in list(self.links.iterdir()):
            pid = int(f.name.split("-", 1)[1])
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)  # (the link's own group: the stand-in and the agent)
                n += 1
            except ProcessLookupError:
                pass
            f.unlink()
        return n

    def close(self) -> None:
        """The test is over: the pods this cluster started end (each by its own process group, which nothing
        else is in).  A pod whose first process catches SIGTERM (ddptop) is given the time to stop what it
        started; one whose first process does not (sleep, sh) never sees it (a PID namespace's first process
        gets only the signals it has a handler for), so its group is killed at once."""
        live = [p for p in self._pods if p.poll() is None]
        catches = {p.pid: _catches(_child(p.pid), signal.SIGTERM) for p in live}  # (read before it is sent)
        for p in live:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in live:
            if catches[p.pid]:
                try:
                    p.wait(timeout=30)
                    continue
                except subprocess.TimeoutExpired:
                    pass
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # (unshare and its first process: the namespace goes with it)
                except ProcessLookupError:
                    pass
            p.wait(timeout=10)


def _catches(pid: int | None, sig: int) -> bool:
    """Process ``pid`` has a handler for signal ``sig``."""
    if pid is None:
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
    return bool(int(caught, 16) >> (sig - 1) & 1)


def _child(pid: int) -> int | None:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def ddptop_words() -> list[str]:
    """How the nodes run ddptop: this interpreter (the stand-ins run no shell)."""
    return [sys.executable, "-m", "ddptop"]
