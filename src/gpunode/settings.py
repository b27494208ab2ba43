"""Inventory data gpunode reads, with its defaults, validated once per host.

Every knob of the deploy is plain pyinfra host/group data, so an inventory (or
``group_data/*.py``) is the whole configuration. A bad value stops that host
with the key's name and what would be accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gpunode.errors import GpunodeError

NVIDIA_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
NVIDIA_REPOSITORY_URL = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
NVIDIA_RPM_REPOSITORY_URL = "https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch"
NVIDIA_KEY_FINGERPRINT = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
KEYRING_PATH = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
LIST_PATH = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
# the rpm family (RHEL, Rocky, Alma, Fedora): dnf's repository file, the key it checks with, the locks it keeps
REPO_ID = "nvidia-container-toolkit"
REPO_FILE_PATH = f"/etc/yum.repos.d/{REPO_ID}.repo"
RPM_KEY_PATH = "/etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-container-toolkit"
VERSIONLOCK_LIST = "/etc/dnf/plugins/versionlock.list"
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                    "libnvidia-container-tools", "libnvidia-container1")
RUNTIMES = ("auto", "containerd", "docker")


@dataclass(frozen=True)
class NodeSettings:
    """What one host should look like; each field is the inventory data key of the same name."""

    driver_min_version: str = "535"
    gpu_required: bool = False
    toolkit_repository_url: str = NVIDIA_REPOSITORY_URL
    toolkit_rpm_repository_url: str = NVIDIA_RPM_REPOSITORY_URL
    toolkit_key_url: str = NVIDIA_KEY_URL
    toolkit_key_fingerprint: str = NVIDIA_KEY_FINGERPRINT
    toolkit_version: str = "1.17.8-1"
    toolkit_hold: bool = True
    container_runtime: str = "auto"
    nvidia_runtime_default: bool = False
    cdi_enabled: bool = False
    containerd_systemd_cgroup: bool = True
    runtime_restart_timeout: int = 60
    reboot_on_mismatch: bool = False
    reboot_timeout: int = 300

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | Any) -> NodeSettings:
        """Settings from pyinfra host data (a mapping or pyinfra's HostData)."""
        values: dict[str, Any] = {}
        for field in fields(cls):
            value = data.get(field.name) if hasattr(data, "get") else getattr(data, field.name, None)
            if value is None:
                continue
            values[field.name] = _coerce(field.name, value, field.default)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if not re.fullmatch(r"\d+(\.\d+){0,2}", self.driver_min_version):
            raise GpunodeError(f"driver_min_version {self.driver_min_version!r} is not a driver version",
                               "write it like 535 or 550.54.15")
        if not re.fullmatch(r"[0-9A-F]{40}", self.toolkit_key_fingerprint):
            raise GpunodeError(f"toolkit_key_fingerprint {self.toolkit_key_fingerprint!r} is not a 40-hex-digit "
                               "fingerprint", f"NVIDIA's is {NVIDIA_KEY_FINGERPRINT} (upper case, no spaces)")
        if not re.fullmatch(r"\d+\.\d+\.\d+-\d+", self.toolkit_version):
            raise GpunodeError(f"toolkit_version {self.toolkit_version!r} is not a package version",
                               "write the full version, e.g. 1.17.8-1 (Debian's version, rpm's version-release)")
        if self.container_runtime not in RUNTIMES:
            raise GpunodeError(f"container_runtime {self.container_runtime!r} is not supported",
                               f"use one of: {', '.join(RUNTIMES)}")
        for key in ("toolkit_repository_url", "toolkit_rpm_repository_url", "toolkit_key_url"):
            if not re.match(r"^(https?|file)://\S+$", getattr(self, key)):
                raise GpunodeError(f"{key} {getattr(self, key)!r} is not a URL", "use http://, https:// or file://")
        if self.runtime_restart_timeout < 5:
            raise GpunodeError("runtime_restart_timeout must be at least 5 seconds")
        if self.reboot_timeout < 30:
            raise GpunodeError("reboot_timeout must be at least 30 seconds")


def _coerce(key: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "yes", "1"):
            return True
        if str(value).lower() in ("false", "no", "0"):
            return False
        raise GpunodeError(f"{key} must be true or false, got {value!r}")
    if isinstance(default, int):
        try:
            return int(value)
        except (TypeError, ValueError) as error:
            raise GpunodeError(f"{key} must be a whole number, got {value!r}") from error
    return str(value)


def version_key(version: str) -> tuple[int, ...]:
    """A comparable form of a driver version (``550.54.15`` > ``535``)."""
    return tuple(int(part) for part in re.findall(r"\d+", version))
