"""NVIDIA's own device plugin and GPU Feature Discovery on the cluster: which DaemonSets, on which nodes.

A cluster that already runs NVIDIA's stack is where most migrations start. Two
``nvidia.com/gpu`` registrars on one node fight over the kubelet's resource
(allocatable flaps as each re-registers), so gpunode must know, per node,
whether NVIDIA's plugin serves it. Read with one list of every DaemonSet and
one list of each NVIDIA DaemonSet's pods (by its own selector).

NVIDIA's plugin is recognised in each of its usual forms: the static manifest
(``kube-system/nvidia-device-plugin-daemonset``, pods labelled
``name=nvidia-device-plugin-ds``), the Helm chart (``nvidia-device-plugin`` in
the name or ``app.kubernetes.io/name``), the GPU Operator's operand (the same
DaemonSet name, node selector ``nvidia.com/gpu.deploy.device-plugin=true``),
and any DaemonSet running a ``k8s-device-plugin`` image. GPU Feature Discovery
likewise by ``gpu-feature-discovery``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Pod

from gpunode.cluster.client import ClusterSettings, api_call
from gpunode.cluster.labels import PLUGIN_LABEL

DEVICE_PLUGIN = "device-plugin"
FEATURE_DISCOVERY = "gpu-feature-discovery"
OPERATOR_SWITCH = "nvidia.com/gpu.deploy.device-plugin"  # the GPU Operator's per-node switch for its plugin
OWN_DAEMONSET = "gpunode-device-plugin"


@dataclass(frozen=True)
class ForeignDaemonSet:
    """One of NVIDIA's DaemonSets and the nodes its pods run on."""

    namespace: str
    name: str
    component: str  # DEVICE_PLUGIN or FEATURE_DISCOVERY
    node_selector: dict[str, str] = field(default_factory=dict)
    excludes_plugin_label: bool = False  # its affinity keeps it off nodes labelled PLUGIN_LABEL (gpunode migrate)
    pods: dict[str, str] = field(default_factory=dict)  # node -> pod name

    @property
    def reference(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def operator_managed(self) -> bool:
        """The GPU Operator's operand: switched off per node by its own label, never edited."""
        return self.node_selector.get(OPERATOR_SWITCH) == "true"


def component_of(name: str, labels: dict[str, str], images: list[str]) -> str | None:
    """Which of NVIDIA's components a DaemonSet runs (by its name, its pods' labels, its images), if any."""
    words = [name, *labels.values(), *images]
    if any("gpu-feature-discovery" in word for word in words):
        return FEATURE_DISCOVERY
    if name == OWN_DAEMONSET or labels.get("app.kubernetes.io/name") == OWN_DAEMONSET:
        return None
    if any("nvidia-device-plugin" in word or "k8s-device-plugin" in word for word in words):
        return DEVICE_PLUGIN
    return None


def excludes_plugin_label(spec: Any) -> bool:
    """True when a pod spec's required node affinity keeps it off nodes that carry PLUGIN_LABEL."""
    affinity = getattr(getattr(spec, "affinity", None), "nodeAffinity", None)
    required = getattr(affinity, "requiredDuringSchedulingIgnoredDuringExecution", None)
    terms = getattr(required, "nodeSelectorTerms", None) or []
    return bool(terms) and all(any(e.key == PLUGIN_LABEL and e.operator == "DoesNotExist"
                                   for e in (term.matchExpressions or [])) for term in terms)


def parse_daemonset(daemonset: DaemonSet) -> ForeignDaemonSet | None:
    template = daemonset.spec.template
    spec = template.spec
    labels = dict((template.metadata.labels if template.metadata else None) or {})
    images = [c.image or "" for c in [*(spec.containers or []), *(spec.initContainers or [])]]
    component = component_of(daemonset.metadata.name, labels, images)
    if component is None:
        return None
    return ForeignDaemonSet(daemonset.metadata.namespace, daemonset.metadata.name, component,
                            dict(spec.nodeSelector or {}), excludes_plugin_label(spec))


def read_foreign(settings: ClusterSettings) -> list[ForeignDaemonSet]:
    """NVIDIA's DaemonSets on the cluster, each with the nodes its (not terminating) pods are bound to."""
    def read(client: Any) -> list[ForeignDaemonSet]:
        found = []
        for daemonset in client.list(DaemonSet, namespace="*"):
            parsed = parse_daemonset(daemonset)
            if parsed is None:
                continue
            selector = dict(daemonset.spec.selector.matchLabels or {})
            pods = {pod.spec.nodeName: pod.metadata.name
                    for pod in client.list(Pod, namespace=parsed.namespace, labels=selector)
                    if pod.spec.nodeName and not pod.metadata.deletionTimestamp}
            found.append(ForeignDaemonSet(parsed.namespace, parsed.name, parsed.component, parsed.node_selector,
                                          parsed.excludes_plugin_label, pods))
        return found

    return api_call(settings, "list NVIDIA's DaemonSets (device plugin, GPU Feature Discovery)", read)


def read_foreign_on(settings: ClusterSettings, node: str) -> list[ForeignDaemonSet]:
    """NVIDIA's DaemonSets whose pods run on ``node``, from the pods bound to it (one list filtered by the node,
    as the kubelet reads its own): what the node checker reads instead of every DaemonSet and its pods."""
    def read(client: Any) -> list[ForeignDaemonSet]:
        found: dict[tuple[str, str], ForeignDaemonSet] = {}
        for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": node}):
            owner = next((o for o in pod.metadata.ownerReferences or [] if o.kind == "DaemonSet"), None)
            if owner is None or pod.metadata.deletionTimestamp:
                continue
            images = [c.image or "" for c in [*(pod.spec.containers or []), *(pod.spec.initContainers or [])]]
            component = component_of(owner.name, dict(pod.metadata.labels or {}), images)
            if component is not None:
                found[(pod.metadata.namespace, owner.name)] = ForeignDaemonSet(
                    pod.metadata.namespace, owner.name, component, pods={node: pod.metadata.name})
        return list(found.values())

    return api_call(settings, f"list the pods on node {node}", read)


def registrar_on(foreign: list[ForeignDaemonSet], node: str) -> ForeignDaemonSet | None:
    """NVIDIA's device plugin whose pod runs on ``node``, if one does."""
    return next((ds for ds in foreign if ds.component == DEVICE_PLUGIN and node in ds.pods), None)
