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
from dataclasses import dataclass, replace

from ddptop.core.sessions.transports import K8S_NAME, checked
from ddptop.core.sessions.transports import kubectl_base as base

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
    uid: str = ""
    restart_policy: str = "Always"  # the pod's spec.restartPolicy (Always is the API's default)
    state: str = ""  # the training container's: running | waiting | terminated ("": not reported yet)
    reason: str = ""  # why it waits or ended (CrashLoopBackOff, ContainerCreating, OOMKilled, Error, Completed)
    exit_code: int | None = None  # how it ended (state terminated)
    last_reason: str = ""  # how the container before it ended (lastState.terminated), after a restart
    last_exit_code: int | None = None
    deleting: bool = False  # metadata.deletionTimestamp: the pod is on its way out
    created: str = ""  # metadata.creationTimestamp (RFC 3339: sorts as time does)


@dataclass(frozen=True)
class Outlook:
    """What the cluster says of a node whose run ended or could not be reached.

    ``kind``: ``same`` (the container that ran the attempt still runs),
    ``restarting`` (the cluster is restarting or has restarted it: a next
    attempt is on its way), ``ended`` (the pod completed: no next attempt),
    ``unsure`` (the pod failed for good, or is gone: its job's controller may
    yet make another, or may not).  ``exit_code``/``reason``: how the
    attempt's container ended, where the cluster says.  ``coming``: a
    restart is on its way and not there yet (the container waits to start,
    the pod is pending); ``incarnation``: the pod's uid and the container's
    restart count now."""

    kind: str
    message: str
    exit_code: int | None = None
    reason: str = ""
    coming: bool = False
    incarnation: tuple = ()


def _state(status: dict) -> tuple[str, str, int | None]:
    for k in ("running", "waiting", "terminated"):
        v = status.get(k)
        if isinstance(v, dict):
            return k, str(v.get("reason") or ""), _int(v.get("exitCode"))
    return "", "", None


def outlook(now: Pod | None, before: Pod | None) -> Outlook:
    """Whether a node gets another attempt: ``before`` is its pod as the
    attempt began, ``now`` as the cluster lists it now (None: no pod)."""
    if now is None:
        return Outlook("unsure", "no pod of this node is listed now (being recreated, or deleted with its job)")
    look = _outlook(now, before)
    return replace(look, incarnation=(now.uid, now.restarts))


def _outlook(now: Pod, before: Pod | None) -> Outlook:
    waiting = now.state == "waiting" or now.phase == "Pending" or not now.state
    if before is not None and now.uid and before.uid and now.uid != before.uid:
        return Outlook("restarting", f"pod recreated as {now.name} ({now.phase or 'no phase yet'})",
                       coming=waiting and not now.deleting)
    newer = before is not None and now.restarts > before.restarts
    if now.state == "terminated":
        ended = (now.exit_code, now.reason)
    elif newer or now.state == "waiting":  # (the last container's end: the attempt's, as the kubelet recorded it)
        ended = (now.last_exit_code, now.last_reason)
    else:
        ended = (None, "")
    if now.deleting:
        return Outlook("unsure", f"pod {now.name} is being deleted", *ended)
    if now.phase == "Succeeded":
        return Outlook("ended", f"pod {now.name} completed", *ended)
    if now.phase == "Failed":
        return Outlook("unsure", f"pod {now.name} failed" + _how(*ended) + " (restartPolicy "
                       f"{now.restart_policy}): its job's controller may start another pod, or give up", *ended)
    if newer:
        return Outlook("restarting", f"container {now.container} restarted (restart {now.restarts}; the last one "
                       "ended" + _how(*ended) + ")", *ended, coming=waiting)
    if now.state == "waiting" or now.phase == "Pending":
        return Outlook("restarting", f"container {now.container} is waiting to start ({now.reason or now.phase}; "
                       "the last one ended" + _how(*ended) + ")" if ended != (None, "") else
                       f"container {now.container} is waiting to start ({now.reason or now.phase})", *ended,
                       coming=True)
    if now.state == "terminated":
        if now.restart_policy == "Always" or now.restart_policy == "OnFailure" and now.exit_code != 0:
            return Outlook("restarting", f"container {now.container} ended" + _how(*ended) + ": the kubelet "
                           f"restarts it (restartPolicy {now.restart_policy})", *ended, coming=True)
        return Outlook("ended" if now.exit_code == 0 else "unsure", f"container {now.container} ended"
                       + _how(*ended) + f" and will not restart (restartPolicy {now.restart_policy})", *ended)
    return Outlook("same", f"container {now.container} of pod {now.name} still runs (restart {now.restarts})")


