"""The node checker's records: one ConfigMap per node in the plugin's namespace, read in one labelled list.

Each holds the verdict of its node's links as the checker judged them (``gpunode.verify.node_conditions``);
``gpunode verify --in-cluster`` and ``gpunode doctor --in-cluster`` read them instead of reaching every node.
"""

from __future__ import annotations

import json

from lightkube.operators import exists
from lightkube.resources.core_v1 import ConfigMap

from gpunode.cluster.client import ClusterSettings, api_call, get_or_none
from gpunode.cluster.node_status import RECORD_KEY

RECORD_LABEL = "gpunode.io/node-record"


def parse_record(configmap: ConfigMap) -> tuple[str, dict | str]:
    """(node, its record) or (node, why the record cannot be read)."""
    labels = configmap.metadata.labels or {}
    node = labels.get(RECORD_LABEL) or configmap.metadata.name
    text = (configmap.data or {}).get(RECORD_KEY)
    if text is None:
        return node, f"ConfigMap {configmap.metadata.name} has no {RECORD_KEY}"
    try:
        data = json.loads(text)
    except ValueError as error:
        return node, f"ConfigMap {configmap.metadata.name} key {RECORD_KEY} is not JSON: {error}"
    if not isinstance(data, dict) or not isinstance(data.get("steps"), dict):
        return node, f"ConfigMap {configmap.metadata.name} key {RECORD_KEY} has no steps"
    return node, data


def read_node_records(settings: ClusterSettings, namespace: str) -> dict[str, dict | str]:
    """Every node's record by node name (a string where it cannot be read), in one list call."""
    found = api_call(settings, f"list the node checker's ConfigMaps in {namespace}",
                     lambda client: list(client.list(ConfigMap, namespace=namespace, labels={RECORD_LABEL: exists()})))
    return dict(parse_record(configmap) for configmap in found)


def read_record_text(settings: ClusterSettings, namespace: str, name: str) -> str:
    """One node's record as its ConfigMap holds it ('' when there is none): what a restarted checker compares its
    first verdict with."""
    found = api_call(settings, f"read ConfigMap {namespace}/{name}",
                     lambda client: get_or_none(client, ConfigMap, name, namespace))
    return (found.data or {}).get(RECORD_KEY, "") if found is not None else ""
