"""Inventory data gpunode reads, with its defaults, validated once per host.

Every knob of the deploy is plain pyinfra host/group data, so an inventory (or
``group_data/*.py``) is the whole configuration. Types, defaults and allowed
values come from the one schema, ``gpunode.inventory_data``: a bad value stops
that host with the key's name and what would be accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gpunode.inventory_data import BY_NAME, read

KEYRING_PATH = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
LIST_PATH = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
# the rpm family (RHEL, Rocky, Alma, Fedora): dnf's repository file, the key it checks with, the locks it keeps
REPO_ID = "nvidia-container-toolkit"
REPO_FILE_PATH = f"/etc/yum.repos.d/{REPO_ID}.repo"
RPM_KEY_PATH = "/etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-container-toolkit"
VERSIONLOCK_LIST = "/etc/dnf/plugins/versionlock.list"
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"  # the toolkit's own config (its runtime and hook read it)
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                    "libnvidia-container-tools", "libnvidia-container1")


@dataclass(frozen=True)
class NodeSettings:
    """What one host should look like; each field is the inventory data key of the same name."""

    driver_min_version: str = BY_NAME["driver_min_version"].default
    gpu_required: bool = BY_NAME["gpu_required"].default
    toolkit_repository_url: str = BY_NAME["toolkit_repository_url"].default
    toolkit_rpm_repository_url: str = BY_NAME["toolkit_rpm_repository_url"].default
    toolkit_key_url: str = BY_NAME["toolkit_key_url"].default
    toolkit_key_fingerprint: str = BY_NAME["toolkit_key_fingerprint"].default
    toolkit_version: str = BY_NAME["toolkit_version"].default
    toolkit_hold: bool = BY_NAME["toolkit_hold"].default
    container_runtime: str = BY_NAME["container_runtime"].default
    nvidia_runtime_default: bool = BY_NAME["nvidia_runtime_default"].default
    cdi_enabled: bool = BY_NAME["cdi_enabled"].default
    plugin_device_list_strategy: str = BY_NAME["plugin_device_list_strategy"].default
    containerd_systemd_cgroup: bool = BY_NAME["containerd_systemd_cgroup"].default
    runtime_restart_timeout: int = BY_NAME["runtime_restart_timeout"].default
    reboot_on_mismatch: bool = BY_NAME["reboot_on_mismatch"].default
    reboot_timeout: int = BY_NAME["reboot_timeout"].default

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | Any) -> NodeSettings:
        """Settings from pyinfra host data (a mapping or pyinfra's HostData), each value checked by its schema."""
        return cls(**{field.name: read(data, field.name) for field in fields(cls)})


def version_key(version: str) -> tuple[int, ...]:
    """A comparable form of a driver version (``550.54.15`` > ``535``)."""
    return tuple(int(part) for part in re.findall(r"\d+", version))
