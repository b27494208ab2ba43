"""Health: a thread waiting on the driver's events, marking the devices of a failing GPU unhealthy.

Follows NVIDIA's rules: Xids 13, 31, 43, 45, 68 and 109 are application errors
and ignored; ``DP_DISABLE_HEALTHCHECKS`` (``all``, ``xids`` or a list of Xids)
and ``DP_ENABLE_HEALTHCHECKS`` (a list that overrides) tune that; an event that
names no GPU, or a failing wait, marks every device unhealthy. Unlike NVIDIA's
plugin it marks EVERY logical device of the GPU (all replicas, all MIG devices)
and, when ``health_recovery_seconds`` > 0, re-advertises a GPU that stayed quiet
that long (NVIDIA's never recovers: a restart of the pod is needed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpunode_plugin.api import HEALTHY, UNHEALTHY
from gpunode_plugin.backend import IGNORED_XIDS, Backend, HealthEvent
from gpunode_plugin.resources import LogicalDevice, Resource

log = logging.getLogger("gpunode_plugin.health")
EVENT_WAIT_MS = 1000  # NVML blocks this long for an event; stop() waits for it


def _xids(text: str) -> set[int]:
    return {int(part) for part in text.replace(" ", "").split(",") if part.isdigit()}


def health_policy(environ: dict[str, str]) -> tuple[bool, set[int]]:
    """(enabled, ignored Xids) from NVIDIA's environment switches; malformed values are ignored."""
    disabled = environ.get("DP_DISABLE_HEALTHCHECKS", "").strip().lower()
    enabled_list = _xids(environ.get("DP_ENABLE_HEALTHCHECKS", ""))
    if disabled in ("all", "xids") and not enabled_list:
        return False, set()
    ignored = (set(IGNORED_XIDS) | _xids(disabled)) - enabled_list
    return True, ignored


class HealthMonitor:
    """Marks devices unhealthy on critical events, and healthy again after a quiet period if asked."""

    def __init__(self, backend: Backend, resources: dict[str, Resource], environ: dict[str, str],
                 recovery_seconds: int = 0, on_change: Callable[[str, str, str], None] | None = None) -> None:
        self.backend = backend
        self.resources = resources
        self.enabled, self.ignored = health_policy(environ)
        self.recovery_seconds = recovery_seconds
        self.on_change = on_change or (lambda *_: None)
        self.last_xid: dict[str, int] = {}
        self._failed_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health", daemon=True)

    def start(self) -> None:
        if not self.enabled:
            log.info("health checks disabled by DP_DISABLE_HEALTHCHECKS")
            return
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                event = self.backend.wait_event(EVENT_WAIT_MS)
            except Exception as error:  # noqa: BLE001 - a broken wait must not kill the thread silently
                event = HealthEvent(None, None, "error", str(error))
            if event is not None:
                self.handle(event)
            self._recover()
            if event is not None and event.kind == "error":
                self._stop.wait(1.0)

    def handle(self, event: HealthEvent) -> None:
        if event.kind == "xid" and event.xid is not None and event.xid in self.ignored:
            log.info("ignoring application Xid %s on %s", event.xid, event.uuid)
            return
        reason = (f"Xid {event.xid}" if event.kind == "xid" else
                  "double-bit ECC error" if event.kind == "ecc-double-bit" else f"health check failed: {event.detail}")
        if event.uuid and event.xid is not None:
            self.last_xid[event.uuid] = event.xid
        known = {d.gpu.uuid for r in self.resources.values() for d in r.devices.values()}
        known |= {d.mig.uuid for r in self.resources.values() for d in r.devices.values() if d.mig}
        target = event.uuid if event.uuid in known else None

        def matches(device: LogicalDevice) -> bool:
            return target is None or device.gpu.uuid == target or (device.mig is not None and device.mig.uuid == target)

        for resource in self.resources.values():
            for device_id in resource.set_health(matches, UNHEALTHY):
                log.warning("device %s of %s unhealthy: %s", device_id, resource.name, reason)
                self.on_change(resource.name, device_id, UNHEALTHY)
        for uuid in ({target} if target else known):
            self._failed_at[uuid] = time.monotonic()

    def _recover(self) -> None:
        if not self.recovery_seconds or not self._failed_at:
            return
        now = time.monotonic()
        for uuid, failed in list(self._failed_at.items()):
            if now - failed < self.recovery_seconds:
                continue
            del self._failed_at[uuid]
            for resource in self.resources.values():
                ids = resource.set_health(lambda d, u=uuid: d.gpu.uuid == u or (d.mig is not None and d.mig.uuid == u),
                                          HEALTHY)
                for device_id in ids:
                    log.info("device %s of %s healthy again after %s s without events", device_id, resource.name,
                             self.recovery_seconds)
                    self.on_change(resource.name, device_id, HEALTHY)
