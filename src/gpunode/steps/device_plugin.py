"""Step 7: roll out the device-plugin DaemonSet and prove each GPU node offers all its GPUs."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api.deploy import deploy

from gpunode.cluster.client import ClusterSettings
from gpunode.cluster.manifests import ManifestSettings, documents, render
from gpunode.facts.driver import DriverState
from gpunode.operations import device_plugin
from gpunode.operations.driver import gpu_present
from gpunode.steps.labels import desired_labels, node_name


@deploy("Device plugin")
def device_plugin_rollout() -> None:
    settings = ClusterSettings.from_data(host.data)
    if not settings.cluster_steps:
        host.noop("cluster steps are off for this host (cluster_steps = False)")
        return
    manifests = ManifestSettings.from_data(host.data)
    device_plugin.manifests_applied(name="Apply the device plugin's objects", documents=documents(render(manifests)),
                                    settings=settings, _run_once=True)
    device_plugin.rolled_out(name="Wait for the device-plugin rollout", namespace=manifests.namespace,
                             settings=settings, _run_once=True)
    if not gpu_present(host) or not desired_labels():
        return
    gpus = len(host.get_fact(DriverState)["nvidia_smi"]["gpus"])
    device_plugin.allocatable_matches(name="Check the node's allocatable GPUs", node_name=node_name(settings),
                                      expected=gpus, namespace=manifests.namespace, settings=settings)
