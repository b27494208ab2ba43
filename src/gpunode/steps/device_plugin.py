"""Step 7: roll out the device-plugin DaemonSet and prove each GPU node offers all its GPUs."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from pyinfra import host, logger
from pyinfra.api.deploy import deploy

from gpunode.cluster.labels import LabelSettings
from gpunode.cluster.manifests import manifest_documents, node_settings_document
from gpunode.diagnosis.device_plugin import DRA_DAEMONSET
from gpunode.errors import GpunodeError
from gpunode.host_settings import parsed_hosts, settings_of, uses_dra
from gpunode.operations import allocation, device_plugin
from gpunode.operations.driver import driver_facts, gpu_present
from gpunode.operations.labels import nvidia_serves
from gpunode.settings import NodeSettings
from gpunode.steps.driver import node_name


def checker_settings(hosts: Any) -> dict[str, dict]:
    """Each inventory host's node settings that differ from the defaults, by its Node name (k8s_node_name, else
    the host's name): what the node checker on that node expects. A host with bad data is left out (its own
    steps fail it with why)."""
    defaults = NodeSettings()
    per_node = {}
    for each, parsed in parsed_hosts(hosts):
        values = {f.name: getattr(parsed.node, f.name) for f in fields(NodeSettings)
                  if getattr(parsed.node, f.name) != getattr(defaults, f.name)}
        if parsed.labels.allocation != LabelSettings().allocation:  # its device_plugin link is judged by its slice
            values["gpu_allocation"] = parsed.labels.allocation
        per_node[parsed.cluster.k8s_node_name or each.name] = values
    return per_node


@deploy("Device plugin")
def device_plugin_rollout() -> None:
    parsed = settings_of(host)
    settings = parsed.cluster
    if not settings.cluster_steps:
        host.noop("cluster steps are off for this host (cluster_steps = False)")
        return
    manifests = device_plugin.pinned_manifests(parsed.manifests, parsed.registry,
                                               lambda line: logger.info(f"--> {line}"))
    if uses_dra(host.state.inventory):
        manifests = replace(manifests, dra_driver=True)
    documents = manifest_documents(manifests)
    if manifests.checker_image:  # the node checker's DaemonSet is in them: each node's settings beside it
        documents.append(node_settings_document(manifests.namespace, checker_settings(host.state.inventory)))
    device_plugin.manifests_applied(name="Apply the device plugin's objects", documents=documents,
                                    settings=settings, _run_once=True)
    device_plugin.rolled_out(name="Wait for the device-plugin rollout", namespace=manifests.namespace,
                             settings=settings, _run_once=True)
    if not gpu_present(host):
        return
    gpus = (driver_facts(host).get("nvidia_smi") or {}).get("gpus") or []
    if not gpus and not parsed.node.reboot_on_mismatch:
        return
    name = node_name(settings)
    if parsed.labels.allocation == "dra":  # gpunode's DRA driver serves the node: its ResourceSlice is the proof
        device_plugin.restarted_after_driver_change(
            name="Restart the DRA driver on a changed driver", node_name=name, namespace=manifests.namespace,
            settings=settings, driver_version=gpus[0]["driver_version"] if gpus else None, daemonset=DRA_DAEMONSET)
        allocation.dra_offered(name="Check the node's GPUs in its ResourceSlice", node_name=name, gpus=gpus or None,
                               namespace=manifests.namespace, settings=settings)
        allocation.uncordoned_after_switch(name="Uncordon the node moved to DRA", node_name=name, settings=settings)
        return
    try:
        registrar = nvidia_serves(settings, name)
    except GpunodeError:
        registrar = None  # the API did not answer: the operations below fail the host with its words
    if registrar is not None:
        host.noop(f"node {name} is served by NVIDIA's device plugin {registrar.reference}: gpunode's plugin is "
                  "not placed there ('gpunode migrate' moves the node)")
        return
    device_plugin.restarted_after_driver_change(
        name="Restart the device plugin on a changed driver", node_name=name, namespace=manifests.namespace,
        settings=settings, driver_version=gpus[0]["driver_version"] if gpus else None)
    device_plugin.allocatable_matches(name="Check the node's allocatable GPUs", node_name=name,
                                      gpus=gpus or None, manifests=manifests, settings=settings)
    allocation.uncordoned_after_switch(name="Uncordon the node moved to the device plugin", node_name=name,
                                       settings=settings)
