"""From GPUs and configuration to Kubernetes resources and their device IDs.

MIG strategies and time-slicing follow NVIDIA's plugin: ``none`` exposes every
GPU as ``nvidia.com/gpu``; ``single`` exposes identical MIG devices as
``nvidia.com/gpu``; ``mixed`` adds ``nvidia.com/mig-<g>g.<gb>gb``; time-slicing
replicas give IDs ``<id>::<n>`` (renamed ``<name>.shared`` with renameByDefault).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gpunode_plugin.api import HEALTHY
from gpunode_plugin.backend import Gpu, MigDevice
from gpunode_plugin.config import Config, ConfigError

GPU_RESOURCE = "nvidia.com/gpu"


@dataclass
class LogicalDevice:
    """One device ID advertised to the kubelet."""

    id: str
    gpu: Gpu
    mig: MigDevice | None = None
    replica: int | None = None
    health: str = HEALTHY

    @property
    def physical_id(self) -> str:
        """The ID without its replica suffix (what NVIDIA_VISIBLE_DEVICES names)."""
        return self.id.split("::")[0]

    @property
    def uuid(self) -> str:
        return self.mig.uuid if self.mig else self.gpu.uuid


@dataclass
class Resource:
    """A resource name and its devices, with a version counter ListAndWatch waits on."""

    name: str
    devices: dict[str, LogicalDevice]
    shared: bool = False
    version: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    def set_health(self, predicate: object, health: str) -> list[str]:
        """Set ``health`` on devices matching ``predicate``; return the IDs that changed."""
        changed = []
        with self.changed:
            for device in self.devices.values():
                if predicate(device) and device.health != health:  # type: ignore[operator]
                    device.health = health
                    changed.append(device.id)
            if changed:
                self.version += 1
                self.changed.notify_all()
        return changed


def _id(config: Config, gpu: Gpu, mig: MigDevice | None) -> str:
    if config.device_id_strategy == "index":
        return mig.index if mig else str(gpu.index)
    return mig.uuid if mig else gpu.uuid


def build_resources(gpus: list[Gpu], config: Config) -> dict[str, Resource]:
    """Resources and devices for ``gpus`` under ``config``; raises ConfigError like NVIDIA's plugin refuses."""
    plain: dict[str, list[LogicalDevice]] = {}

    def add(name: str, gpu: Gpu, mig: MigDevice | None = None) -> None:
        plain.setdefault(name, []).append(LogicalDevice(_id(config, gpu, mig), gpu, mig))

    strategy = config.mig_strategy
    if strategy == "single":
        enabled = {gpu.mig_enabled for gpu in gpus}
        if len(enabled) > 1:
            raise ConfigError("mig-strategy single: all devices on the node must be configured with the same "
                              "migEnabled value")
        if gpus and not all(gpu.mig_devices for gpu in gpus if gpu.mig_enabled):
            raise ConfigError("mig-strategy single: every MIG-enabled GPU needs at least one MIG device")
        profiles = {mig.profile for gpu in gpus for mig in gpu.mig_devices}
        if len(profiles) > 1:
            raise ConfigError(f"mig-strategy single: more than one MIG device type present on node "
                              f"({', '.join(sorted(profiles))})")
    for gpu in gpus:
        if strategy == "none" or not gpu.mig_enabled:
            add(GPU_RESOURCE, gpu)
        else:
            for mig in gpu.mig_devices:
                add(GPU_RESOURCE if strategy == "single" else f"nvidia.com/mig-{mig.profile}", gpu, mig)
    resources: dict[str, Resource] = {}
    shared = {s.name: s for s in config.shared}
    for name, devices in plain.items():
        rule = shared.get(name)
        if rule is None:
            resources[name] = Resource(name, {d.id: d for d in devices})
            continue
        renamed = rule.rename or (f"{name}.shared" if config.rename_by_default else name)
        replicas = {}
        for device in devices:
            for replica in range(rule.replicas):
                logical = LogicalDevice(f"{device.id}::{replica}", device.gpu, device.mig, replica)
                replicas[logical.id] = logical
        resources[renamed] = Resource(renamed, replicas, shared=True)
    return resources


def socket_name(resource: str, prefix: str = "gpunode") -> str:
    """The plugin's socket file for ``resource``: ``gpunode-gpu.sock``, ``gpunode-mig-1g.5gb.sock``."""
    return f"{prefix}-{resource.split('/', 1)[-1]}.sock"
