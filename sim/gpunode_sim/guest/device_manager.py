"""A kubelet stand-in for the device-plugin API, for tests and the simulated fleet.

It behaves as the kubelet does towards device plugins (shared reference on the
v1beta1 API): a Registration server on ``kubelet.sock`` that checks the
version and the resource name, refuses a resource a live plugin holds, dials
the plugin back and calls GetDevicePluginOptions inside Register, consumes
ListAndWatch (each message replaces the device list; a lost stream makes the
devices unhealthy at once), calls Allocate and GetPreferredAllocation, and
"restarts" by deleting every socket in its directory and creating kubelet.sock
anew. It reports capacity and allocatable per resource.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from gpunode_plugin.api import HEALTHY, KUBELET_SOCKET, VERSION, pb, rpc

SUPPORTED_VERSIONS = [VERSION]
QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/"
                            r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")


def is_extended_resource_name(name: str) -> bool:
    """An extended resource: ``<domain>/<name>`` outside kubernetes.io (and not a ``requests.`` quota name)."""
    match = QUALIFIED_NAME.match(name)
    if not match or name.startswith("requests."):
        return False
    domain = match.group(1)
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


@dataclass
class PluginEndpoint:
    """A registered plugin as the kubelet sees it."""

    resource: str
    endpoint: str
    channel: grpc.Channel
    stub: rpc.DevicePluginStub
    options: pb.DevicePluginOptions
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    topology: dict[str, list[int]] = field(default_factory=dict)
    connected: bool = True
    updates: int = 0
    lost_at: float | None = None


class KubeletStandin(rpc.RegistrationServicer):
    """Registration server plus the plugin clients the kubelet keeps."""

    def __init__(self, socket_dir: str, dial_timeout: float = 10.0) -> None:
        self.socket_dir = socket_dir
        self.socket_path = os.path.join(socket_dir, KUBELET_SOCKET)
        self.dial_timeout = dial_timeout
        self.plugins: dict[str, PluginEndpoint] = {}
        self.registrations: list[tuple[float, str]] = []
        self.register_seconds: list[float] = []  # how long each accepted Register took (dial-back included)
        self.errors: list[str] = []
        self._lock = threading.Condition()
        self._server: grpc.Server | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        os.makedirs(self.socket_dir, exist_ok=True)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet"))
        rpc.add_RegistrationServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.2).wait(2)
            self._server = None
        with self._lock:
            for plugin in self.plugins.values():
                plugin.channel.close()
                plugin.connected = False
            self._lock.notify_all()

    def restart(self) -> None:
        """As a kubelet restart looks to plugins: every socket in the directory deleted, kubelet.sock anew."""
        self.stop()
        for name in os.listdir(self.socket_dir):
            path = os.path.join(self.socket_dir, name)
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)
        with self._lock:
            self.plugins.clear()
        self.start()

    # -- Registration service -----------------------------------------------------------------------------------

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:  # noqa: N802
        started = time.monotonic()
        if request.version not in SUPPORTED_VERSIONS:
            self._refuse(context, f'requested API version "{request.version}" is not supported by kubelet. '
                                  f'Supported versions are ["{VERSION}"]')
        if not is_extended_resource_name(request.resource_name):
            self._refuse(context, f'the ResourceName "{request.resource_name}" is invalid')
        with self._lock:
            current = self.plugins.get(request.resource_name)
            if current and current.connected and current.endpoint != request.endpoint:
                self._refuse(context, f'the ResourceName "{request.resource_name}" is already registered by the '
                                      f'live device plugin at {current.endpoint}')
        channel = grpc.insecure_channel(f"unix://{os.path.join(self.socket_dir, request.endpoint)}")
        stub = rpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(pb.Empty(), timeout=self.dial_timeout, wait_for_ready=True)
        except grpc.RpcError as error:
            channel.close()
            self._refuse(context, f"failed to dial device plugin: {error.details() or error.code()}")
        plugin = PluginEndpoint(request.resource_name, request.endpoint, channel, stub, options)
        with self._lock:
            old = self.plugins.get(request.resource_name)
            if old:
                old.connected = False
                old.channel.close()
            self.plugins[request.resource_name] = plugin
            self.registrations.append((time.monotonic(), request.resource_name))
            self.register_seconds.append(time.monotonic() - started)
            self._lock.notify_all()
        threading.Thread(target=self._watch, args=(plugin,), name=f"lw-{request.resource_name}",
                         daemon=True).start()
        return pb.Empty()

    def _refuse(self, context: grpc.ServicerContext, message: str) -> None:
        self.errors.append(message)
        context.abort(grpc.StatusCode.UNKNOWN, message)

    def _watch(self, plugin: PluginEndpoint) -> None:
        try:
            for response in plugin.stub.ListAndWatch(pb.Empty()):
                with self._lock:
                    plugin.devices = {d.ID: d.health for d in response.devices}
                    plugin.topology = {d.ID: [n.ID for n in d.topology.nodes] for d in response.devices}
                    plugin.updates += 1
                    self._lock.notify_all()
        except grpc.RpcError:
            pass
        with self._lock:
            plugin.connected = False
            plugin.lost_at = time.monotonic()
            self._lock.notify_all()

    # -- what the kubelet does with plugins ----------------------------------------------------------------------

    def capacity(self, resource: str) -> int:
        with self._lock:
            plugin = self.plugins.get(resource)
            return len(plugin.devices) if plugin else 0

    def allocatable(self, resource: str) -> int:
        with self._lock:
            plugin = self.plugins.get(resource)
            if plugin is None or not plugin.connected:
                return 0
            return sum(1 for health in plugin.devices.values() if health == HEALTHY)

    def report(self) -> dict[str, dict[str, int]]:
        with self._lock:
            names = list(self.plugins)
        return {name: {"capacity": self.capacity(name), "allocatable": self.allocatable(name)} for name in names}

    def allocate(self, resource: str, *containers: list[str]) -> pb.AllocateResponse:
        plugin = self.plugins[resource]
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)
                                                         for ids in containers])
        return plugin.stub.Allocate(request, timeout=10)

    def preferred(self, resource: str, available: list[str], must: list[str], size: int) -> list[str]:
        plugin = self.plugins[resource]
        request = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size)])
        return list(plugin.stub.GetPreferredAllocation(request, timeout=10).container_responses[0].deviceIDs)

    def wait_for(self, predicate: object, timeout: float = 10.0) -> bool:
        """Wait until ``predicate(self)`` holds (re-checked on every plugin event)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate(self):  # type: ignore[operator]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.05))
        return True
