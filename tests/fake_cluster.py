"""A SLURM job's nodes and Kubernetes pods, stood in for at the cluster boundary.

The stand-ins are executables named ``srun`` and ``kubectl`` (tests/cluster/bin),
put first on PATH for the ddptop under test; they accept only the argument
forms of the real tools' documentation and refuse anything else.  Each fake
pod runs in its own PID namespace (``unshare --pid --fork --mount-proc``), and
``kubectl exec`` enters it (``nsenter``), so inside a pod /proc shows only the
pod's processes, as in a container.  ddptop's code does not know it talks to
stand-ins.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers import wait_for

BIN = Path(__file__).parent / "cluster" / "bin"


def unshare_works() -> str | None:
    """None when this machine lets us make a PID namespace, else why not."""
    try:
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True,
                           timeout=30)
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
            annotations: dict | None = None, restarts: int = 0) -> subprocess.Popen:
        """A running pod whose container runs ``cmd`` in its own PID namespace (its output is the pod's log)."""
        log = self.root / f"{name}.log"
        pod_env = {"DDPTOP_RUNS_DIR": str(runs), **(env or {})}
        with open(log, "wb") as out:
            p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--", *cmd], stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, **pod_env}, cwd=Path(__file__).parent.parent)
        self._pods.append(p)
        init = wait_for(lambda: _child(p.pid), timeout=30, what=f"pod {name}'s first process")
        self.data["k8s"]["pods"].append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations or {},
                         "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": container, "image": "trainer:latest"},
                                    {"name": "sidecar", "image": "proxy:1"}], "nodeName": "kind-worker"},
            "status": {"phase": "Running", "podIP": "10.244.0.7",
                       "containerStatuses": [{"name": container, "ready": True, "restartCount": restarts},
                                             {"name": "sidecar", "ready": True, "restartCount": 0}]}})
        self.data["k8s"]["runtime"][name] = {"pid": init, "env": pod_env, "has_ddptop": has_ddptop, "log": str(log)}
        self.save()
        return p

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
        for p in self._pods:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self._pods:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def _child(pid: int) -> int | None:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def ddptop_words() -> list[str]:
    """How the nodes run ddptop: this interpreter (the stand-ins run no shell)."""
    return [sys.executable, "-m", "ddptop"]
