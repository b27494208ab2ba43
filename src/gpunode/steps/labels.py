"""Step 6: label each Kubernetes node by its GPUs (short model label and GPU Feature Discovery's names) and by the
allocation method that serves it (``gpu_allocation``: the label that places gpunode's device plugin or its DRA
driver); a node that changes method is cordoned and drained of its GPU pods before its labels move."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api.deploy import deploy

from gpunode.cluster.labels import gpu_labels
from gpunode.host_settings import settings_of
from gpunode.operations import allocation, labels
from gpunode.operations.driver import driver_facts, gpu_present
from gpunode.steps.driver import node_name


def desired_labels() -> dict[str, str]:
    """This host's GPU labels from its driver facts; {} for a host without a working GPU.

    (A host this run reboots gets its labels from the facts read after the reboot: the operation sees to it.)
    """
    if not gpu_present(host):
        return {}
    state = driver_facts(host)
    computed = gpu_labels(((state.get("nvidia_smi") or {}).get("gpus")) or [], settings_of(host).labels)
    for warning in computed.warnings:
        host.log_styled(f"warning: {warning}", fg="yellow", log_func=logger.warning)
    return computed.labels


@deploy("Node labels")
def node_labels() -> None:
    settings = settings_of(host).cluster
    if not settings.cluster_steps:
        host.noop("cluster steps are off for this host (cluster_steps = False)")
        return
    parsed = settings_of(host)
    if gpu_present(host):
        allocation.drained_for_switch(name="Drain the node if it changes allocation method",
                                      node_name=node_name(settings), method=parsed.labels.allocation,
                                      settings=settings, timeout=parsed.node.reboot_timeout)
    labels.applied(name="Label the Kubernetes node by its GPUs", node_name=node_name(settings),
                   labels=desired_labels(), settings=settings, label_settings=parsed.labels)
