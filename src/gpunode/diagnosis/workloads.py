"""Diagnosis of a GPU workload that has no pod: why its controller creates none.

A Deployment, StatefulSet, Job, ReplicaSet or DaemonSet whose pods never appear leaves no pod for
``doctor --pod`` to read: the refusal is in its controller's ``FailedCreate`` events (the API server's
admission words: a ResourceQuota, a LimitRange, PodSecurity, a webhook), or it is scaled to zero or suspended.
This reads those and the namespace's quotas, and names the refusal with the fix.
"""

from __future__ import annotations

from gpunode.diagnosis import Finding, Verdict
from gpunode.facts.workloads import KINDS, QuotaView, WorkloadView

__all__ = ["KINDS", "QuotaView", "WorkloadView", "diagnose"]

STEP = "pod"


# the API server's admission words in a FailedCreate, and what each means: (words, code, meaning, fix)
REFUSALS: tuple[tuple[str, str, str, str], ...] = (
    ("exceeded quota:", "quota-exceeded", "the namespace's ResourceQuota refuses its pods",
     "free the GPUs the namespace's pods hold (kubectl -n {ns} get pods), ask for fewer, or raise the quota's "
     "hard requests.nvidia.com/gpu (kubectl -n {ns} edit resourcequota)"),
    ("failed quota:", "quota-needs-requests", "a ResourceQuota of the namespace requires a value its pods do not set",
     "set the resource the message names in every container (a quota on requests.cpu or limits.memory needs them "
     "on each container), or add a LimitRange with defaults in {ns}"),
    ("violates PodSecurity", "pod-security", "the namespace's Pod Security level refuses its pods",
     "change the pod spec as the message says, or the namespace's pod-security.kubernetes.io/enforce label"),
    ("usage per Container is", "limit-range", "a LimitRange of the namespace refuses its containers' resources",
     "ask within the LimitRange (kubectl -n {ns} describe limitrange), or change it"),
    ("admission webhook", "webhook-denied", "an admission webhook refuses its pods",
     "the webhook's own words are above: change the pod spec accordingly, or ask the webhook's owner"),
)


def diagnose(view: WorkloadView) -> list[Finding]:
    """The refusal of the workload's last FailedCreate, or why it asks for no pod; never "ok": it has no pod."""
    title = view.title
    refused = [(obj, message) for obj, reason, message in view.events if reason == "FailedCreate"]
    quota_lines = [line for quota in view.quotas for line in quota.gpu_lines()]
    if refused:
        obj, message = refused[-1]
        evidence = [f"event FailedCreate on {obj}: {message}"]
        for words, code, meaning, fix in REFUSALS:
            if words in message:
                extra = quota_lines if code.startswith("quota") else list(view.limit_ranges) if code == "limit-range" \
                    else []
                return [Finding(STEP, Verdict.FINDING, f"{title} creates no pod: {meaning}", evidence + extra,
                                fix.format(ns=view.namespace), code=code)]
        return [Finding(STEP, Verdict.FINDING, f"{title} creates no pod: the API server refuses it", evidence,
                        f"the API server's own words are above; 'kubectl -n {view.namespace} describe "
                        f"{view.kind.lower()} {view.name}' shows the rest", code="pod-create-refused")]
    if view.suspended:
        return [Finding(STEP, Verdict.FINDING, f"{title} creates no pod: it is suspended",
                        [f"{title}: spec.suspend = true"],
                        f"kubectl -n {view.namespace} patch job {view.name} -p '{{\"spec\":{{\"suspend\":false}}}}'",
                        code="job-suspended")]
    if view.replicas == 0:
        return [Finding(STEP, Verdict.FINDING, f"{title} creates no pod: it is scaled to 0 replicas",
                        [f"{title}: spec.replicas = 0"],
                        f"kubectl -n {view.namespace} scale {view.kind.lower()} {view.name} --replicas=1",
                        code="scaled-to-zero")]
    evidence = [f"{title}: no pod, no FailedCreate event"] + quota_lines
    return [Finding(STEP, Verdict.FINDING, f"{title} has no pod and its controller says nothing", evidence,
                    f"kubectl -n {view.namespace} describe {view.kind.lower()} {view.name}; is kube-controller-manager "
                    "running (kubectl get --raw /readyz?verbose)?", code="no-pod-no-event")]
