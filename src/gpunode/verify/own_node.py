"""The cluster as one node's checker reads it, to judge that node's labels and device-plugin links.

``ClusterView`` reads lists of every Node and every plugin pod once per verification, the right cost for one
controller judging all nodes; on every node at every interval the same lists would cost the API server the
square of the fleet. This view reads only what concerns its node: its Node, the plugin's DaemonSet, the plugin pod
bound to it and the pods of NVIDIA's DaemonSets bound to it (both lists filtered by the node, as the kubelet reads
its own pods). The nodes' Warning events are not read: they add words to a finding that stands without them. Nor
is the list of ResourceSlices: a node offered by a device plugin and a DRA driver at once is judged by ``gpunode
verify`` and ``doctor`` from one list of every slice, not by every node at every interval (nor does the checker's
identity have the right to list them); a node on gpunode's DRA driver has its own slice read by name.
"""

from __future__ import annotations

from gpunode.cluster.client import ClusterSettings
from gpunode.diagnosis.device_plugin import dra_slice_name
from gpunode.facts.claims import read_slice_devices
from gpunode.facts.coexistence import ForeignDaemonSet, read_foreign_on
from gpunode.facts.device_plugin import PluginPodState, being_deleted, plugin_pod_state, read_plugin_pod_on
from gpunode.facts.labels import NodeLabelsState, read_node
from gpunode.verify.checks import ClusterView


class OwnNodeView(ClusterView):
    """One node's share of the cluster, each object read once per check."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.own = node
        self.own_state: NodeLabelsState | None = None
        self.own_foreign: list[ForeignDaemonSet] | None = None

    def node(self, settings: ClusterSettings, name: str) -> NodeLabelsState:
        if name != self.own:
            return read_node(settings, name)
        with self.lock:
            if self.own_state is None:
                self.own_state = read_node(settings, name)
            return self.own_state

    def foreign(self, settings: ClusterSettings) -> list[ForeignDaemonSet]:
        with self.lock:
            if self.own_foreign is None:
                self.own_foreign = read_foreign_on(settings, self.own)
            return self.own_foreign

    def node_warnings(self, settings: ClusterSettings, name: str) -> tuple[str, ...]:
        return ()

    def offered(self, settings: ClusterSettings) -> dict[str, dict[str, list[str]]]:
        return {}

    def dra_devices(self, settings: ClusterSettings, node: str) -> list[str] | None:
        """Its own node's slice from gpunode's DRA driver, read by name (one GET, no list of every slice)."""
        return read_slice_devices(settings, dra_slice_name(node))

    def plugin_pod(self, settings: ClusterSettings, namespace: str, node: str,
                   read_log: bool = False) -> PluginPodState:
        pod = read_plugin_pod_on(settings, namespace, node)
        return plugin_pod_state(settings, namespace, node, None if being_deleted(pod) else pod, read_log)
