"""Data-driven: why a GPU workload has no pod (gpunode.diagnosis.workloads), from its controller's own words."""

from __future__ import annotations

import re

import pytest

from gpunode.diagnosis import Verdict
from gpunode.diagnosis.workloads import QuotaView, WorkloadView, diagnose
from gpunode.facts.workloads import kind_of

# the API server's quota admission words as the ReplicaSet controller's FailedCreate event carries them
QUOTA = ('Error creating: pods "train-7d9c-x2v" is forbidden: exceeded quota: gpu-quota, requested: '
         'requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=4')
GPU_QUOTA = QuotaView("gpu-quota", {"requests.nvidia.com/gpu": "4", "pods": "10"},
                      {"requests.nvidia.com/gpu": "4", "pods": "4"})


def view(**changes: object) -> WorkloadView:
    return WorkloadView(**{"kind": "Deployment", "namespace": "ml", "name": "train", "replicas": 1, **changes})


@pytest.mark.parametrize(("workload", "code", "said"), [
    (view(events=[("replicaset train-7d9c", "FailedCreate", QUOTA)], quotas=(GPU_QUOTA,)), "quota-exceeded",
     "resourcequota gpu-quota: requests.nvidia.com/gpu used 4 of 4"),
    (view(events=[("replicaset train-7d9c", "FailedCreate", 'Error creating: pods "x" is forbidden: failed quota: '
                   'q: must specify limits.memory for: main')]), "quota-needs-requests", "must specify limits.memory"),
    (view(events=[("replicaset train-7d9c", "FailedCreate", 'Error creating: pods "x" is forbidden: violates '
                   'PodSecurity "restricted:latest": runAsNonRoot != true')]), "pod-security", "runAsNonRoot"),
    (view(events=[("job train", "FailedCreate", 'Error creating: pods "x" is forbidden: maximum memory usage per '
                   'Container is 1Gi, but limit is 2Gi')], limit_ranges=("limitrange mem: Container max {'memory': "
                                                                          "'1Gi'}",)), "limit-range",
     "limitrange mem: Container max"),
    (view(events=[("statefulset train", "FailedCreate", "create Pod train-0 in StatefulSet train failed error: "
                   "something else")]), "pod-create-refused", "something else"),
    (view(kind="Job", replicas=None, suspended=True), "job-suspended", "spec.suspend = true"),
    (view(replicas=0), "scaled-to-zero", "spec.replicas = 0"),
    (view(quotas=(GPU_QUOTA,)), "no-pod-no-event", "requests.nvidia.com/gpu used 4 of 4"),
])
def test_a_workload_without_pods_gets_its_refusal_named(workload: WorkloadView, code: str, said: str) -> None:
    findings = diagnose(workload)
    assert [(f.state, f.code) for f in findings] == [(Verdict.FINDING, code)]
    assert said in " | ".join(findings[0].evidence), findings[0].evidence
    assert findings[0].fix and not re.search(r"\{(ns|kind|name)\}", findings[0].fix)  # every placeholder filled


def test_the_last_refusal_counts() -> None:
    """A quota raised since: the newest FailedCreate says what blocks it now."""
    workload = view(events=[("replicaset a", "FailedCreate", QUOTA),
                            ("replicaset a", "FailedCreate", 'Error creating: pods "x" is forbidden: violates '
                             'PodSecurity "baseline:latest": privileged')])
    assert diagnose(workload)[0].code == "pod-security"


@pytest.mark.parametrize(("typed", "kind"), [("deployment", "Deployment"), ("deploy", "Deployment"),
                                             ("StatefulSets", "StatefulSet"), ("job", "Job"), ("rs", "ReplicaSet"),
                                             ("pod", None), ("cronjob", None)])
def test_kinds_a_user_may_type(typed: str, kind: str | None) -> None:
    assert kind_of(typed) == kind
