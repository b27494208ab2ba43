"""Reading a workload from the API: the object, the pods it owns, its controller's events, the namespace's quotas.

``doctor --pod`` names a pod; when there is none by that name, the name may be its workload's (a Deployment's
pods are ``NAME-<hash>-<id>``), and a workload whose pods are refused has none at all. Pods are found by owner
(a Deployment through the ReplicaSets it owns), never by label selector, so another workload's pods are not taken.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightkube.resources.apps_v1 import DaemonSet, Deployment, ReplicaSet, StatefulSet
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Event, LimitRange, Pod, ResourceQuota

from gpunode.cluster.client import get_or_none

GPU = "nvidia.com/gpu"
KINDS = ("Deployment", "StatefulSet", "Job", "ReplicaSet", "DaemonSet")


@dataclass(frozen=True)
class QuotaView:
    """One ResourceQuota of the namespace: its hard limits and what is used, as the API reports them."""

    name: str
    hard: dict[str, str]
    used: dict[str, str]

    def gpu_lines(self) -> list[str]:
        return [f"resourcequota {self.name}: {key} used {self.used.get(key, '0')} of {hard}"
                for key, hard in sorted(self.hard.items()) if GPU in key]


@dataclass(frozen=True)
class WorkloadView:
    """The workload, its events (and those of the ReplicaSets it owns), and the namespace around it."""

    kind: str
    namespace: str
    name: str
    replicas: int | None = None  # spec.replicas (Deployment, StatefulSet, ReplicaSet); None where it has none
    suspended: bool = False  # a Job's spec.suspend
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (object, reason, message), oldest first
    quotas: tuple[QuotaView, ...] = ()
    limit_ranges: tuple[str, ...] = ()

    @property
    def title(self) -> str:
        return f"{self.kind.lower()} {self.namespace}/{self.name}"

RESOURCES: dict[str, type] = {"Deployment": Deployment, "StatefulSet": StatefulSet, "Job": Job,
                              "ReplicaSet": ReplicaSet, "DaemonSet": DaemonSet}
# what a user may type for a kind: deployment, deployments, deploy, sts, ...
ALIASES = {**{kind.lower(): kind for kind in KINDS}, **{kind.lower() + "s": kind for kind in KINDS},
           "deploy": "Deployment", "sts": "StatefulSet", "rs": "ReplicaSet", "ds": "DaemonSet"}


def kind_of(text: str) -> str | None:
    return ALIASES.get(text.lower())


def owned_by(item: Any, uids: set[str]) -> bool:
    return any(ref.uid in uids for ref in (item.metadata.ownerReferences or []))


def find(client: Any, namespace: str, name: str, kind: str | None = None) -> tuple[str, Any] | None:
    """The workload named ``name`` (of ``kind``, or the first kind that has one), or None."""
    for each in [kind] if kind else KINDS:
        if each == "DaemonSet":  # gpunode may list DaemonSets everywhere but get them only in its own namespace
            found = next(iter(client.list(DaemonSet, namespace=namespace, fields={"metadata.name": name})), None)
        else:
            found = get_or_none(client, RESOURCES[each], name, namespace)
        if found is not None:
            return each, found
    return None


def read(client: Any, namespace: str, kind: str, workload: Any) -> tuple[WorkloadView, list[Any]]:
    """The workload's view for diagnosis and the pods it owns (oldest first)."""
    uids = {workload.metadata.uid}
    owners = [(kind, workload.metadata.name)]
    if kind == "Deployment":
        for rs in client.list(ReplicaSet, namespace=namespace):
            if owned_by(rs, uids):
                owners.append(("ReplicaSet", rs.metadata.name))
                uids.add(rs.metadata.uid)
    pods = sorted((p for p in client.list(Pod, namespace=namespace) if owned_by(p, uids)),
                  key=lambda p: p.metadata.creationTimestamp.timestamp() if p.metadata.creationTimestamp else 0)
    events = []
    for owner_kind, owner in owners:
        for event in client.list(Event, namespace=namespace, fields={"involvedObject.name": owner,
                                                                     "involvedObject.kind": owner_kind}):
            stamp = event.lastTimestamp or event.eventTime or event.firstTimestamp
            events.append((stamp.timestamp() if stamp else 0, f"{owner_kind.lower()} {owner}", event.reason or "",
                           event.message or ""))
    quotas = tuple(QuotaView(q.metadata.name, {k: str(v) for k, v in ((q.status.hard if q.status else None)
                                                                         or (q.spec.hard if q.spec else None)
                                                                         or {}).items()},
                             {k: str(v) for k, v in ((q.status.used if q.status else None) or {}).items()})
                   for q in client.list(ResourceQuota, namespace=namespace))
    ranges = tuple(f"limitrange {r.metadata.name}: " + "; ".join(
        f"{item.type} " + ", ".join(f"{what} {values}" for what, values in (("max", item.max), ("min", item.min))
                                    if values)
        for item in (r.spec.limits if r.spec else []) or []) for r in client.list(LimitRange, namespace=namespace))
    spec = workload.spec
    view = WorkloadView(kind, namespace, workload.metadata.name,
                        replicas=getattr(spec, "replicas", None) if kind != "DaemonSet" and kind != "Job" else None,
                        suspended=bool(getattr(spec, "suspend", False)) if kind == "Job" else False,
                        events=[(obj, reason, message) for _, obj, reason, message in sorted(events,
                                                                                            key=lambda e: e[0])],
                        quotas=quotas, limit_ranges=ranges)
    return view, pods
