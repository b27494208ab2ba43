"""One resource's device-plugin gRPC server on its unix socket, and its registration with the kubelet."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures

import grpc

from gpunode_plugin.allocation import AllocationError, container_response, preferred
from gpunode_plugin.api import VERSION, pb, rpc
from gpunode_plugin.config import Config
from gpunode_plugin.metrics import Metrics
from gpunode_plugin.resources import Resource

log = logging.getLogger("gpunode_plugin.server")
STREAM_CHECK_SECONDS = 5.0  # a ListAndWatch stream idles this long between checks; its end wakes it sooner


def device_message(device: object) -> pb.Device:
    message = pb.Device(ID=device.id, health=device.health)  # type: ignore[attr-defined]
    numa = device.gpu.numa_node  # type: ignore[attr-defined]
    if numa is not None:
        message.topology.nodes.add(ID=numa)
    return message


class DevicePluginService(rpc.DevicePluginServicer):
    """The DevicePlugin service for one resource."""

    def __init__(self, resource: Resource, config: Config, metrics: Metrics, stopping: threading.Event,
                 on_stream_end: Callable[[str], None]) -> None:
        self.resource = resource
        self.config = config
        self.metrics = metrics
        self.stopping = stopping
        self.on_stream_end = on_stream_end
        self.streams = 0

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext):  # noqa: N802 - gRPC method name
        resource = self.resource
        self.streams += 1

        def wake() -> None:  # the stream ended (kubelet gone, plugin stopping): leave the wait at once
            with resource.changed:
                resource.changed.notify_all()

        context.add_callback(wake)
        try:
            version = -1
            while context.is_active() and not self.stopping.is_set():
                with resource.changed:
                    if resource.version == version:
                        resource.changed.wait(timeout=STREAM_CHECK_SECONDS)
                    if resource.version == version:
                        continue
                    version = resource.version
                    devices = [device_message(d) for d in resource.devices.values()]
                yield pb.ListAndWatchResponse(devices=devices)
        finally:
            self.streams -= 1
            if not self.stopping.is_set():
                self.on_stream_end(resource.name)

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        response = pb.PreferredAllocationResponse()
        for container in request.container_requests:
            chosen = preferred(self.resource, list(container.available_deviceIDs),
                               list(container.must_include_deviceIDs), container.allocation_size,
                               self.config.shared_allocation_policy)
            response.container_responses.add(deviceIDs=chosen)
        self.metrics.inc("preferred_allocations_total", self.resource.name)
        return response

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        response = pb.AllocateResponse()
        try:
            for container in request.container_requests:
                response.container_responses.append(
                    container_response(self.resource, list(container.devices_ids), self.config))
        except AllocationError as error:
            self.metrics.inc("allocation_errors_total", self.resource.name)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        self.metrics.inc("allocations_total", self.resource.name)
        return response

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class PluginServer:
    """Serves one resource on ``<socket dir>/<socket name>``; never touches files it did not create."""

    def __init__(self, resource: Resource, socket_dir: str, socket_name: str, config: Config, metrics: Metrics,
                 on_stream_end: Callable[[str], None]) -> None:
        self.resource = resource
        self.path = os.path.join(socket_dir, socket_name)
        self.socket_name = socket_name
        self.stopping = threading.Event()
        self.service = DevicePluginService(resource, config, metrics, self.stopping, on_stream_end)
        self.server: grpc.Server | None = None
        self.registered_at: float | None = None
        self._inode: int | None = None

    def start(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)  # our own socket left by an earlier run of this plugin
        self.stopping.clear()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="dp"),
                                  options=[("grpc.so_reuseport", 0)])
        rpc.add_DevicePluginServicer_to_server(self.service, self.server)
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()
        self._inode = os.stat(self.path).st_ino

    def socket_intact(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self._inode
        except FileNotFoundError:
            return False

    def stop(self) -> None:
        self.stopping.set()
        with self.resource.changed:
            self.resource.changed.notify_all()
        if self.server is not None:
            self.server.stop(grace=0.5).wait(2)
            self.server = None
        if self.socket_intact():
            os.unlink(self.path)
        self.registered_at = None

    def register(self, kubelet_socket: str, timeout: float = 15) -> None:
        """Register with the kubelet (which dials back inside Register, so the server must already serve)."""
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            stub = rpc.RegistrationStub(channel)
            stub.Register(pb.RegisterRequest(
                version=VERSION, endpoint=self.socket_name, resource_name=self.resource.name,
                options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)),
                timeout=timeout)
        self.registered_at = time.time()
