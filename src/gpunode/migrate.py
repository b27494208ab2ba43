"""``gpunode migrate``: move nodes, one at a time, from NVIDIA's device plugin to gpunode's.

Per node, in inventory order, and only through the Kubernetes API:

1. NVIDIA's plugin is made to leave the node: the GPU Operator's own switch (the node label
   ``nvidia.com/gpu.deploy.device-plugin=false``) where the Operator runs it; otherwise its DaemonSet gets,
   once, a required node affinity ``gpunode.io/device-plugin DoesNotExist`` (its pods restart once, as for any
   template change; running GPU pods are not touched by a device plugin's restart), and the roll of that
   change is waited for;
2. the node gets the label ``gpunode.io/device-plugin=true``: NVIDIA's pod leaves it, gpunode's DaemonSet
   (which selects that label) places its plugin there;
3. the move is proven: NVIDIA's pod gone from the node, gpunode's plugin pod ready there, the node's
   allocatable ``nvidia.com/gpu`` back at what it was, and every GPU pod that ran on the node before still
   running, the same pod (UID) with the same restart count. A node that fails stops the migration there
   and says what it left.

The way back for one node is to remove the label ``gpunode.io/device-plugin`` (NVIDIA's plugin returns).
GPU Feature Discovery is left alone: the labels it owns stay its own (server-side apply never takes them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpunode.cluster.client import FIELD_MANAGER, ClusterSettings, api_call
from gpunode.cluster.labels import PLUGIN_LABEL
from gpunode.connection import Connections, Unreachable
from gpunode.errors import GpunodeError
from gpunode.facts.coexistence import OPERATOR_SWITCH, ForeignDaemonSet, read_foreign, registrar_on
from gpunode.facts.device_plugin import pod_ready, read_plugin_pods, read_rollout
from gpunode.facts.labels import NodeLabelsState, read_node
from gpunode.host_settings import settings_of
from gpunode.verify.targets import Target, load_inventory

RESOURCE = "nvidia.com/gpu"
POLL_SECONDS = 1.0


@dataclass
class NodeMove:
    """What migrate did on one host's node."""

    host: str
    node: str = ""
    outcome: str = "not started"  # moved, would move (dry), nothing to do, failed, not started
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GpuPod:
    """A running pod that holds GPUs on the node: it must come through the move untouched."""

    reference: str
    uid: str
    restarts: int


def gpu_pods(settings: ClusterSettings, node: str) -> dict[str, GpuPod]:
    """The node's running pods with an ``nvidia.com/gpu`` limit, by namespace/name."""
    def read(client: Any) -> dict[str, GpuPod]:
        found = {}
        for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": node}):
            wants = any((c.resources and c.resources.limits or {}).get(RESOURCE) for c in pod.spec.containers)
            if wants and pod.status and pod.status.phase == "Running":
                restarts = sum(s.restartCount for s in pod.status.containerStatuses or [])
                reference = f"{pod.metadata.namespace}/{pod.metadata.name}"
                found[reference] = GpuPod(reference, pod.metadata.uid, restarts)
        return found

    return api_call(settings, f"list the GPU pods on {node}", read)


def affinity_terms(daemonset: DaemonSet) -> list[dict]:
    """The DaemonSet's required node-selector terms with ``PLUGIN_LABEL DoesNotExist`` added to each (AND)."""
    spec = daemonset.spec.template.spec
    required = spec.affinity and spec.affinity.nodeAffinity and \
        spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
    terms = [term.to_dict() for term in (required.nodeSelectorTerms if required else [])] or [{}]
    keep_off = {"key": PLUGIN_LABEL, "operator": "DoesNotExist"}
    for term in terms:
        expressions = term.setdefault("matchExpressions", [])
        if keep_off not in expressions:
            expressions.append(keep_off)
    return terms


