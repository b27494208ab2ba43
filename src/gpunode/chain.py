"""The chain's steps, listed once: from the driver to a GPU a pod can get.

Everything that walks the chain reads this list: the bootstrap deploy, ``gpunode deploy``'s deploy file, the
node facts command, verify and doctor, ``gpunode init``'s deploy files. Each step's fact, operation, diagnosis
and suite share its name; where they live is written here as import paths (``module:attribute``), so this module
imports nothing and any layer may read it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Step:
    """One link of the chain."""

    name: str
    deploy: str  # the pyinfra @deploy function that provisions it
    fact: str | None = None  # the fact class whose output judges it (node steps); cluster steps read the API
    diagnose: str | None = None  # the function that judges that fact
    needs_nvidia: bool = False  # read only where an NVIDIA driver left a trace (a CPU node skips it)
    condition: str = ""  # the Node condition the node checker publishes for it (node-problem-detector's style)

    @property
    def on_node(self) -> bool:
        return self.fact is not None


STEPS: tuple[Step, ...] = (
    Step("driver", "gpunode.steps.driver:driver_check", "gpunode.facts.driver:DriverState",
         "gpunode.diagnosis.driver:diagnose", condition="GPUDriverReady"),
    Step("toolkit_repo", "gpunode.steps.toolkit_repo:toolkit_repository", "gpunode.facts.toolkit_repo:ToolkitRepoState",
         "gpunode.diagnosis.toolkit_repo:diagnose", needs_nvidia=True, condition="NvidiaToolkitRepositoryReady"),
    Step("toolkit", "gpunode.steps.toolkit:toolkit_install", "gpunode.facts.toolkit:ToolkitPackages",
         "gpunode.diagnosis.toolkit:diagnose", needs_nvidia=True, condition="NvidiaContainerToolkitReady"),
    Step("runtime", "gpunode.steps.runtime:runtime_configuration", "gpunode.facts.runtime:RuntimeConfig",
         "gpunode.diagnosis.runtime:diagnose", needs_nvidia=True, condition="NvidiaRuntimeReady"),
    Step("labels", "gpunode.steps.labels:node_labels", condition="GPUNodeLabelsReady"),
    Step("device_plugin", "gpunode.steps.device_plugin:device_plugin_rollout", condition="GPUDevicePluginReady"),
)
NAMES: tuple[str, ...] = tuple(step.name for step in STEPS)
NODE_STEPS: tuple[str, ...] = tuple(step.name for step in STEPS if step.on_node)
CLUSTER_STEPS: tuple[str, ...] = tuple(step.name for step in STEPS if not step.on_node)
BY_NAME: dict[str, Step] = {step.name: step for step in STEPS}


def load(path: str) -> Any:
    """The object an import path (``module:attribute``) names."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)
