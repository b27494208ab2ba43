"""One host's inventory data parsed once into typed settings, kept on the host for the rest of the run.

The edge (a deploy's step, verify's and doctor's targets, the preflight, migrate) calls :func:`settings_of` on
the host it holds; everything below takes the parsed object it is handed, so no floor re-reads ``host.data``.
A value that does not parse raises the schema's error (its key and what is allowed) at the first call and at
every later one: a bad host stays bad, and only that host.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpunode.cluster.client import ClusterSettings
from gpunode.cluster.labels import LabelSettings
from gpunode.cluster.manifests import ManifestSettings
from gpunode.errors import GpunodeError
from gpunode.image.push import Registry
from gpunode.inventory_data import read
from gpunode.settings import NodeSettings

ATTRIBUTE = "gpunode_settings"  # the attribute of the host object (pyinfra's Host, verify's Target) that holds it


@dataclass(frozen=True)
class HostSettings:
    """Everything gpunode reads from one host's inventory data, by the part of the chain that uses it."""

    node: NodeSettings
    cluster: ClusterSettings
    labels: LabelSettings
    manifests: ManifestSettings
    registry: Registry  # how gpunode itself reaches the plugin image's registry (CA folder, pull user)
    max_unavailable: int

    @classmethod
    def from_data(cls, data: Any) -> HostSettings:
        """Parse pyinfra host data (a mapping or HostData), each value checked by its schema."""
        cert_dir = read(data, "plugin_registry_cert_dir")
        registry = Registry(Path(cert_dir).expanduser() if cert_dir else None,
                            read(data, "plugin_registry_username") or None,
                            read(data, "plugin_registry_password") or None)
        parsed = cls(NodeSettings.from_data(data), ClusterSettings.from_data(data), LabelSettings.from_data(data),
                     ManifestSettings.from_data(data), registry, read(data, "max_unavailable"))
        dra_needs(parsed)
        return parsed


def dra_needs(parsed: HostSettings) -> None:
    """A node on gpunode's DRA driver needs CDI in its runtime (the driver hands claims over as CDI specs) and the
    toolkit taking devices from volume mounts (the form those specs use): refused up front, not as failing pods."""
    if parsed.labels.allocation != "dra":
        return
    missing = [f"{key} = {wanted}" for key, wanted, have in (
        ("cdi_enabled", "True", parsed.node.cdi_enabled),
        ("plugin_device_list_strategy", '"volume-mounts"', parsed.node.plugin_device_list_strategy == "volume-mounts"))
        if not have]
    if missing:
        raise GpunodeError(f"gpu_allocation = dra needs {' and '.join(missing)}",
                           "set them for this host too (the DRA driver's CDI specs hand GPUs to NVIDIA's hook as "
                           "volume mounts, which the runtime must read from CDI), or leave gpu_allocation at "
                           "device-plugin")


def parsed_hosts(holders: Any) -> Iterator[tuple[Any, HostSettings]]:
    """Each host object with its settings, leaving out a host whose data is bad (its own steps fail it with why)."""
    for each in holders:
        try:
            yield each, settings_of(each)
        except GpunodeError:
            continue


def uses_dra(holders: Any) -> bool:
    """True when some host has gpu_allocation = dra: the DRA driver's objects are then rendered and applied too."""
    return any(parsed.labels.allocation == "dra" for _, parsed in parsed_hosts(holders))


def settings_of(holder: Any) -> HostSettings:
    """The settings of a host object with a ``data`` attribute, parsed on first use and kept on it."""
    found = getattr(holder, ATTRIBUTE, None)
    if found is None:
        found = HostSettings.from_data(holder.data)
        setattr(holder, ATTRIBUTE, found)
    return found
