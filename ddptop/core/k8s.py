"""A training job's pods on Kubernetes, found the way its operator labels them.

``find_pods(name)`` asks ``kubectl get pods -l SELECTOR -o json`` with the
label conventions of the ecosystem, first match wins:

* JobSet (and Kubeflow Trainer v2's TrainJob, which runs as a JobSet of its
  name): ``jobset.sigs.k8s.io/jobset-name``; each pod's replicated job
  (``jobset.sigs.k8s.io/replicatedjob-name``), job index
  (``jobset.sigs.k8s.io/job-index``) and completion index
  (``batch.kubernetes.io/job-completion-index``);
* Kubeflow's PyTorchJob: ``training.kubeflow.org/job-name``, with
  ``training.kubeflow.org/replica-type`` (master first) and ``replica-index``;
* Volcano: ``volcano.sh/job-name``, with ``volcano.sh/task-spec`` and the
  ``volcano.sh/task-index`` label or annotation;
* a plain indexed Job: ``batch.kubernetes.io/job-name``;

or a selector given as it is (``-l``).  The pods are ordered into nodes by
their index, and named by role and index (``worker-1``), not by pod name: a
pod that is recreated (a new name) is the same node, a new attempt of it.
The training container is the one asked for (``-c``), else PyTorchJob's
``pytorch``, Trainer's ``node``, a ``trainer``, else the pod's only or first.

Every word handed to kubectl is its own argv element; the names the cluster
returns are checked (``transports.checked``) before any is used.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass

from ddptop.core.sessions.transports import _K8S_NAME, checked, kubectl_base as base

_SELECTOR = re.compile(r"[A-Za-z0-9_./-]+(?:(?:=|==|!=)[A-Za-z0-9_.-]*)?(?:,[A-Za-z0-9_./-]+(?:(?:=|==|!=)[A-Za-z0-9_.-]*)?)*")

# (what runs the job, the label naming the job): tried in this order
CONVENTIONS = (
    ("JobSet", "jobset.sigs.k8s.io/jobset-name"),
    ("PyTorchJob", "training.kubeflow.org/job-name"),
    ("Volcano job", "volcano.sh/job-name"),
    ("Job", "batch.kubernetes.io/job-name"),
)
TRAINING_CONTAINERS = ("pytorch", "node", "trainer")
_ROLE_ORDER = {"master": 0, "launcher": 0, "leader": 0}


class K8sError(Exception):
    pass


@dataclass(frozen=True)
class Pod:
    name: str
    node: str  # the node's name in the merged view: role and index ("worker-1"), stable across restarts
    container: str
    phase: str
    restarts: int
    selector: str  # the labels that find this pod again (after it is recreated)
    order: tuple = ()


def selector_ok(selector: str) -> str:
    if not _SELECTOR.fullmatch(selector) or selector.startswith("-"):
        raise K8sError(f"label selector {selector!r} is not one kubectl takes (key=value[,key=value]): refused")
    return selector


def get_pods(selector: str, *, kubectl: tuple[str, ...] = ("kubectl",), namespace: str = "", context: str = "",
             timeout: float = 30.0) -> list[dict]:
    """The pods ``kubectl get pods -l SELECTOR -o json`` lists (their JSON objects)."""
    argv = [*base(kubectl, namespace, context), "get", "pods", "-l", selector_ok(selector), "-o", "json"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise K8sError(f"--k8s needs `{kubectl[0]}` on the PATH (and a kubeconfig for the cluster)") from None
    except subprocess.TimeoutExpired:
        raise K8sError(f"`{' '.join(argv)}` did not answer in {timeout:.0f} s") from None
    if r.returncode != 0:
        raise K8sError(f"`{' '.join(argv)}` failed: {r.stderr.strip() or r.returncode}")
    try:
        items = json.loads(r.stdout).get("items", [])
    except (ValueError, AttributeError):
        raise K8sError(f"`{' '.join(argv)}` did not answer a pod list") from None
    return [p for p in items if isinstance(p, dict)]


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def describe(pod: dict, container: str = "") -> Pod:
    """One pod as a node of the merged view."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    notes = meta.get("annotations") or {}
    name = checked(str(meta.get("name", "")), _K8S_NAME, "pod")
    spec_names = [str(c.get("name", "")) for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, dict)]
    if container:
        if spec_names and container not in spec_names:
            raise K8sError(f"pod {name} has no container {container!r} (it has {', '.join(spec_names)})")
        pick = container
    else:
        pick = next((c for c in TRAINING_CONTAINERS if c in spec_names), spec_names[0] if spec_names else "")
    if pick:
        checked(pick, _K8S_NAME, "container")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    restarts = sum(_int(s.get("restartCount")) or 0 for s in statuses if isinstance(s, dict) and s.get("name") == pick)
    if "jobset.sigs.k8s.io/jobset-name" in labels:
        role = labels.get("jobset.sigs.k8s.io/replicatedjob-name", "node")
        idx = (_int(labels.get("jobset.sigs.k8s.io/job-index")) or 0, _int(labels.get(
            "batch.kubernetes.io/job-completion-index") or notes.get("batch.kubernetes.io/job-completion-index")) or 0)
        keys = {"jobset.sigs.k8s.io/jobset-name": labels["jobset.sigs.k8s.io/jobset-name"],
                "jobset.sigs.k8s.io/replicatedjob-name": role,
                "jobset.sigs.k8s.io/job-index": str(idx[0])}
        node = f"{role}-{idx[0]}" + (f"-{idx[1]}" if idx[1] else "")
    elif "training.kubeflow.org/job-name" in labels:
        role = labels.get("training.kubeflow.org/replica-type", "worker").lower()
        i = _int(labels.get("training.kubeflow.org/replica-index")) or 0
        idx = (_ROLE_ORDER.get(role, 1), i)
        keys = {"training.kubeflow.org/job-name": labels["training.kubeflow.org/job-name"],
                "training.kubeflow.org/replica-type": labels.get("training.kubeflow.org/replica-type", role),
                "training.kubeflow.org/replica-index": str(i)}
        node = f"{role}-{i}"
    elif "volcano.sh/job-name" in labels:
        role = labels.get("volcano.sh/task-spec", "task")
        i = _int(labels.get("volcano.sh/task-index") or notes.get("volcano.sh/task-index")) or 0
        idx = (_ROLE_ORDER.get(role, 1), i)
        keys = {"volcano.sh/job-name": labels["volcano.sh/job-name"], "volcano.sh/task-spec": role}
        node = f"{role}-{i}"
    else:
        ci = _int(labels.get("batch.kubernetes.io/job-completion-index")
                  or notes.get("batch.kubernetes.io/job-completion-index"))
        idx = (0, ci if ci is not None else 0)
        keys = {}
        node = f"pod-{ci}" if ci is not None else name
    for k, v in keys.items():
        checked(v, re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"), f"label {k}")
    selector = ",".join(f"{k}={v}" for k, v in keys.items())
    return Pod(name, checked(node, _K8S_NAME, "node name") if node != name else name, pick,
               str((pod.get("status") or {}).get("phase", "")), restarts, selector, (*idx, name))


def find_pods(name: str = "", selector: str = "", *, container: str = "", kubectl: tuple[str, ...] = ("kubectl",),
              namespace: str = "", context: str = "") -> tuple[str, list[Pod]]:
    """(what runs the job, its pods in node order).  ``name``: the job's name
    (tried by each convention); ``selector``: a label selector instead."""
    if name:
        checked(name, _K8S_NAME, "job name")
        tried = []
        for what, label in CONVENTIONS:
            sel = f"{label}={name}"
            items = get_pods(sel, kubectl=kubectl, namespace=namespace, context=context)
            tried.append(sel)
            if items:
                return what, _nodes(items, container)
        where = f" in namespace {namespace}" if namespace else ""
        raise K8sError(f"no pods of a job named {name!r}{where} (tried -l {', -l '.join(tried)}); name them with "
                       "-l SELECTOR")
    items = get_pods(selector, kubectl=kubectl, namespace=namespace, context=context)
    if not items:
        raise K8sError(f"no pods match -l {selector}")
    return f"pods -l {selector}", _nodes(items, container)


def _nodes(items: list[dict], container: str) -> list[Pod]:
    pods = [describe(p, container) for p in items]
    # (a recreated pod beside the one it replaces: the running one, else the newest listed, is the node)
    best: dict[str, Pod] = {}
    for p in pods:
        if p.node not in best or (p.phase == "Running") >= (best[p.node].phase == "Running"):
            best[p.node] = p
    return sorted(best.values(), key=lambda p: p.order)


def job_selector(what: str, name: str) -> str:
    """The selector ``find_pods`` found a job's pods with."""
    return next(f"{label}={name}" for w, label in CONVENTIONS if w == what)


def current_pod(pod: Pod, *, kubectl: tuple[str, ...] = ("kubectl",), namespace: str = "", context: str = ""):
    """A function giving this node's pod now (a recreated pod has a new name)."""
    def ask() -> str:
        if not pod.selector:
            return pod.name
        try:
            found = _nodes(get_pods(pod.selector, kubectl=kubectl, namespace=namespace, context=context),
                           pod.container)
        except K8sError:
            return pod.name
        return next((p.name for p in found if p.node == pod.node), pod.name)
    return ask
