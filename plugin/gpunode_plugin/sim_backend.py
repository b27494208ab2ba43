"""GPUs of a simulated gpunode node, from its GPU state file, with injectable health events.

Health events are lines appended to an events file (``<uuid> <xid>`` or
``all error <text>``), which is how tests and the simulated fleet play Xid 79.
"""

from __future__ import annotations

import json
import os
import time

from gpunode_plugin.backend import Gpu, HealthEvent, InitError, MigDevice, sysfs_numa_node

DEFAULT_STATE = "/etc/gpunode-sim/gpu.json"
DEFAULT_EVENTS = "/run/gpunode-sim/health-events"
EVENT_POLL_SECONDS = 0.2  # the stand-in for NVML's blocking event wait looks at the events file this often


class SimBackend:
    name = "sim"

    def __init__(self, state_file: str = DEFAULT_STATE, events_file: str = DEFAULT_EVENTS) -> None:
        self.state_file = state_file
        self.events_file = events_file
        self._offset = 0

    def _state(self) -> dict:
        try:
            with open(self.state_file) as handle:
                return json.load(handle)
        except FileNotFoundError as error:
            raise InitError(f"NVML: libnvidia-ml.so.1 not found (no GPU state at {self.state_file})",
                            "this node has no NVIDIA driver: if it is not a GPU node, give the DaemonSet a "
                            "nodeSelector or toleration so it does not run here") from error

    def start(self) -> None:
        state = self._state()
        if not state.get("installed", True):
            raise InitError("NVML: Library Not Found", "the NVIDIA driver is not installed on this node; if it is "
                            "not a GPU node, give the DaemonSet a nodeSelector so the plugin does not run here")
        if not state["loaded"]:
            raise InitError("NVML: Driver Not Loaded", "load the NVIDIA kernel module (modprobe nvidia); "
                            "nvidia-smi on the node shows the same failure")
        if state["module_version"] != state["driver_version"]:
            raise InitError("NVML: RM has detected an NVML/RM version mismatch",
                            "the driver was upgraded without a reboot: drain and reboot the node")
        if os.path.exists(self.events_file):
            self._offset = os.path.getsize(self.events_file)

    def gpus(self) -> list[Gpu]:
        state = self._state()
        result = []
        for gpu in state["gpus"] if not state.get("no_devices") else []:
            mig = tuple(MigDevice(**m) for m in gpu.get("mig_devices", []))
            result.append(Gpu(index=gpu["index"], uuid=gpu["uuid"], name=gpu["name"],
                              memory_mib=gpu["memory_total_mib"], minor=gpu["minor"], pci_bus_id=gpu["pci_bus_id"],
                              numa_node=gpu.get("numa_node", sysfs_numa_node(gpu["pci_bus_id"])),
                              mig_enabled=gpu.get("mig_mode") == "Enabled", mig_devices=mig,
                              nvlink_peers=tuple(gpu.get("nvlink_peers", [])),
                              compute_capability=str(gpu.get("compute_cap", "")),
                              driver_version=str(state.get("driver_version", "")),
                              cuda_version=str(state.get("cuda_version", ""))))
        return result

    def wait_event(self, timeout_ms: int) -> HealthEvent | None:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            event = self._next_event()
            if event or time.monotonic() >= deadline:
                return event
            time.sleep(min(EVENT_POLL_SECONDS, max(0.0, deadline - time.monotonic())))

    def _next_event(self) -> HealthEvent | None:
        try:
            if os.stat(self.events_file).st_size <= self._offset:  # nothing new: a stat, not an open, per tick
                return None
            with open(self.events_file) as handle:
                handle.seek(self._offset)
                line = handle.readline()
        except FileNotFoundError:
            return None
        if not line.endswith("\n"):
            return None
        self._offset += len(line.encode())
        words = line.split()
        if not words:
            return None
        if words[0] == "all":
            return HealthEvent(None, None, "error", " ".join(words[2:]) or "event wait failed")
        if len(words) >= 2 and words[1] == "ecc":
            return HealthEvent(words[0], None, "ecc-double-bit")
        return HealthEvent(words[0], int(words[1]) if len(words) > 1 and words[1].isdigit() else None, "xid")

    def stop(self) -> None:
        return None
