"""What the plugin needs to know about GPUs, behind one small interface with two implementations.

``NvmlBackend`` talks to the driver through nvidia-ml-py; ``SimBackend`` reads a
simulated node's GPU profile, so the plugin on a simulated node sees the same
GPUs as that node's ``nvidia-smi``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# Xids NVIDIA's plugin treats as application errors, not GPU failures (internal/rm/health.go).
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class MigDevice:
    """One MIG device of a GPU."""

    uuid: str
    profile: str  # "1g.5gb", "3g.20gb", "1g.10gb.me" (NVIDIA's resource suffix)
    index: str  # "<gpu>:<mig>"
    gpu_instance: int
    compute_instance: int


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as the driver reports it."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    minor: int
    pci_bus_id: str
    numa_node: int | None = None
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    nvlink_peers: tuple[str, ...] = field(default=())  # UUIDs this GPU reaches over NVLink
    compute_capability: str = ""  # "8.0" ('' where the driver does not say)
    driver_version: str = ""  # the driver's, "550.54.15"
    cuda_version: str = ""  # the newest CUDA the driver supports, "12.4"


@dataclass(frozen=True)
class HealthEvent:
    """A health event from the driver: a critical Xid or an ECC error on a GPU (``uuid`` None: all GPUs)."""

    uuid: str | None
    xid: int | None
    kind: str  # "xid", "ecc-double-bit", "error"
    detail: str = ""


class InitError(Exception):
    """The backend cannot start; ``hint`` is the runbook line for the operator."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


class Backend(Protocol):
    name: str

    def start(self) -> None: ...

    def gpus(self) -> list[Gpu]: ...

    def wait_event(self, timeout_ms: int) -> HealthEvent | None: ...

    def stop(self) -> None: ...


def sysfs_numa_node(pci_bus_id: str, sysfs: str = "/sys/bus/pci/devices") -> int | None:
    """NUMA node of a PCI device from sysfs (``00000000:3B:00.0`` → ``0000:3b:00.0``); None if unknown."""
    address = pci_bus_id[-12:].lower()
    try:
        with open(f"{sysfs}/{address}/numa_node") as handle:
            value = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None
