"""The whole node: driver check, toolkit repository, toolkit, runtime configuration and restart,
then the cluster: node labels and the device plugin (unless ``cluster_steps = False``)."""

from __future__ import annotations

from pyinfra.api.deploy import deploy

from gpunode.steps.device_plugin import device_plugin_rollout
from gpunode.steps.driver import driver_check
from gpunode.steps.labels import node_labels
from gpunode.steps.runtime import runtime_configuration
from gpunode.steps.toolkit import toolkit_install
from gpunode.steps.toolkit_repo import toolkit_repository

STEPS = {
    "driver": driver_check,
    "toolkit_repo": toolkit_repository,
    "toolkit": toolkit_install,
    "runtime": runtime_configuration,
    "labels": node_labels,
    "device_plugin": device_plugin_rollout,
}


@deploy("Bootstrap GPU node")
def bootstrap() -> None:
    for step in STEPS.values():
        step()
