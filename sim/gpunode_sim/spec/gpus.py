"""GPU models the simulated fleet knows, and the per-node driver state built from a profile.

Names, memory sizes and compute capabilities are those real ``nvidia-smi``
reports for each model (see the shared node facts); UUIDs and PCI bus ids are
derived from the node name so they stay stable across restarts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    """One GPU product as the driver reports it."""

    key: str
    product_name: str
    memory_mib: int
    compute_cap: str
    architecture: str
    power_limit_w: int
    mig_capable: bool
    pci_device_id: str
    bus_numbers: tuple[int, ...]


MODELS: dict[str, GpuModel] = {
    model.key: model
    for model in (
        GpuModel("a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", 40960, "8.0", "Ampere", 400, True,
                 "0x20B010DE", (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)),
        GpuModel("h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", 81559, "9.0", "Hopper", 700, True,
                 "0x233010DE", (0x19, 0x3B, 0x4C, 0x5D, 0x9B, 0xBB, 0xCB, 0xDB)),
        GpuModel("v100-sxm2-32gb", "Tesla V100-SXM2-32GB", 32768, "7.0", "Volta", 300, False,
                 "0x1DB510DE", (0x15, 0x16, 0x3A, 0x3B, 0x89, 0x8A, 0xB2, 0xB3)),
        GpuModel("t4", "Tesla T4", 15109, "7.5", "Turing", 70, False,
                 "0x1EB810DE", (0x3B, 0x5E, 0x86, 0xAF, 0xD8, 0xD9, 0xDA, 0xDB)),
        GpuModel("a40", "NVIDIA A40", 46068, "8.6", "Ampere", 300, False,
                 "0x223510DE", (0x17, 0x31, 0x4B, 0x65, 0xCA, 0xE3, 0xE4, 0xE5)),
    )
}

DEFAULT_DRIVER = "550.54.15"
FAULTS = {
    "driver-not-loaded": "the nvidia kernel module is not loaded: no /dev/nvidia*, nvidia-smi exits 9",
    "library-mismatch": "user-space driver newer than the loaded module (upgrade without reboot)",
    "fallen-off-bus": "GPU 0 has fallen off the bus (Xid 79): nvidia-smi exits 15",
    "nouveau": "nouveau is bound instead of nvidia: lsmod lists nouveau, no nvidia devices",
    "no-gpu": "the driver is loaded but no GPU initialised: 'No devices were found'",
    "fabricmanager-down": "NVSwitch node whose nvidia-fabricmanager is stopped: fabric state In Progress",
    "uvm-missing": "nvidia_uvm is not loaded: no /dev/nvidia-uvm (nvidia-smi works, CUDA cannot initialise)",
    "ecc-uncorrectable": "GPU 1 had an uncorrectable (double-bit) ECC error since the driver loaded; its memory "
                         "waits for a reset (a page pending retirement before Ampere, a row remap pending from "
                         "Ampere on)",
    "compute-prohibited": "GPU 0 is in compute mode Prohibited: no process can create a CUDA context on it",
    "compute-exclusive": "GPU 0 is in compute mode Exclusive_Process: one CUDA context at a time (fine alone, not "
                         "with time-slicing)",
    "mig-no-instances": "GPU 0 has MIG mode on and no MIG device (as after 'nvidia-smi -mig 1' and a reset, before "
                        "anyone created instances): CUDA sees no device on it",
    "reset-required": "GPU 1 requires a reset after an unrecoverable error (nvidia-smi reset_status.reset_required "
                      "Yes)",
    "mig-caps-missing": "GPU 0 has two MIG devices (1g.5gb) but /dev/nvidia-caps holds no capability node (as on a "
                        "host whose /dev was populated without the driver's tools): no container can be given one",
    "persistence-off": "GPU 1 runs with persistence mode Disabled (nvidia-persistenced not running)",
    "nvidiactl-0600": "/dev/nvidiactl is mode 0600 (as a udev rule or NVreg_DeviceFileMode leaves it): a container "
                      "that does not run as root gets NVML's 'Insufficient Permissions'",
}


# faults a running driver acquires (or loses) without a reboot, and the fields of a GPU's state they change: they
# can be injected live ('gpunode sim fault --live'), the others change what the node's /dev and /proc hold at boot
LIVE_FAULTS = ("ecc-uncorrectable", "compute-prohibited", "compute-exclusive", "reset-required", "persistence-off")
LIVE_FIELDS = ("ecc_uncorrected", "memory_pending", "compute_mode", "reset_required", "persistence_mode")


def gpu_uuid(node: str, index: int) -> str:
    """A stable, GPU-style UUID for GPU ``index`` of ``node``."""
    raw = uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.gpunode.sim")
    return f"GPU-{raw}"


def mig_devices(node: str, index: int, mig: object) -> list[dict]:
    """The MIG devices of GPU ``index``: ``mig: [1g.10gb, 3g.40gb]`` in the profile creates those instances
    (``mig: true`` turns MIG mode on with none, as a GPU looks before anyone created them)."""
    if not isinstance(mig, list):
        return []
    return [{"uuid": "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.mig{n}.gpunode.sim")),
             "profile": str(profile), "index": f"{index}:{n}", "gpu_instance": n + 1, "compute_instance": 0}
            for n, profile in enumerate(mig)]


def driver_state(node: str, profile: dict) -> dict:
    """The node's driver layer as the stand-ins read it (written to /etc/gpunode-sim/gpu.json)."""
    gpu = profile.get("gpu") or {}
    driver = profile.get("driver") or {}
    faults = list(profile.get("faults") or [])
    count = int(gpu.get("count", 0))
    model = MODELS[gpu["model"]] if count else None
    version = str(driver.get("version", DEFAULT_DRIVER))
    module_version = str(driver.get("module_version", version))
    if "library-mismatch" in faults and module_version == version:
        module_version = str(driver.get("previous_version") or ("525.147.05" if version.startswith("535.")
                                                                else "535.183.01"))
    gpus = []
    for index in range(count if model else 0):
        gpu_model = model
        bus = gpu_model.bus_numbers[index % len(gpu_model.bus_numbers)]
        mig = ["1g.5gb", "1g.5gb"] if index == 0 and "mig-caps-missing" in faults else gpu.get("mig")
        gpus.append({
            "index": index,
            "minor": index,
            "name": gpu_model.product_name,
            "uuid": gpu_uuid(node, index),
            "memory_total_mib": gpu_model.memory_mib,
            "compute_cap": gpu_model.compute_cap,
            "architecture": gpu_model.architecture,
            "power_limit_w": gpu_model.power_limit_w,
            "pci_bus_id": f"00000000:{bus:02X}:00.0",
            "pci_device_id": gpu_model.pci_device_id,
            "serial": f"{1560000000000 + uuid.uuid5(uuid.NAMESPACE_DNS, node).int % 10**9 + index:013d}",
            "mig_mode": "Enabled" if (mig or (index == 0 and "mig-no-instances" in faults))
                        and gpu_model.mig_capable else ("Disabled" if gpu_model.mig_capable else "N/A"),
            "fallen_off_bus": index == 0 and "fallen-off-bus" in faults,
            "mig_devices": mig_devices(node, index, mig) if gpu_model.mig_capable else [],
            "ecc_uncorrected": 2 if index == 1 and "ecc-uncorrectable" in faults else 0,
            # row remapping replaced page retirement with Ampere (the MIG-capable generation here)
            "remapping": gpu_model.mig_capable,
            "memory_pending": index == 1 and "ecc-uncorrectable" in faults,
            "compute_mode": "Prohibited" if index == 0 and "compute-prohibited" in faults else (
                "Exclusive_Process" if index == 0 and "compute-exclusive" in faults else "Default"),
            "reset_required": index == 1 and "reset-required" in faults,
            "persistence_mode": "Disabled" if index == 1 and "persistence-off" in faults else "Enabled",
        })
    nvswitch = profile.get("nvswitch") or {}
    switch_count = int(nvswitch.get("count", 0))
    fm_running = switch_count > 0 and "fabricmanager-down" not in faults
    return {
        "node": node,
        "driver_version": version,
        "module_version": module_version,
        "cuda_version": str(driver.get("cuda_version", "12.4")),
        "kernel_module": str(driver.get("kernel_module", "proprietary")),
        "loaded": count > 0 and not {"driver-not-loaded", "nouveau"} & set(faults),
        "installed": count > 0,
        "nouveau": "nouveau" in faults,
        "no_devices": "no-gpu" in faults,
        "uvm": "uvm-missing" not in faults,
        "ctl_mode": 0o600 if "nvidiactl-0600" in faults else 0o666,
        "mig_caps": "mig-caps-missing" not in faults,  # the capability nodes of the MIG devices are created
        "gpus": gpus,
        "nvswitch_count": switch_count,
        "fabricmanager": {
            "installed": switch_count > 0,
            "running": fm_running,
            "version": str(nvswitch.get("fabricmanager_version", version)),
        },
        "fabric": ({"state": "Completed", "status": "Success"} if fm_running
                   else {"state": "In Progress", "status": "N/A"}) if switch_count else None,
        "faults": faults,
    }
