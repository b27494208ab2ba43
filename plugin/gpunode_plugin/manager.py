"""The plugin's life: start the backend, serve each resource, register, and stay registered.

Registration done right: each resource's server serves its socket BEFORE it
calls Register (the kubelet dials back inside Register). A watcher re-registers
within a fraction of a second whenever ``kubelet.sock`` is created anew (a
kubelet restart, which also deletes our sockets, so they are served again
first), when our own socket disappears, and when a ListAndWatch stream is lost.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import grpc

from gpunode_plugin.backend import Backend, InitError
from gpunode_plugin.config import Config, ConfigError
from gpunode_plugin.health import HealthMonitor
from gpunode_plugin.metrics import Metrics
from gpunode_plugin.resources import Resource, build_resources, socket_name
from gpunode_plugin.server import PluginServer

log = logging.getLogger("gpunode_plugin")
WATCH_INTERVAL = 0.2  # a kubelet restart is seen within this; each tick is two stat calls
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL


class StartupError(Exception):
    """The plugin cannot run; the message says why and what to do."""


def make_backend(config: Config) -> Backend:
    if config.backend == "sim":
        from gpunode_plugin.sim_backend import SimBackend

        return SimBackend(config.sim_state_file, config.sim_events_file)
    from gpunode_plugin.nvml_backend import NvmlBackend

    return NvmlBackend(config.driver_root)


class PluginManager:
    def __init__(self, config: Config, environ: dict[str, str], backend: Backend | None = None) -> None:
        self.config = config
        self.environ = environ
        self.backend = backend or make_backend(config)
        self.metrics = Metrics()
        self.resources: dict[str, Resource] = {}
        self.servers: dict[str, PluginServer] = {}
        self.health: HealthMonitor | None = None
        self.idle_reason: str | None = None
        self.stop_event = threading.Event()
        self._lock = threading.RLock()
        self._kubelet_inode: int | None = None
        self._lost: set[str] = set()
        self.socket_dir = os.path.dirname(config.kubelet_socket)

    # -- start-up -------------------------------------------------------------------------------------------

    def check_socket_dir(self) -> None:
        if not os.path.isdir(self.socket_dir):
            raise StartupError(f"the device-plugin socket directory {self.socket_dir} does not exist: mount the "
                               "host's /var/lib/kubelet/device-plugins into the pod (hostPath)")
        if not os.access(self.socket_dir, os.W_OK | os.X_OK):
            raise StartupError(f"the device-plugin socket directory {self.socket_dir} is not writable by uid "
                               f"{os.getuid()}: run the plugin as root or give it write access there")

    def start(self) -> None:
        self.check_socket_dir()
        try:
            self.backend.start()
        except InitError as error:
            message = f"{error}. {error.hint}"
            if self.config.fail_on_init_error:
                raise StartupError(message) from error
            self.idle_reason = message
            log.error("%s; failOnInitError is false, so the plugin idles without devices", message)
            return
        try:
            self.resources = build_resources(self.backend.gpus(), self.config)
        except ConfigError as error:
            raise StartupError(str(error)) from error
        if not self.resources:
            self.idle_reason = "no GPUs found: nothing to advertise"
            log.warning(self.idle_reason)
            return
        for name in self.resources:
            path = os.path.join(self.socket_dir, socket_name(name, self.config.socket_prefix))
            if len(path.encode()) > MAX_SOCKET_PATH:
                raise StartupError(f"the socket path {path} is {len(path.encode())} bytes; unix sockets allow "
                                   f"{MAX_SOCKET_PATH}: use a shorter socket directory (--kubelet-socket)")
        for name, resource in self.resources.items():
            self.servers[name] = PluginServer(resource, self.socket_dir, socket_name(name, self.config.socket_prefix),
                                              self.config, self.metrics, self._stream_ended)
            self.servers[name].start()
            log.info("serving %s (%d devices) on %s", name, len(resource.devices), self.servers[name].path)
        self.health = HealthMonitor(self.backend, self.resources, self.environ, self.config.health_recovery_seconds)
        self.health.start()
        self._register_all(first=True)
        threading.Thread(target=self._watch, name="kubelet-watch", daemon=True).start()

    # -- registration ---------------------------------------------------------------------------------------

    def _kubelet_socket_inode(self) -> int | None:
        try:
            return os.stat(self.config.kubelet_socket).st_ino
        except FileNotFoundError:
            return None

    def _register(self, name: str) -> bool:
        server = self.servers[name]
        again = self.metrics.counters["gpunode_plugin_registrations_total"].get(name, 0) > 0
        try:
            server.register(self.config.kubelet_socket)
        except grpc.RpcError as error:
            self.metrics.inc("registration_errors_total", name)
            log.warning("registering %s with the kubelet failed: %s", name, error.details() or error.code())
            return False
        self.metrics.inc("registrations_total", name)
        if again:
            self.metrics.inc("reregistrations_total", name)
        log.info("registered %s with the kubelet", name)
        return True

    def _register_all(self, first: bool = False) -> None:
        with self._lock:
            self._kubelet_inode = self._kubelet_socket_inode()
            if self._kubelet_inode is None:
                if first:
                    log.warning("kubelet socket %s not there yet: will register when it appears",
                                self.config.kubelet_socket)
                return
            for name in self.servers:
                self._register(name)

    def _stream_ended(self, name: str) -> None:
        with self._lock:
            self._lost.add(name)

    def _watch(self) -> None:
        """Re-register on a new kubelet.sock, a lost socket of ours, or a lost ListAndWatch stream."""
        while not self.stop_event.wait(WATCH_INTERVAL):
            inode = self._kubelet_socket_inode()
            with self._lock:
                if inode is None:
                    self._kubelet_inode = None
                    continue
                renew = inode != self._kubelet_inode
                for name, server in self.servers.items():
                    if not server.socket_intact():
                        log.info("socket of %s is gone (kubelet restart?): serving it again", name)
                        server.stop()
                        server.start()
                        renew = True
                lost, self._lost = self._lost, set()
            if renew:
                log.info("kubelet socket created anew: re-registering")
                self._register_all()
            else:
                for name in lost:
                    time.sleep(0.1)
                    if self.servers[name].service.streams == 0 and not self.stop_event.is_set():
                        log.info("ListAndWatch stream of %s lost: re-registering", name)
                        with self._lock:
                            self._register(name)

    # -- state for probes and metrics -------------------------------------------------------------------------

    def health_status(self) -> tuple[bool, str]:
        if self.idle_reason:
            return True, f"idle: {self.idle_reason}"
        for name, server in self.servers.items():
            if not server.socket_intact():
                return False, f"socket of {name} is missing"
            if server.registered_at is None:
                return False, f"{name} is not registered with the kubelet"
        if self.health and self.health.enabled and not self.health._thread.is_alive() and not self.stop_event.is_set():
            return False, "the health-check thread stopped"
        return True, "ok"

    def ready_status(self) -> tuple[bool, str]:
        if self.idle_reason:
            return False, f"idle: {self.idle_reason}"
        missing = [n for n, s in self.servers.items() if s.registered_at is None or s.service.streams == 0]
        if missing:
            return False, f"not registered and watched by the kubelet: {', '.join(missing)}"
        return True, "ok"

    def metrics_text(self) -> str:
        return self.metrics.render(self.resources, self.health.last_xid if self.health else {})

    # -- shutdown -----------------------------------------------------------------------------------------------

    def stop(self) -> None:
        self.stop_event.set()
        if self.health:
            self.health.stop()
        for server in self.servers.values():
            server.stop()
        try:
            self.backend.stop()
        except Exception:  # noqa: BLE001 - shutting down anyway
            log.debug("backend stop failed", exc_info=True)
