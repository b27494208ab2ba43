"""Operations of the labels step: the node's GPU labels, applied server-side as field manager ``gpunode``.

All of a node's labels go in one apply, so a node never carries half a set; a
label gpunode applied before and that no longer holds is dropped from the set
and the API removes it; a label another manager holds with another value is
left alone (with a warning). A node whose labels are up to date gets no write.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from pyinfra import host, logger
from pyinfra.api import Host, operation

from gpunode.cluster.client import FIELD_MANAGER, ClusterSettings, api_call
from gpunode.diagnosis import Severity
from gpunode.diagnosis.labels import diagnose, plan, up_to_date
from gpunode.errors import GpunodeError
from gpunode.facts.labels import read_node
from gpunode.operations import api_command, failing_command

_relabelled: WeakKeyDictionary[Host, bool] = WeakKeyDictionary()


def relabelled(target: Host) -> bool:
    """True when this run changes the host's node labels (its plugin pod may come or go)."""
    return _relabelled.get(target, False)


def apply_labels(target: Host, settings: ClusterSettings, node: str, labels: dict[str, str]) -> None:
    """Server-side apply of exactly ``labels`` as gpunode's set on ``node`` (never forced)."""
    body = Node(apiVersion="v1", kind="Node", metadata=ObjectMeta(name=node, labels=labels))
    api_call(settings, f"label node {node}", lambda client: client.apply(body, field_manager=FIELD_MANAGER))


@operation()
def applied(node_name: str, labels: dict[str, str], settings: ClusterSettings):
    """
    Make ``labels`` gpunode's labels on the Kubernetes node ``node_name``.

    + node_name: the Node's name in the cluster
    + labels: the full set gpunode wants there ({} removes every label gpunode set)
    + settings: which cluster (kubeconfig, context)
    """
    try:
        state = read_node(settings, node_name)
    except GpunodeError as error:
        yield failing_command(str(error))
        return
    findings = diagnose(state, labels)
    missing = [f for f in findings if f.code == "node-missing"]
    if missing:
        yield failing_command(str(missing[0]))
        return
    for finding in findings:
        if finding.severity is Severity.WARN:
            host.log_styled(f"warning: {finding.what}", fg="yellow", log_func=logger.warning)
    wanted, _ = plan(state, labels)
    if up_to_date(state, wanted):
        host.noop(f"node {node_name}: {len(wanted)} gpunode label(s) up to date")
        return
    _relabelled[host] = True
    yield api_command(apply_labels, settings, node_name, wanted)
