"""gpunode's DRA driver (``gpunode-dra-driver``): this node's GPUs through Dynamic Resource Allocation.

It registers with the kubelet through the plugin-registration API (a socket in the kubelet's
``plugins_registry`` folder: type ``DRAPlugin``, name ``gpu.gpunode.io``, service ``v1.DRAPlugin``), serves
``NodePrepareResources`` / ``NodeUnprepareResources`` of the kubelet's ``dra/v1`` API on its own socket
(``gpunode_plugin.dra_claims``), and publishes the node's GPUs as its ResourceSlice
(``gpunode_plugin.dra_devices``): at start, and again when a health event (an Xid, a double-bit ECC error,
from the same NVML event loop as the device plugin's) takes a GPU out. It uses the same backends as the device
plugin (NVML in production).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from concurrent import futures

import grpc

from gpunode_plugin import __version__
from gpunode_plugin.api import dra_pb2, dra_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from gpunode_plugin.backend import Backend, InitError
from gpunode_plugin.config import Config
from gpunode_plugin.dra_claims import ClaimPreparer, ClaimRef, PrepareError
from gpunode_plugin.dra_devices import DRIVER, resource_slice
from gpunode_plugin.health import health_policy
from gpunode_plugin.kube import ApiError, InClusterApi
from gpunode_plugin.manager import make_backend

log = logging.getLogger("gpunode_plugin.dra")
SERVICE = "v1.DRAPlugin"  # the kubelet's dra/v1 service, as a DRA plugin lists it when it registers
PLUGIN_TYPE = "DRAPlugin"
EVENT_WAIT_MS = 1000


class Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks of a socket in plugins_registry."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.error = ""

    def GetInfo(self, request: pluginregistration_pb2.InfoRequest,  # noqa: N802 - gRPC method name
                context: grpc.ServicerContext) -> pluginregistration_pb2.PluginInfo:
        return pluginregistration_pb2.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=self.endpoint,
                                                 supported_versions=[SERVICE])

    def NotifyRegistrationStatus(self, request: pluginregistration_pb2.RegistrationStatus,  # noqa: N802
                                 context: grpc.ServicerContext) -> pluginregistration_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("registered with the kubelet as %s (%s)", DRIVER, SERVICE)
            self.error = ""
            self.registered.set()
        else:
            log.error("the kubelet refused the registration: %s", request.error)
            self.error = request.error
        return pluginregistration_pb2.RegistrationStatusResponse()


class DraService(dra_pb2_grpc.DRAPluginServicer):
    """NodePrepareResources and NodeUnprepareResources: each claim answered on its own, its error in words."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self.preparer = preparer

    def NodePrepareResources(self, request: dra_pb2.NodePrepareResourcesRequest,  # noqa: N802
                             context: grpc.ServicerContext) -> dra_pb2.NodePrepareResourcesResponse:
        response = dra_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.uid, claim.name)
            answer = response.claims[claim.uid]
            try:
                prepared = self.preparer.prepare(ref)
            except (PrepareError, ApiError, OSError) as error:
                log.error("prepare %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, error)
                answer.error = f"{DRIVER}: {error}"
                continue
            for device in prepared:
                answer.devices.add(request_names=list(device.request_names), pool_name=device.pool_name,
                                   device_name=device.device_name, cdi_device_ids=list(device.cdi_device_ids))
            log.info("prepared %s/%s (%s): %s", ref.namespace, ref.name, ref.uid,
                     ", ".join(d.device_name for d in prepared))
        return response

    def NodeUnprepareResources(self, request: dra_pb2.NodeUnprepareResourcesRequest,  # noqa: N802
                               context: grpc.ServicerContext) -> dra_pb2.NodeUnprepareResourcesResponse:
        response = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.uid, claim.name)
            answer = response.claims[claim.uid]
            try:
                self.preparer.unprepare(ref)
                log.info("unprepared %s/%s (%s)", ref.namespace, ref.name, ref.uid)
            except (PrepareError, OSError) as error:
                answer.error = f"{DRIVER}: {error}"
        return response


class SlicePublisher:
    """The node's ResourceSlice, applied whenever the healthy devices change (the pool's generation moves)."""

    def __init__(self, node: str, backend: Backend, api: InClusterApi) -> None:
        self.node = node
        self.backend = backend
        self.api = api
        self.unhealthy: set[str] = set()
        self.generation = 0
        self.lock = threading.Lock()
        self.published: dict[str, str] = {}  # device name -> UUID, as last published

    def uuids(self) -> dict[str, str]:
        with self.lock:
            return dict(self.published)

    def publish(self) -> None:
        with self.lock:
            gpus = self.backend.gpus()
            self.generation += 1
            body = resource_slice(self.node, gpus, self.generation, self.unhealthy)
            self.api.apply_slice(body, DRIVER)
            self.published = {d["name"]: d["attributes"]["uuid"]["string"] for d in body["spec"]["devices"]}
            log.info("ResourceSlice %s: %d device(s), generation %d", body["metadata"]["name"],
                     len(self.published), self.generation)

    def mark_unhealthy(self, uuids: set[str]) -> bool:
        with self.lock:
            fresh = uuids - self.unhealthy
            self.unhealthy |= fresh
        return bool(fresh)


