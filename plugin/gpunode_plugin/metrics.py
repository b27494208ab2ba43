"""Prometheus metrics in the text exposition format (no client library: a few counters and gauges)."""

from __future__ import annotations

import threading
from collections import defaultdict

HELP = {
    "gpunode_plugin_devices": ("gauge", "Devices advertised, by resource and health."),
    "gpunode_plugin_allocations_total": ("counter", "Allocate calls answered, by resource."),
    "gpunode_plugin_allocation_errors_total": ("counter", "Allocate calls refused, by resource."),
    "gpunode_plugin_preferred_allocations_total": ("counter", "GetPreferredAllocation calls answered, by resource."),
    "gpunode_plugin_registrations_total": ("counter", "Successful registrations with the kubelet, by resource."),
    "gpunode_plugin_reregistrations_total": ("counter", "Registrations after the first (kubelet restarts, lost "
                                                        "streams), by resource."),
    "gpunode_plugin_registration_errors_total": ("counter", "Failed registration attempts, by resource."),
    "gpunode_plugin_last_xid": ("gauge", "Last critical Xid seen per GPU."),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def inc(self, name: str, resource: str) -> None:
        with self._lock:
            self.counters[f"gpunode_plugin_{name}"][resource] += 1

    def render(self, resources: dict, last_xid: dict[str, int]) -> str:
        lines: list[str] = []

        def header(name: str) -> None:
            kind, text = HELP[name]
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")

        header("gpunode_plugin_devices")
        for name, resource in sorted(resources.items()):
            counts = {"Healthy": 0, "Unhealthy": 0}
            for device in resource.devices.values():
                counts[device.health] = counts.get(device.health, 0) + 1
            for health, count in sorted(counts.items()):
                lines.append(f'gpunode_plugin_devices{{resource="{_escape(name)}",health="{health}"}} {count}')
        with self._lock:
            snapshot = {k: dict(v) for k, v in self.counters.items()}
        for metric in ("gpunode_plugin_allocations_total", "gpunode_plugin_allocation_errors_total",
                       "gpunode_plugin_preferred_allocations_total",
                       "gpunode_plugin_registrations_total", "gpunode_plugin_reregistrations_total",
                       "gpunode_plugin_registration_errors_total"):
            header(metric)
            for resource in sorted(resources):
                value = snapshot.get(metric, {}).get(resource, 0)
                lines.append(f'{metric}{{resource="{_escape(resource)}"}} {value:g}')
        header("gpunode_plugin_last_xid")
        for uuid, xid in sorted(last_xid.items()):
            lines.append(f'gpunode_plugin_last_xid{{gpu="{_escape(uuid)}"}} {xid}')
        return "\n".join(lines) + "\n"
