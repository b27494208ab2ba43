"""What the Kubernetes API says about a node's labels and who owns them.

Cluster facts come from the API, not from a command on the host: each reader
fetches one object and keeps only what the step needs. Ownership is read from
``managedFields``: the labels gpunode applied (field manager ``gpunode``,
operation Apply) and the labels other managers hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from lightkube.resources.core_v1 import Node

from gpunode.cluster.client import FIELD_MANAGER, ClusterSettings, api_call, get_or_none

# set by gpunode's roll when it cordons a node (why), removed when it uncordons it
CORDON_REASON = "gpunode.io/cordon-reason"


@dataclass(frozen=True)
class NodeLabelsState:
    """A node's labels: all of them, the ones gpunode owns, and the owner of every other managed one."""

    name: str
    exists: bool
    labels: dict[str, str] = field(default_factory=dict)
    ours: frozenset[str] = frozenset()
    others: dict[str, str] = field(default_factory=dict)  # label -> the field manager that owns it
    allocatable: dict[str, str] = field(default_factory=dict)
    unschedulable: bool = False  # cordoned (spec.unschedulable)
    cordon_reason: str = ""  # gpunode's annotation saying why it cordoned the node, when it did
    taints: tuple[str, ...] = ()  # "key=value:Effect", as kubectl describe node prints them
    conditions: dict[str, dict] = field(default_factory=dict)  # type -> status, reason, message, times (as strings)


def label_keys(fields_v1: dict | None) -> set[str]:
    """Label keys in a FieldsV1 tree (``{"f:metadata": {"f:labels": {"f:key": {}}}}``)."""
    labels = ((fields_v1 or {}).get("f:metadata") or {}).get("f:labels") or {}
    return {key[2:] for key in labels if key.startswith("f:")}


def parse_node(name: str, node: Node | None) -> NodeLabelsState:
    if node is None:
        return NodeLabelsState(name, exists=False)
    ours: set[str] = set()
    others: dict[str, str] = {}
    for entry in node.metadata.managedFields or []:
        keys = label_keys(entry.fieldsV1)
        if entry.manager == FIELD_MANAGER and entry.operation == "Apply":
            ours |= keys
        else:
            others.update({key: entry.manager or "unknown" for key in keys})
    allocatable = dict(node.status.allocatable or {}) if node.status else {}
    return NodeLabelsState(name, True, dict(node.metadata.labels or {}), frozenset(ours), others, allocatable,
                           bool(node.spec and node.spec.unschedulable),
                           (node.metadata.annotations or {}).get(CORDON_REASON, ""),
                           tuple(f"{t.key}{'=' + t.value if t.value else ''}:{t.effect}"
                                 for t in (node.spec.taints or [] if node.spec else [])),
                           {c.type: {"status": c.status, "reason": c.reason or "", "message": c.message or "",
                                     "lastHeartbeatTime": api_time(c.lastHeartbeatTime),
                                     "lastTransitionTime": api_time(c.lastTransitionTime)}
                            for c in (node.status.conditions or [] if node.status else [])})


def api_time(value: object) -> str:
    """A condition time as the API server writes it (RFC 3339 in whole seconds, UTC), from what lightkube parsed
    (a datetime) or a datetime of ours; "" for none."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return (value.astimezone(UTC) if value.tzinfo else value).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def read_node(settings: ClusterSettings, name: str) -> NodeLabelsState:
    """The node's labels state; ``exists=False`` when the API has no such Node."""
    return parse_node(name, api_call(settings, f"read node {name}", lambda client: get_or_none(client, Node, name)))


def read_gpu_nodes(settings: ClusterSettings, label: str = "nvidia.com/gpu.present") -> list[NodeLabelsState]:
    """Every Node labelled ``<label>=true`` (the labels step's mark of a working GPU), in one list call."""
    nodes = api_call(settings, f"list nodes with {label}=true",
                     lambda client: list(client.list(Node, labels={label: "true"})))
    return [parse_node(node.metadata.name, node) for node in nodes]


def read_nodes(settings: ClusterSettings) -> dict[str, NodeLabelsState]:
    """Every Node of the cluster by name, in one list call (a run's cluster steps read them from it)."""
    nodes = api_call(settings, "list nodes", lambda client: list(client.list(Node)))
    return {node.metadata.name: parse_node(node.metadata.name, node) for node in nodes}
