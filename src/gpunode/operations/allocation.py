"""Operations of a node's GPU allocation method (``gpu_allocation``): the device plugin or gpunode's DRA driver.

One method per node, never both: which of gpunode's DaemonSets runs there follows the node's label
(``gpunode.io/device-plugin`` or ``gpunode.io/dra-driver``, set by the labels step). A node that changes method
is cordoned and drained of its GPU pods first (pods holding GPUs through the old method would otherwise share
them with pods the new one places), relabelled, and uncordoned once the new method offers its GPUs. A node on
the DRA driver is proven by its ResourceSlice, as a device-plugin node is by its allocatable count.
"""

from __future__ import annotations

import time

from pyinfra import host
from pyinfra.api import Host, operation

from gpunode.cluster.client import ClusterSettings
from gpunode.cluster.labels import METHOD_LABELS
from gpunode.diagnosis import Finding, Verdict
from gpunode.diagnosis.device_plugin import (
    DRA_DAEMONSET,
    DRA_DRIVER,
    allocatable_gpus,
    dra_driver_replaced,
    dra_offer,
)
from gpunode.errors import GpunodeError
from gpunode.facts.claims import read_node_devices
from gpunode.facts.device_plugin import read_plugin_pod
from gpunode.facts.labels import NodeLabelsState, read_node
from gpunode.operations import control_command, failing_command
from gpunode.operations.driver import reboot_planned
from gpunode.operations.labels import node_of_run
from gpunode.operations.reboot import evict_gpu_pods, fresh_driver_state, set_unschedulable
from gpunode.operations.run_state import host_run

POLL_SECONDS = 1.0


def switching_from(labels: dict[str, str], method: str) -> str | None:
    """The other method a node's live labels place on it while ``method`` is wanted, or None."""
    for other, label in METHOD_LABELS.items():
        if other != method and labels.get(label) == "true":
            return other
    return None


def cordon_and_drain(target: Host, settings: ClusterSettings, node: str, reason: str, timeout: int) -> None:
    set_unschedulable(target, settings, node, True, reason)
    evict_gpu_pods(target, settings, node, timeout)


@operation()
def drained_for_switch(node_name: str, method: str, settings: ClusterSettings, timeout: int):
    """
    Cordon the node and evict its GPU pods where it changes allocation method (before its labels move).

    + node_name: the Node's name
    + method: the method the inventory wants (gpu_allocation)
    + settings: which cluster
    + timeout: seconds for the evictions (PodDisruptionBudgets respected)
    """
    try:
        node = node_of_run(settings, node_name)
    except GpunodeError as error:
        yield failing_command(str(error))
        return
    old = switching_from(node.labels, method) if node.exists else None
    if old is None:
        host.noop(f"node {node_name}: allocation method unchanged")
        return
    reason = f"gpunode: moving from {old} to {method} (gpu_allocation)"
    host_run(host).switching = reason
    yield control_command(cordon_and_drain, settings, node_name, reason, timeout)


def dra_served(node: NodeLabelsState, gpus: list[dict], devices: list[str], namespace: str) -> tuple[bool, Finding]:
    """(whether the node is served by gpunode's DRA driver alone, the judgement): its slice lists its GPUs (a
    cordon aside, which the switch lifts after) and no device plugin offers nvidia.com/gpu beside it."""
    finding = dra_offer(node, gpus, devices, namespace)[0]
    listed = finding.state is Verdict.OK or finding.code == "node-cordoned"
    return listed and not allocatable_gpus(node), finding


def wait_dra_offer(target: Host, settings: ClusterSettings, node: str, gpus: list[dict] | None,
                   namespace: str) -> None:
    """Until the node's ResourceSlice from gpunode's driver lists its GPUs (``None``: the GPUs read after this run's
    reboot) and no device plugin offers them."""
    if gpus is None:
        state = fresh_driver_state(target)
        gpus = state["nvidia_smi"]["gpus"] if state else []
    deadline = time.monotonic() + settings.allocatable_timeout
    replaced = host_run(target).replaced  # the driver pod this run restarted: its slice proves nothing new
    while True:
        current = read_node(settings, node)
        devices = read_node_devices(settings, node, DRA_DRIVER)
        served, finding = dra_served(current, gpus, devices, namespace)
        if served and replaced is not None:
            waiting = dra_driver_replaced(read_plugin_pod(settings, namespace, node, DRA_DAEMONSET), replaced,
                                          namespace)
            served, finding = waiting is None, waiting or finding
        if served:
            target.log(f"{node}: {len(devices)} device(s) in its ResourceSlice from {DRA_DRIVER}")
            return
        if time.monotonic() > deadline:
            if finding.state is Verdict.OK or finding.code == "node-cordoned":  # the slice is there: a plugin lingers
                raise GpunodeError(f"{node} still offers nvidia.com/gpu="
                                   f"{current.allocatable.get('nvidia.com/gpu')} from a device plugin after "
                                   f"{settings.allocatable_timeout} s, beside its ResourceSlice",
                                   f"kubectl -n {namespace} get pods -o wide --field-selector spec.nodeName={node}: "
                                   "gpunode's device plugin must leave the node (its label "
                                   f"{METHOD_LABELS['device-plugin']} removed by deploys/labels.py), as must NVIDIA's")
            raise GpunodeError(f"{finding.what} (after {settings.allocatable_timeout} s)\n  evidence: "
                               + "\n            ".join(finding.evidence), finding.fix)
        time.sleep(POLL_SECONDS)


@operation()
def dra_offered(node_name: str, gpus: list[dict] | None, namespace: str, settings: ClusterSettings):
    """
    Check that gpunode's DRA driver offers the node's GPUs (its ResourceSlice), waiting up to
    ``allocatable_timeout`` for the driver's pod; then uncordon a node this run moved to DRA.

    + node_name: the Node's name
    + gpus: the driver facts' GPU rows (None: no working driver when the run began)
    + namespace: the driver's namespace
    + settings: which cluster
    """
    switching = host_run(host).switching
    if reboot_planned(host):  # the GPUs of after the reboot, read then
        yield control_command(wait_dra_offer, settings, node_name, None, namespace)
        return
    if gpus is None:
        host.noop(f"node {node_name}: no GPUs to check")
        return
    try:
        devices = read_node_devices(settings, node_name, DRA_DRIVER)
        node = node_of_run(settings, node_name)
    except GpunodeError as error:
        yield failing_command(str(error))
        return
    served, finding = dra_served(node, gpus, devices, namespace)
    if not switching and not host_run(host).replugged and served and finding.state is Verdict.OK:
        host.noop(f"node {node_name}: {len(devices)} device(s) in its ResourceSlice from {DRA_DRIVER}")
        return
    yield control_command(wait_dra_offer, settings, node_name, gpus, namespace)


@operation()
def uncordoned_after_switch(node_name: str, settings: ClusterSettings):
    """
    Uncordon a node this run moved to another allocation method, once that method offers its GPUs.

    + node_name: the Node's name
    + settings: which cluster
    """
    if host_run(host).switching is None:
        host.noop("no allocation method change")
        return
    yield control_command(set_unschedulable, settings, node_name, False)

