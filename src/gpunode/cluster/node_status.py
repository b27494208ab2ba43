"""Writing one node's chain conditions, its record ConfigMap and the Events of a change (the node checker only).

Three requests at most per check, one in the steady state: a strategic-merge patch of ``nodes/status`` (conditions
merge by ``type``, so the kubelet's own conditions are untouched), the record ConfigMap only when the verdict
changed (server-side apply, field manager ``gpunode-node-checker``), and one Event per condition that changed.
"""

from __future__ import annotations

from datetime import datetime

from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node
from lightkube.types import PatchType

from gpunode.cluster.client import ClusterSettings, api_call
from gpunode.cluster.manifests import CHECKER

MANAGER = CHECKER
RECORD_KEY = "results.json"  # the record's key in its ConfigMap


def patch_conditions(settings: ClusterSettings, node: str, conditions: list[dict]) -> None:
    api_call(settings, f"patch the status of node {node}",
             lambda client: client.patch(Node.Status, node, {"status": {"conditions": conditions}},
                                         patch_type=PatchType.STRATEGIC, field_manager=MANAGER))


def apply_record(settings: ClusterSettings, namespace: str, name: str, labels: dict[str, str],
                 data: dict[str, str]) -> None:
    body = ConfigMap(apiVersion="v1", kind="ConfigMap", metadata=ObjectMeta(name=name, namespace=namespace,
                                                                              labels=labels), data=data)
    api_call(settings, f"write ConfigMap {namespace}/{name}",
             lambda client: client.apply(body, field_manager=MANAGER, force=True))


def emit_event(settings: ClusterSettings, node: str, namespace: str, condition: dict, evidence: list[str],
               now: datetime) -> None:
    """An Event on the Node (in ``namespace``, as node-problem-detector's go to default) for a changed condition."""
    words = condition["message"] + ("".join(f"\n{line}" for line in evidence[:20]) if evidence else "")
    body = Event(metadata=ObjectMeta(generateName=f"{node}.", namespace=namespace),
                 involvedObject=ObjectReference(kind="Node", name=node, uid=node, apiVersion="v1"),
                 reason=condition["reason"], message=words[:4096],
                 type="Normal" if condition["status"] == "True" else "Warning",
                 source=EventSource(component=MANAGER, host=node), firstTimestamp=now, lastTimestamp=now, count=1,
                 reportingComponent=MANAGER, reportingInstance=node)
    api_call(settings, f"create an Event on node {node}", lambda client: client.create(body))
