"""The whole node: driver check, toolkit repository, toolkit, runtime configuration and restart,
then the cluster: node labels and the device plugin (unless ``cluster_steps = False``)."""

from __future__ import annotations

from pyinfra.api.deploy import deploy

from gpunode import chain


@deploy("Bootstrap GPU node")
def bootstrap() -> None:
    for step in chain.STEPS:
        chain.load(step.deploy)()