def keep_off_gpunode_nodes(settings: ClusterSettings, registrar: ForeignDaemonSet, say: Callable[[str], None]) -> None:
    """Make NVIDIA's (non-Operator) plugin DaemonSet avoid nodes labelled for gpunode's plugin, and wait for it."""
    def patch(client: Any) -> None:
        live = client.get(DaemonSet, registrar.name, namespace=registrar.namespace)
        body = {"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": affinity_terms(live)}}}}}}}
        client.patch(DaemonSet, registrar.name, body, namespace=registrar.namespace, patch_type=PatchType.MERGE,
                     field_manager=FIELD_MANAGER)

    api_call(settings, f"add the node affinity {PLUGIN_LABEL} DoesNotExist to daemonset {registrar.reference}",
             patch)
    say(f"daemonset {registrar.reference}: required node affinity {PLUGIN_LABEL} DoesNotExist added (its pods "
        "restart once)")
    deadline = time.monotonic() + settings.rollout_timeout
    while True:
        live = api_call(settings, f"read daemonset {registrar.reference}",
                        lambda client: client.get(DaemonSet, registrar.name, namespace=registrar.namespace))
        status = live.status
        if status and (status.observedGeneration or 0) >= (live.metadata.generation or 0) and \
                status.desiredNumberScheduled == (status.updatedNumberScheduled or 0) == (status.numberReady or 0):
            say(f"daemonset {registrar.reference}: rolled out ({status.numberReady}/{status.desiredNumberScheduled} "
                "ready)")
            return
        if time.monotonic() > deadline:
            raise GpunodeError(f"daemonset {registrar.reference} did not finish its roll within "
                               f"{settings.rollout_timeout} s after the affinity was added",
                               f"kubectl -n {registrar.namespace} rollout status daemonset {registrar.name}")
        time.sleep(POLL_SECONDS)


def label_for_gpunode(settings: ClusterSettings, node: NodeLabelsState) -> None:
    """Server-side apply of gpunode's labels on the node plus ``PLUGIN_LABEL=true`` (gpunode's set stays whole)."""
    labels = {key: node.labels[key] for key in node.ours if key in node.labels}
    labels[PLUGIN_LABEL] = "true"
    body = Node(apiVersion="v1", kind="Node", metadata=ObjectMeta(name=node.name, labels=labels))
    api_call(settings, f"label node {node.name}", lambda client: client.apply(body, field_manager=FIELD_MANAGER))


def switch_operator_plugin_off(settings: ClusterSettings, node: str) -> None:
    """The GPU Operator's own per-node switch for its device plugin (a plain label, as kubectl label sets it)."""
    api_call(settings, f"label node {node} {OPERATOR_SWITCH}=false",
             lambda client: client.patch(Node, node, {"metadata": {"labels": {OPERATOR_SWITCH: "false"}}},
                                         patch_type=PatchType.MERGE))


def allocatable(node: NodeLabelsState) -> str:
    return node.allocatable.get(RESOURCE, "0")


def wait_moved(settings: ClusterSettings, namespace: str, node: str, registrar: ForeignDaemonSet,
               count: str, before: dict[str, GpuPod], say: Callable[[str], None]) -> None:
    """Until NVIDIA's pod has left, gpunode's is ready and offers ``count`` GPUs again, GPU pods untouched."""
    deadline = time.monotonic() + settings.rollout_timeout + settings.allocatable_timeout
    while True:
        still = registrar_on(read_foreign(settings), node)
        ours = read_plugin_pods(settings, namespace).get(node)
        current = read_node(settings, node)
        pods = gpu_pods(settings, node)
        disturbed = [p for ref, p in before.items() if pods.get(ref) != p]
        if disturbed:
            raise GpunodeError(f"{node}: GPU pods changed during the move: {', '.join(p.reference for p in disturbed)}"
                               " (not running, replaced or restarted)",
                               f"kubectl describe pod for each; the node keeps the label {PLUGIN_LABEL}=true: "
                               "remove it to give the node back to NVIDIA's plugin")
        if still is None and ours is not None and pod_ready(ours) and allocatable(current) == count:
            say(f"{node}: NVIDIA's pod gone, gpunode's plugin pod {ours.metadata.name} ready, {count} allocatable "
                f"{RESOURCE}, {len(before)} running GPU pod(s) undisturbed"
                + (f" ({', '.join(sorted(before))})" if before else ""))
            return
        if time.monotonic() > deadline:
            where = (f"NVIDIA's pod {still.pods[node]} still there" if still else "NVIDIA's pod gone") + \
                (f"; gpunode's pod {ours.metadata.name} {'ready' if pod_ready(ours) else 'not ready'}" if ours
                 else "; no gpunode plugin pod on the node") + \
                f"; allocatable {RESOURCE} {allocatable(current)} (was {count})"
            raise GpunodeError(f"{node} did not move within {settings.rollout_timeout + settings.allocatable_timeout}"
                               f" s: {where}",
                               f"'gpunode doctor INVENTORY --node HOST' names the broken link; the node keeps the "
                               f"label {PLUGIN_LABEL}=true (remove it to give the node back to NVIDIA's plugin)")
        time.sleep(POLL_SECONDS)