def _how(code: int | None, reason: str) -> str:
    parts = [reason] if reason else []
    if code is not None:
        parts.append(f"exit code {code}")
    return f": {', '.join(parts)}" if parts else ""


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
    name = checked(str(meta.get("name", "")), K8S_NAME, "pod")
    spec_names = [str(c.get("name", "")) for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, dict)]
    if container:
        if spec_names and container not in spec_names:
            raise K8sError(f"pod {name} has no container {container!r} (it has {', '.join(spec_names)})")
        pick = container
    else:
        pick = next((c for c in TRAINING_CONTAINERS if c in spec_names), spec_names[0] if spec_names else "")
    if pick:
        checked(pick, K8S_NAME, "container")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    mine = next((s for s in statuses if isinstance(s, dict) and s.get("name") == pick), {})
    restarts = _int(mine.get("restartCount")) or 0
    state, reason, code = _state(mine.get("state") or {})
    _, last_reason, last_code = _state(mine.get("lastState") or {})
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
    return Pod(name, checked(node, K8S_NAME, "node name") if node != name else name, pick,
               str((pod.get("status") or {}).get("phase", "")), restarts, selector, (*idx, name),
               uid=str(meta.get("uid") or ""), restart_policy=str((pod.get("spec") or {}).get("restartPolicy") or "Always"),
               state=state, reason=reason, exit_code=code, last_reason=last_reason, last_exit_code=last_code,
               deleting=bool(meta.get("deletionTimestamp")), created=str(meta.get("creationTimestamp") or ""))


def find_pods(name: str = "", selector: str = "", *, container: str = "", kubectl: tuple[str, ...] = ("kubectl",),
              namespace: str = "", context: str = "") -> tuple[str, list[Pod]]:
    """(what runs the job, its pods in node order).  ``name``: the job's name
    (tried by each convention); ``selector``: a label selector instead."""
    if name:
        checked(name, K8S_NAME, "job name")
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
    # (a recreated pod beside the one it replaces: the one not on its way out, not ended, running, newest)
    best: dict[str, Pod] = {}
    for p in pods:
        if p.node not in best or _liveliness(p) >= _liveliness(best[p.node]):
            best[p.node] = p
    return sorted(best.values(), key=lambda p: p.order)


def _liveliness(p: Pod) -> tuple:
    return (not p.deleting, p.phase not in ("Succeeded", "Failed"), p.phase == "Running", p.created)


def job_selector(what: str, name: str) -> str:
    """The selector ``find_pods`` found a job's pods with."""
    return next(f"{label}={name}" for w, label in CONVENTIONS if w == what)


@dataclass(frozen=True)
class PodWatch:
    """One node's pod as the cluster lists it now (``kubectl get pods -l``
    with the node's own labels, else ``found_by``, the selector the pods were
    found with): a recreated pod has a new name; and what the cluster says of
    the node's next attempt (``outlook``).  The kubectl transport asks it."""

    pod: Pod
    found_by: str = ""
    kubectl: tuple[str, ...] = ("kubectl",)
    namespace: str = ""
    context: str = ""

    def _ask(self) -> Pod | None:
        found = _nodes(get_pods(self.pod.selector or self.found_by, kubectl=self.kubectl, namespace=self.namespace,
                                context=self.context), self.pod.container)
        return next((p for p in found if p.node == self.pod.node), None)

    def now(self) -> Pod | None:
        """The node's pod now (None: none is listed, or kubectl could not say)."""
        try:
            return self._ask()
        except (K8sError, ValueError):
            return None

    def outlook(self, before: object) -> Outlook | None:
        """``outlook`` of the node against its pod ``before`` (as the attempt
        began); None: the cluster could not be asked."""
        try:
            now = self._ask()
        except (K8sError, ValueError):
            return None
        return outlook(now, before if isinstance(before, Pod) else None)


@dataclass(frozen=True)
class JobWatch:
    """A job's pods as the cluster lists them now (``kubectl get pods -l
    SELECTOR``), for the logs-only view's restarts."""

    selector: str
    container: str = ""
    kubectl: tuple[str, ...] = ("kubectl",)
    namespace: str = ""
    context: str = ""

    def now(self) -> list[Pod] | None:
        """The pods in node order (None: kubectl could not say)."""
        try:
            return _nodes(get_pods(self.selector, kubectl=self.kubectl, namespace=self.namespace,
                                   context=self.context), self.container)
        except (K8sError, ValueError):
            return None
