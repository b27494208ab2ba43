"""What the kubelet (and anything else that watches a node, node-problem-detector included) said about Nodes: their
Warning events, from one list per verification, so a failing device-plugin link can quote the node's own words
(``Rebooted``, ``SystemOOM``, a detector's kernel or GPU report) beside the plugin's."""

from __future__ import annotations

from lightkube.resources.core_v1 import Event

from gpunode.cluster.client import ClusterSettings, api_call
from gpunode.errors import GpunodeError

KEEP = 3  # the last distinct lines per node: enough to say what happened, not a log


def event_line(event: Event) -> str:
    """``component: Reason: message``, as ``kubectl get events`` shows the source, reason and message."""
    source = (event.source.component if event.source and event.source.component else None) \
        or event.reportingComponent or "unknown source"
    return f"{source}: {event.reason}: {' '.join((event.message or '').split())}"


def moment(event: Event) -> str:
    """When the event last happened, as a sortable string ("" when it carries no time)."""
    stamp = event.lastTimestamp or event.eventTime or event.firstTimestamp
    return stamp.isoformat() if stamp else ""


def node_warnings(events: list[Event], keep: int = KEEP) -> dict[str, tuple[str, ...]]:
    """Per node name, its last ``keep`` distinct Warning lines, oldest first."""
    said: dict[str, list[str]] = {}
    for event in sorted(events, key=moment, reverse=True):
        involved = event.involvedObject
        if event.type != "Warning" or involved is None or involved.kind != "Node" or not involved.name:
            continue
        lines = said.setdefault(involved.name, [])
        line = event_line(event)
        if line not in lines and len(lines) < keep:
            lines.append(line)
    return {node: tuple(reversed(lines)) for node, lines in said.items()}


def read_node_warnings(settings: ClusterSettings) -> dict[str, tuple[str, ...]]:
    """Every Node's recent Warning events, in one list call (none where the events cannot be read: they only add
    words to a finding that stands without them)."""
    def find(client) -> list[Event]:
        return list(client.list(Event, namespace="*", fields={"involvedObject.kind": "Node", "type": "Warning"}))

    try:
        return node_warnings(api_call(settings, "list the nodes' Warning events", find))
    except GpunodeError:
        return {}