def watch_health(backend: Backend, publisher: SlicePublisher, stop: threading.Event, ignored: set[int]) -> None:
    """Take a GPU out of the slice on a critical event (all GPUs when the event names none); application Xids
    (NVIDIA's list, and DP_DISABLE_HEALTHCHECKS / DP_ENABLE_HEALTHCHECKS as for the device plugin) are not."""
    while not stop.is_set():
        try:
            event = backend.wait_event(EVENT_WAIT_MS)
        except Exception as error:  # noqa: BLE001 - a broken event wait is reported and retried, never fatal
            log.error("health events: %s", error)
            stop.wait(1)
            continue
        if event is None or (event.kind == "xid" and event.xid in ignored):
            continue
        gpus = backend.gpus()
        hit = {event.uuid} if event.uuid else {g.uuid for g in gpus}
        if publisher.mark_unhealthy(hit):
            log.warning("%s unhealthy (%s%s): leaves the ResourceSlice", ", ".join(sorted(hit)), event.kind,
                        f" {event.xid}" if event.xid is not None else "")
            try:
                publisher.publish()
            except ApiError as error:
                log.error("cannot update the ResourceSlice: %s", error)


def serve(servicer_adder: object, servicer: object, socket: str) -> grpc.Server:
    os.makedirs(os.path.dirname(socket), exist_ok=True)
    if os.path.exists(socket):
        os.remove(socket)  # ours from before a restart
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer_adder(servicer, server)  # type: ignore[operator]
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    return server


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpunode-dra-driver", description=__doc__.split("\n")[0])
    parser.add_argument("--node", default=os.environ.get("NODE_NAME", ""), help="this node's Node name "
                        "(env NODE_NAME, from the downward API)")
    parser.add_argument("--kubelet-dir", default="/var/lib/kubelet", help="the kubelet's root folder")
    parser.add_argument("--cdi-dir", default="/var/run/cdi", help="where the claims' CDI specs go")
    parser.add_argument("--backend", default=os.environ.get("GPUNODE_PLUGIN_BACKEND", "nvml"),
                        choices=("nvml", "sim"))
    parser.add_argument("--driver-root", default=os.environ.get("NVIDIA_DRIVER_ROOT", "/"))
    parser.add_argument("--version", action="version", version=f"gpunode-dra-driver {__version__}")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.node:
        print("gpunode-dra-driver: no node name: set NODE_NAME from the downward API (spec.nodeName) or --node",
              file=sys.stderr)
        return 2
    backend = make_backend(Config(backend=args.backend, driver_root=args.driver_root))  # the device plugin's
    try:
        backend.start()
        api = InClusterApi()
    except (InitError, ApiError) as error:
        hint = getattr(error, "hint", "")
        print(f"gpunode-dra-driver: cannot start: {error}" + (f" ({hint})" if hint else ""), file=sys.stderr)
        return 1
    publisher = SlicePublisher(args.node, backend, api)
    try:
        publisher.publish()
    except ApiError as error:
        print(f"gpunode-dra-driver: cannot publish the ResourceSlice: {error} (the driver's ServiceAccount needs "
              "patch and create on resourceslices)", file=sys.stderr)
        return 1
    state = os.path.join(args.kubelet_dir, "plugins", DRIVER)
    endpoint = os.path.join(state, "dra.sock")
    preparer = ClaimPreparer(args.node, state, args.cdi_dir, api.read_claim, publisher.uuids)
    dra_server = serve(dra_pb2_grpc.add_DRAPluginServicer_to_server, DraService(preparer), endpoint)
    registration = Registration(endpoint)
    registry_socket = os.path.join(args.kubelet_dir, "plugins_registry", f"{DRIVER}-reg.sock")
    registry_server = serve(pluginregistration_pb2_grpc.add_RegistrationServicer_to_server, registration,
                            registry_socket)
    log.info("serving %s on %s, registration on %s; %d claim(s) prepared before", SERVICE, endpoint,
             registry_socket, len(preparer.prepared()))
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    enabled, ignored = health_policy(dict(os.environ))
    if enabled:
        threading.Thread(target=watch_health, args=(backend, publisher, stop, ignored), daemon=True).start()
    stop.wait()
    registry_server.stop(0)  # the kubelet sees the registration socket go: the driver is gone
    dra_server.stop(2)
    for socket in (registry_socket, endpoint):
        try:
            os.remove(socket)
        except FileNotFoundError:
            pass
    backend.stop()
    log.info("stopped; claims stay prepared (checkpoint in %s)", state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