def node_names(targets: list[Target]) -> dict[str, str]:
    """Each host's Kubernetes node name: ``k8s_node_name``, else its hostname (read over SSH, as the deploy does)."""
    names: dict[str, str] = {}
    unknown = [t for t in targets if not settings_of(t).cluster.k8s_node_name]
    for target in targets:
        if target not in unknown:
            names[target.name] = settings_of(target).cluster.k8s_node_name
    if unknown:
        connections = Connections([(t.name, t.data) for t in unknown])
        try:
            for name, reply in connections.run_all("hostname", 20).items():
                if isinstance(reply, Unreachable):
                    raise GpunodeError(reply.problem, reply.fix)
                names[name] = reply.stdout.strip()
        finally:
            connections.close()
    return names


def move(target: Target, node: str, dry: bool, say: Callable[[str], None]) -> NodeMove:
    result = NodeMove(target.name, node)
    settings = settings_of(target).cluster
    namespace = settings_of(target).manifests.namespace

    def note(line: str) -> None:
        result.lines.append(line)
        say(f"{target.name}: {line}")

    state = read_node(settings, node)
    if not state.exists:
        raise GpunodeError(f"no Node named {node} in the cluster", "set k8s_node_name for the host")
    registrar = registrar_on(read_foreign(settings), node)
    if registrar is None:
        result.outcome = "nothing to do"
        note("already served by gpunode's plugin" if state.labels.get(PLUGIN_LABEL) == "true" else
             "NVIDIA's device plugin does not run on this node: nothing to migrate ('gpunode deploy' serves it)")
        return result
    if not read_rollout(settings, namespace).exists:
        raise GpunodeError(f"gpunode's device plugin is not deployed in {namespace}",
                           "run 'gpunode deploy INVENTORY' first: it leaves the nodes NVIDIA's plugin serves alone")
    count = allocatable(state)
    before = gpu_pods(settings, node)
    how = (f"switch the GPU Operator's plugin off with {OPERATOR_SWITCH}=false" if registrar.operator_managed else
           f"keep daemonset {registrar.reference} off nodes labelled {PLUGIN_LABEL}" +
           (" (already set)" if registrar.excludes_plugin_label else ""))
    if dry:
        result.outcome = "would move"
        note(f"would {how}, label {node} {PLUGIN_LABEL}=true, and wait for gpunode's plugin ({count} GPUs now, "
             f"{len(before)} running GPU pod(s))")
        return result
    note(f"served by NVIDIA's {registrar.reference} (pod {registrar.pods[node]}), {count} allocatable {RESOURCE}, "
         f"{len(before)} running GPU pod(s)")
    if registrar.operator_managed:
        switch_operator_plugin_off(settings, node)
        note(f"label {OPERATOR_SWITCH}=false set")
    elif not registrar.excludes_plugin_label:
        keep_off_gpunode_nodes(settings, registrar, note)
    label_for_gpunode(settings, state)
    note(f"label {PLUGIN_LABEL}=true set")
    wait_moved(settings, namespace, node, registrar, count, before, note)
    result.outcome = "moved"
    return result


def migrate(inventory: str, limit: list[str] | None, data: dict[str, str] | None, dry: bool,
            say: Callable[[str], None]) -> tuple[int, list[NodeMove]]:
    """Move each host's node in turn; stop at the first failure. Exit code 0 all done, 1 a node failed."""
    targets = [t for t in load_inventory(inventory, limit, data) if settings_of(t).cluster.cluster_steps]
    if not targets:
        raise GpunodeError("no host with cluster_steps = True to migrate")
    names = node_names(targets)
    moves = [NodeMove(t.name, names[t.name]) for t in targets]
    for index, target in enumerate(targets):
        try:
            moves[index] = move(target, names[target.name], dry, say)
        except GpunodeError as error:
            moves[index].outcome = "failed"
            moves[index].lines.append(str(error))
            say(f"{target.name}: FAILED: {error}")
            return 1, moves
    return 0, moves
