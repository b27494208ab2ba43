"""The kubelet of a simulated node, towards the real Kubernetes API: runs inside the node.

It does what a kubelet does for the API server, with the node's identity
(``system:node:NAME``, so the Node authorizer and NodeRestriction apply): it
registers the Node (labels, addresses, nodeInfo, capacity), renews its Lease in
``kube-node-lease``, posts node conditions and the extended resources the device
plugins registered (capacity and allocatable), watches the pods bound to it,
runs them, reports their status (phase, conditions, container states, restart
counts, exit codes) and the kubelet's events, finishes the deletion of pods
that are terminating, and serves their logs on its port (10250) for
``kubectl logs``.

What it is not: the pods do not run through CRI. On a docker node the device
plugin's pod runs from the plugin's image built by ``gpunode sim build`` (loaded
into docker), with ``docker run`` and the runtime of the pod's RuntimeClass, the
DaemonSet's hostPath mounts, env and args, a read-only root and the node's
network; elsewhere (the light mode for large benches) as a process from the code
bound into the node. Either is restarted with a back-off like the kubelet's; a
workload pod gets its devices through the kubelet stand-in's Allocate and runs
once with the node's runtime (``gpunode_sim.guest.workload``).

    python -m gpunode_sim.guest.kubelet_agent      (config: /etc/gpunode-sim/kubelet.json)
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from lightkube import ApiError, Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ConfigMap, Node, Pod, Secret, ServiceAccount
from lightkube.resources.node_v1 import RuntimeClass
from lightkube.types import PatchType

from gpunode_sim.guest.device_manager import KubeletStandin
from gpunode_sim.guest.workload import DeviceAdmissionError, Outcome, admit, kill, launch

SOCKET_DIR = "/var/lib/kubelet/device-plugins"
UNMOUNTED_SOCKET_DIR = "/var/lib/gpunode-sim/not-mounted/device-plugins"  # never created
LOG_DIR = "/var/log/pods"
VOLUME_DIR = "/var/lib/gpunode-sim/pods"  # configMap volumes written out per pod, as the kubelet does
CONFIG = "/etc/gpunode-sim/kubelet.json"
KUBECONFIG = "/etc/kubernetes/kubelet.conf"
SERVING = ("/etc/kubernetes/pki/kubelet.crt", "/etc/kubernetes/pki/kubelet.key")
KUBELET_PORT = 10250
BACKOFF_START, BACKOFF_MAX = 2.0, 60.0  # the kubelet's are 10 s and 300 s; shorter so tests see a crash loop
SANDBOX_RETRY = 5.0
PULL_BACKOFF = (10.0, 300.0)  # the kubelet's image pull back-off: first delay, cap (doubling)
LEASE_SECONDS, LEASE_RENEW = 40, 10.0
STATUS_HEARTBEAT = 60.0
SYNC_BUSY, SYNC_IDLE = 0.5, 2.0  # seconds between sync passes while something starts or runs, and when idle
# the simulated driver layer: the plugin's simulated backend reads the node's GPU state file
SIM_ENV = {"GPUNODE_PLUGIN_BACKEND": "sim"}


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def say(message: str) -> None:
    print(f"{now()} {message}", file=sys.stderr, flush=True)


@dataclass
class Container:
    """The device plugin's container of a DaemonSet pod, as the agent runs it."""

    key: str
    spec: dict
    image: str | None = None  # docker's name of the loaded plugin image; None: run the bound code
    runtime: str = ""  # docker --runtime: the pod's RuntimeClass handler ('' for docker's default)
    volumes: list = field(default_factory=list)  # the pod's volumes (hostPath ones are mounted)
    written: dict[str, str] = field(default_factory=dict)  # configMap volume name -> its files' folder on the node
    process: subprocess.Popen | None = None
    restarts: int = 0
    last_exit: int | None = None
    next_start: float = 0.0
    started_at: float = 0.0
    started_stamp: str = ""
    ready: bool = False
    next_probe: float = 0.0  # monotonic time of the next readiness probe of a ready container
    log: str = ""

    def docker_name(self) -> str:
        return f"k8s_{self.spec['name']}_{self.key.replace('/', '_')}_{self.restarts}"

    def argv(self, env: dict[str, str]) -> list[str]:
        if self.image is None:  # the bound code sees the node's files: configMap paths point at their copies
            args = list(self.spec.get("args", []))
            for mount in self.spec.get("volumeMounts") or []:
                if mount.get("name") in self.written:
                    args = [a.replace(mount["mountPath"], self.written[mount["name"]]) for a in args]
            argv = [sys.executable, "-m", "gpunode_plugin", *args]
            mounted = any(m.get("mountPath") == SOCKET_DIR for m in self.spec.get("volumeMounts") or [])
            if not mounted:  # the container's view without the hostPath: no kubelet socket directory at all
                argv.append(f"--kubelet-socket={UNMOUNTED_SOCKET_DIR}/kubelet.sock")
            return argv
        argv = ["docker", "run", "--rm", "--name", self.docker_name(), "--network", "host"]
        security = self.spec.get("securityContext") or {}
        if security.get("readOnlyRootFilesystem"):
            argv.append("--read-only")
        if security.get("runAsUser") is not None:
            argv += ["--user", str(security["runAsUser"])]
        for capability in (security.get("capabilities") or {}).get("drop") or []:
            argv += ["--cap-drop", capability]
        for capability in (security.get("capabilities") or {}).get("add") or []:
            argv += ["--cap-add", capability]
        if self.runtime:
            argv += ["--runtime", self.runtime]
        host_paths = {v["name"]: v["hostPath"]["path"] for v in self.volumes if v.get("hostPath")}
        empty = {v["name"] for v in self.volumes if "emptyDir" in v}
        for mount in self.spec.get("volumeMounts") or []:
            if mount.get("name") in host_paths:  # recursive binds; docker refuses rprivate for one holding its root
                argv += ["--mount", f"type=bind,source={host_paths[mount['name']]},target={mount['mountPath']}"
                         + (",readonly" if mount.get("readOnly") else "") + ",bind-propagation=rslave"]
            elif mount.get("name") in self.written:
                argv += ["-v", f"{self.written[mount['name']]}:{mount['mountPath']}:ro"]
            elif mount.get("name") in empty:
                argv += ["--tmpfs", mount["mountPath"]]
        for key, value in sorted(env.items()):
            argv += ["-e", f"{key}={value}"]
        return [*argv, self.image, *self.spec.get("args", [])]

    def start(self, node: str) -> None:
        os.makedirs(LOG_DIR, exist_ok=True)
        self.log = f"{LOG_DIR}/{self.key.replace('/', '_')}.log"
        declared = {}
        for variable in self.spec.get("env", []):
            field_ref = ((variable.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
            declared[variable["name"]] = node if field_ref == "spec.nodeName" else str(variable.get("value", ""))
        base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        # from an image, the container's environment is the pod's (the nvidia runtime adds the driver's); the
        # bound code needs the simulated NVML backend named
        env = base if self.image else {**base, **SIM_ENV, **declared}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.argv(declared), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started_at = time.monotonic()
        self.started_stamp = now()
        self.ready = False

    def stop(self) -> None:
        if self.process and self.process.poll() is None and self.image is not None:
            subprocess.run(["docker", "stop", "-t", "10", self.docker_name()], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=30, check=False)
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def probe_url(self) -> str | None:
        probe = (self.spec.get("readinessProbe") or {}).get("httpGet")
        if not probe:
            return None
        port = probe.get("port")
        if isinstance(port, str):
            port = next((p["containerPort"] for p in self.spec.get("ports", []) if p.get("name") == port), None)
        return f"http://127.0.0.1:{port}{probe.get('path', '/')}" if port else None

    def backoff(self) -> float:
        return min(BACKOFF_MAX, BACKOFF_START * 2 ** min(self.restarts - 1, 10))

    def tick(self, node: str) -> None:
        """Start, restart with back-off, or probe; as the kubelet's sync loop does for one container."""
        moment = time.monotonic()
        if self.process is not None and self.process.poll() is not None:
            self.last_exit = self.process.returncode
            self.process = None
            self.ready = False
            self.restarts += 1
            lived = moment - self.started_at
            self.next_start = moment + (0.0 if lived > BACKOFF_MAX else self.backoff())
        if self.process is None:
            if moment >= self.next_start:
                self.start(node)
            return
        url = self.probe_url()
        if url is None:
            self.ready = True
            return
        if self.ready and moment < self.next_probe:  # a ready container is probed every periodSeconds, as the
            return                                   # kubelet does; until then every pass, so it is Ready at once
        self.next_probe = moment + float((self.spec.get("readinessProbe") or {}).get("periodSeconds", 10))
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:  # noqa: S310 - the node's own loopback
                self.ready = answer.status == 200
        except OSError:
            self.ready = False

    def log_text(self) -> str:
        if not self.log or not os.path.exists(self.log):
            return ""
        with open(self.log, "rb") as handle:
            handle.seek(max(0, os.path.getsize(self.log) - 64000))
            return handle.read().decode(errors="replace")

    def status(self, pod: dict) -> dict:
        spec = pod["spec"]["containers"][0]
        meta = pod["metadata"]
        if self.process is not None:
            state = {"running": {"startedAt": self.started_stamp}}
        elif self.restarts:
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
                f"back-off {self.backoff():.0f}s restarting failed container={spec['name']} "
                f"pod={meta['name']}_{meta['namespace']}({meta['uid']})")}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        entry = {"name": spec["name"], "image": spec.get("image", ""), "imageID": "", "ready": self.ready,
                 "started": self.process is not None, "restartCount": self.restarts, "state": state}
        if self.last_exit is not None:
            entry["lastState"] = {"terminated": {"exitCode": self.last_exit, "reason": "Error"}}
        running = self.process is not None or self.restarts > 0
        return {"phase": "Running" if running else "Pending", "containerStatuses": [entry],
                "ready": self.ready, "reason": None, "message": None}


@dataclass
class PullWait:
    """A daemon pod's image that could not be pulled: its error and the back-off, as the kubelet reports them."""

    image: str
    error: str
    failures: int = 1
    next_try: float = 0.0

    def delay(self) -> float:
        return min(PULL_BACKOFF[1], PULL_BACKOFF[0] * 2 ** (self.failures - 1))

    def status(self, pod: dict) -> dict:
        spec = pod["spec"]["containers"][0]
        waiting = ({"reason": "ImagePullBackOff",
                    "message": f'Back-off pulling image "{self.image}": ErrImagePull: {self.error}'}
                   if time.monotonic() < self.next_try else {"reason": "ErrImagePull", "message": self.error})
        entry = {"name": spec["name"], "image": self.image, "imageID": "", "ready": False, "started": False,
                 "restartCount": 0, "state": {"waiting": waiting}}
        return {"phase": "Pending", "containerStatuses": [entry], "ready": False, "reason": None, "message": None}


@dataclass
class Workload:
    """A workload pod: run once in its own thread (restartPolicy Never), its outcome reported.

    A sandbox that could not be created (no such runtime handler) is retried, as
    the kubelet does, until the pod is deleted.
    """

    key: str
    pod: dict
    handler: str
    outcome: Outcome | None = None
    attempts: int = 0
    retry_at: float = 0.0
    busy: bool = False
    started_stamp: str = ""
    finished_stamp: str = ""

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    def start(self, kubelet: KubeletStandin, taken, admission: threading.Lock) -> None:
        self.attempts += 1
        self.busy = True
        spec = self.pod["spec"]["containers"][0]

        def run() -> None:
            try:
                with admission:
                    try:
                        env, devices = admit(kubelet, spec, taken())
                    except DeviceAdmissionError as error:
                        self.outcome = Outcome("Failed", reason="UnexpectedAdmissionError", message=str(error))
                        return
                    except Exception as error:  # noqa: BLE001 - Allocate failing is the pod's failure, reported
                        self.outcome = Outcome("Failed", reason="UnexpectedAdmissionError", message=repr(error))
                        return
                    self.started_stamp = now()
                    self.outcome = Outcome("Running", devices=devices)
                outcome = launch(self.name, spec, env, self.handler)
                outcome.devices = devices
                self.finished_stamp = now()
                self.outcome = outcome
                if outcome.reason == "FailedCreatePodSandBox":
                    self.retry_at = time.monotonic() + SANDBOX_RETRY
            finally:
                self.busy = False

        threading.Thread(target=run, daemon=True).start()

    def due(self) -> bool:
        """A failed sandbox whose retry time has come."""
        return (not self.busy and self.outcome is not None and self.outcome.reason == "FailedCreatePodSandBox"
                and time.monotonic() >= self.retry_at)

    def devices(self) -> set[str]:
        """Devices the pod holds: until it terminates (the kubelet frees a finished pod's devices)."""
        if self.outcome is None or self.outcome.phase != "Running":
            return set()
        return {d for ids in self.outcome.devices.values() for d in ids}

    def status(self) -> dict:
        spec = self.pod["spec"]["containers"][0]
        o = self.outcome
        base = {"name": spec["name"], "image": spec.get("image", ""), "imageID": "", "restartCount": 0}
        if o is None or o.phase == "Pending":
            waiting = {"reason": "ContainerCreating"}
            return {"phase": "Pending", "ready": False, "reason": None, "message": None,
                    "containerStatuses": [{**base, "ready": False, "started": False, "state": {"waiting": waiting}}]}
        if o.reason == "UnexpectedAdmissionError":
            return {"phase": "Failed", "ready": False, "reason": "UnexpectedAdmissionError", "message": o.message,
                    "containerStatuses": None}
        if o.phase == "Running":
            state = {"running": {"startedAt": self.started_stamp}}
        else:
            state = {"terminated": {"exitCode": o.exit_code if o.exit_code is not None else 1,
                                    "reason": o.reason or "Error", "startedAt": self.started_stamp,
                                    "finishedAt": self.finished_stamp, **({"message": o.message} if o.message else {})}}
        return {"phase": o.phase, "ready": o.phase == "Running", "reason": None, "message": None,
                "containerStatuses": [{**base, "ready": o.phase == "Running", "started": o.phase == "Running",
                                       "state": state}]}


def _key(pod: dict) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def is_daemon(pod: dict) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in pod["metadata"].get("ownerReferences") or [])


@dataclass
class NodeFacts:
    """What the kubelet reports about its machine."""

    name: str
    address: str
    runtime_version: str
    kubelet_version: str
    base: dict[str, str] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, config: dict) -> NodeFacts:
        facts = cls(config["node"], config["address"], config["runtime_version"], config["kubelet_version"])
        memory = "0Ki"
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    memory = f"{line.split()[1]}Ki"
        stat = os.statvfs("/")
        facts.base = {"cpu": str(os.cpu_count() or 1), "memory": memory, "pods": "110",
                      "ephemeral-storage": f"{stat.f_blocks * stat.f_frsize // 1024}Ki"}

        def read_file(path: str, default: str = "") -> str:
            try:
                with open(path) as handle:
                    return handle.read().strip()
            except OSError:
                return default

        os_image = "Linux"
        for line in read_file("/etc/os-release").splitlines():
            if line.startswith("PRETTY_NAME="):
                os_image = line.split("=", 1)[1].strip('"')
        facts.info = {"machineID": read_file("/etc/machine-id"), "systemUUID": str(uuid.uuid5(
            uuid.NAMESPACE_URL, facts.name)), "bootID": read_file("/proc/sys/kernel/random/boot_id"),
            "kernelVersion": os.uname().release, "osImage": os_image, "containerRuntimeVersion": facts.runtime_version,
            "kubeletVersion": facts.kubelet_version, "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": "amd64"}
        return facts


class Api:
    """The node's calls to the API server (lightkube, with the node's client certificate)."""

    def __init__(self) -> None:
        self.client = Client(KubeConfig.from_file(KUBECONFIG).get(), field_manager="kubelet", trust_env=False,
                             timeout=15)

    def register(self, facts: NodeFacts) -> str:
        labels = {"kubernetes.io/hostname": facts.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}
        try:
            node = self.client.create(from_dict({"apiVersion": "v1", "kind": "Node",
                                                 "metadata": {"name": facts.name, "labels": labels}}))
        except ApiError as error:
            if error.status.code != 409:
                raise
            node = self.client.get(Node, facts.name)
        return node.metadata.uid

    def node_status(self, name: str, patch: dict) -> None:
        # strategic merge, as the kubelet patches it: conditions merge by type, so the ones other writers own
        # (node-problem-detector's, gpunode's node checker's) stay; a JSON merge patch would replace the list
        self.client.patch(Node.Status, name, {"status": patch}, patch_type=PatchType.STRATEGIC)

    def renew_lease(self, name: str, node_uid: str) -> None:
        spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now_micro()}
        try:
            self.client.patch(Lease, name, {"spec": spec}, namespace="kube-node-lease", patch_type=PatchType.MERGE)
        except ApiError as error:
            if error.status.code != 404:
                raise
            self.client.create(from_dict({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]},
                "spec": spec}))

    def pods(self, node: str) -> tuple[list[dict], str]:
        listed = self.client.list(Pod, namespace="*", fields={"spec.nodeName": node}, chunk_size=500)
        pods = [p.to_dict() for p in listed]
        return pods, listed.resourceVersion

    def watch(self, node: str, version: str):
        return self.client.watch(Pod, namespace="*", fields={"spec.nodeName": node}, resource_version=version)

    def pod_status(self, namespace: str, name: str, status: dict) -> None:
        self.client.patch(Pod.Status, name, {"status": status}, namespace=namespace, patch_type=PatchType.MERGE)

    def finish_deletion(self, namespace: str, name: str) -> None:
        try:
            self.client.delete(Pod, name, namespace=namespace, grace_period=0)
        except ApiError as error:
            if error.status.code != 404:
                raise

    def config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            return dict(self.client.get(ConfigMap, name, namespace=namespace).data or {})
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise

    def pull_auths(self, namespace: str, names: list[str]) -> dict:
        """The ``auths`` of the pod's image pull Secrets (those that exist and are dockerconfigjson), merged."""
        auths: dict = {}
        for name in names:
            try:
                secret = self.client.get(Secret, name, namespace=namespace)
            except ApiError as error:
                if error.status.code == 404:
                    continue  # the kubelet pulls without a Secret it cannot find, and says so in its log
                raise
            encoded = (secret.data or {}).get(".dockerconfigjson")
            if secret.type == "kubernetes.io/dockerconfigjson" and encoded:
                auths.update(json.loads(base64.b64decode(encoded)).get("auths") or {})
        return auths

    def pod_token(self, namespace: str, account: str, pod: str, uid: str, seconds: int, audiences: list[str]) -> str:
        """A ServiceAccount token bound to the pod, as the kubelet requests one with the node's identity."""
        spec = TokenRequestSpec(audiences=audiences, expirationSeconds=seconds,
                                boundObjectRef=BoundObjectReference(apiVersion="v1", kind="Pod", name=pod, uid=uid))
        return self.client.create(ServiceAccount.Token(metadata=ObjectMeta(), spec=spec), account,
                                  namespace=namespace).status.token

    def runtime_handler(self, runtime_class: str) -> str | None:
        try:
            return self.client.get(RuntimeClass, runtime_class).handler
        except ApiError as error:
            if error.status.code == 404:
                return None
            raise

    def event(self, pod: dict, node: str, kind: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        stamp = now()
        self.client.create(from_dict({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": meta["namespace"],
                               "name": meta["name"], "uid": meta["uid"]},
            "reason": reason, "message": message, "type": kind, "count": 1, "firstTimestamp": stamp,
            "lastTimestamp": stamp, "source": {"component": "kubelet", "host": node},
            "reportingComponent": "kubelet", "reportingInstance": node}))


class Agent:
    """The node's kubelet: the API's pods in, their containers run, statuses and the node's resources out."""

    def __init__(self, config: dict) -> None:
        os.makedirs(SOCKET_DIR, exist_ok=True)
        self.config = config
        self.pulls: dict[str, PullWait] = {}  # namespace/name -> its image's last failed pull
        self.facts = NodeFacts.read(config)
        self.kubelet = KubeletStandin(SOCKET_DIR)
        self.api = Api()
        self.node_uid = ""
        self.pods: dict[str, dict] = {}  # namespace/name -> the pod as the API last said
        self.containers: dict[str, Container] = {}
        self.workloads: dict[str, Workload] = {}
        self.sent: dict[str, dict] = {}  # namespace/name -> the status last patched
        self.events_sent: set[tuple[str, str, str]] = set()
        self.node_sent: dict = {}
        self.node_sent_at = 0.0
        self.lock = threading.RLock()  # pods, containers, workloads
        self.admission = threading.Lock()  # one pod's devices are picked and allocated at a time
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.started = now()  # the conditions' lastTransitionTime: since this kubelet runs

    # -- the API side --------------------------------------------------------------------------------------

    def register(self) -> None:
        while not self.stopping.is_set():
            try:
                self.node_uid = self.api.register(self.facts)
                self.post_node_status(force=True)
                self.api.renew_lease(self.facts.name, self.node_uid)
                say(f"registered node {self.facts.name}")
                return
            except Exception as error:  # noqa: BLE001 - the API may not be up yet: the kubelet keeps trying
                say(f"registering the node failed: {error!r}")
                self.stopping.wait(2)

    def lease_loop(self) -> None:
        while not self.stopping.wait(LEASE_RENEW):
            try:
                self.api.renew_lease(self.facts.name, self.node_uid)
            except Exception as error:  # noqa: BLE001 - a missed renewal is retried; the controller judges
                say(f"lease renewal failed: {error!r}")

    def watch_loop(self) -> None:
        """List the node's pods, then watch them; start over from a fresh list on any error."""
        while not self.stopping.is_set():
            try:
                pods, version = self.api.pods(self.facts.name)
                with self.lock:
                    self.pods = {_key(p): p for p in pods}
                self.wake.set()
                for kind, pod in self.api.watch(self.facts.name, version):
                    if self.stopping.is_set():
                        return
                    data = pod.to_dict()
                    with self.lock:
                        if kind == "DELETED":
                            self.pods.pop(_key(data), None)
                        else:
                            self.pods[_key(data)] = data
                    self.wake.set()
            except Exception as error:  # noqa: BLE001 - watches end; the kubelet lists again
                if not self.stopping.is_set():
                    say(f"pod watch ended: {error!r}")
                    self.stopping.wait(1)

    def post_node_status(self, force: bool = False) -> None:
        resources = self.kubelet.report()
        capacity = dict(self.facts.base)
        allocatable = dict(self.facts.base)
        for resource, counts in resources.items():
            capacity[resource] = str(counts["capacity"])
            allocatable[resource] = str(counts["allocatable"])
        wanted = {"capacity": capacity, "allocatable": allocatable}
        stale = time.monotonic() - self.node_sent_at > STATUS_HEARTBEAT
        if wanted == self.node_sent and not force and not stale:
            return
        patch: dict = {}
        for key in ("capacity", "allocatable"):  # a resource no plugin offers any more is removed
            gone = {r: None for r in self.node_sent.get(key, {}) if r not in wanted[key]}
            patch[key] = {**gone, **wanted[key]}
        stamp = now()
        conditions = [
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
             "message": "kubelet has sufficient memory available"},
            {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
             "message": "kubelet has no disk pressure"},
            {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
             "message": "kubelet has sufficient PID available"},
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"},
        ]
        for condition in conditions:
            condition.update(lastHeartbeatTime=stamp, lastTransitionTime=self.started)
        patch.update(conditions=conditions, nodeInfo=self.facts.info,
                     addresses=[{"type": "InternalIP", "address": self.facts.address},
                                {"type": "Hostname", "address": self.facts.name}],
                     daemonEndpoints={"kubeletEndpoint": {"Port": KUBELET_PORT}})
        self.api.node_status(self.facts.name, patch)
        self.node_sent = wanted
        self.node_sent_at = time.monotonic()

    # -- the node side -------------------------------------------------------------------------------------

    def taken(self) -> set[str]:
        with self.lock:
            return {d for w in self.workloads.values() for d in w.devices()}

    def sync(self) -> None:
        """One pass of the kubelet's sync loop over the pods bound to this node."""
        with self.lock:
            pods = dict(self.pods)
        live = {k: p for k, p in pods.items() if not p["metadata"].get("deletionTimestamp")}
        terminating = {k: p for k, p in pods.items() if p["metadata"].get("deletionTimestamp")}
        to_stop: list[Container] = []
        with self.lock:
            for key in [k for k in self.containers if k not in live or not is_daemon(live[k])]:
                to_stop.append(self.containers.pop(key))
            gone = [self.workloads.pop(k) for k in [k for k in self.workloads if k not in live]]
            for key in [k for k in self.pulls if k not in live]:
                del self.pulls[key]
        for container in to_stop:
            container.stop()
            for folder in container.written.values():
                shutil.rmtree(os.path.dirname(folder), ignore_errors=True)
        for workload in gone:
            if workload.outcome is not None and workload.outcome.phase == "Running":
                threading.Thread(target=kill, args=(workload.name,), daemon=True).start()
        for key, pod in terminating.items():  # containers stopped: the kubelet ends the pod's deletion
            try:
                self.api.finish_deletion(pod["metadata"]["namespace"], pod["metadata"]["name"])
            except Exception as error:  # noqa: BLE001 - tried again next pass
                say(f"deleting {key} failed: {error!r}")
        for key, pod in live.items():
            if not pod["spec"].get("containers"):
                continue
            if is_daemon(pod):
                self.sync_daemon(key, pod)
            else:
                self.sync_workload(key, pod)
        self.post_statuses(live)
        try:
            self.post_node_status()
        except Exception as error:  # noqa: BLE001 - posted again next pass
            say(f"node status update failed: {error!r}")

    def sync_daemon(self, key: str, pod: dict) -> None:
        spec = pod["spec"]["containers"][0]
        with self.lock:
            current = self.containers.get(key)
            if current is not None and current.spec != spec:
                self.containers.pop(key)
                current.stop()
                current = None
            if current is None:
                image, runtime = None, ""
                if shutil.which("dockerd"):  # docker nodes run the plugin from its image; containerd agents bind code
                    image = self.pull(key, pod)
                    if image is None:
                        return
                runtime_class = pod["spec"].get("runtimeClassName") or ""
                if image and runtime_class:
                    runtime = self.api.runtime_handler(runtime_class) or runtime_class
                volumes = pod["spec"].get("volumes") or []
                current = self.containers[key] = Container(key, spec, image, runtime, volumes,
                                                           self.write_config_maps(key, pod, volumes))
        before = current.restarts
        current.tick(self.facts.name)
        if current.restarts > before and current.restarts > 1:
            self.event(pod, "Warning", "BackOff", f"Back-off restarting failed container {spec['name']} in pod "
                       f"{pod['metadata']['name']}_{pod['metadata']['namespace']}({pod['metadata']['uid']})",
                       once=False)

    def write_config_maps(self, key: str, pod: dict, volumes: list) -> dict[str, str]:
        """Each configMap volume's keys as files in a folder of the pod's, as the kubelet projects them; and each
        projected volume (the ServiceAccount admission's kube-api-access: a token bound to this pod, the cluster's
        CA, the namespace), as the kubelet writes it."""
        written = {}
        namespace = pod["metadata"]["namespace"]
        for volume in volumes:
            if volume.get("configMap"):
                data = self.api.config_map_data(namespace, volume["configMap"]["name"]) or {}
            elif volume.get("projected"):
                data = self.projected(pod, volume["projected"])
            else:
                continue
            folder = os.path.join(VOLUME_DIR, key.replace("/", "_"), volume["name"])
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            for name, text in data.items():
                os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
                with open(os.path.join(folder, name), "w") as handle:
                    handle.write(text)
            written[volume["name"]] = folder
        return written

    def projected(self, pod: dict, projected: dict) -> dict[str, str]:
        """A projected volume's files: ServiceAccount token (TokenRequest bound to the pod, with the kubelet's
        3607 s, which the API server extends), configMap items, the pod's namespace."""
        files: dict[str, str] = {}
        meta = pod["metadata"]
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                wanted = source["serviceAccountToken"]
                files[wanted.get("path", "token")] = self.api.pod_token(
                    meta["namespace"], pod["spec"].get("serviceAccountName") or "default", meta["name"], meta["uid"],
                    wanted.get("expirationSeconds") or 3607, [wanted["audience"]] if wanted.get("audience") else [])
            elif "configMap" in source:
                data = self.api.config_map_data(meta["namespace"], source["configMap"]["name"]) or {}
                for item in source["configMap"].get("items") or [{"key": k, "path": k} for k in data]:
                    if item["key"] in data:
                        files[item["path"]] = data[item["key"]]
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    if (item.get("fieldRef") or {}).get("fieldPath") == "metadata.namespace":
                        files[item["path"]] = meta["namespace"]
        return files

    def pull(self, key: str, pod: dict) -> str | None:
        """The daemon pod's image, pulled with its image pull Secrets unless docker holds it; None while it cannot
        be pulled (the failure and the back-off are the pod's status and events, in the kubelet's words)."""
        image = pod["spec"]["containers"][0]["image"]
        present = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image], stdin=subprocess.DEVNULL,
                                 capture_output=True, timeout=60, check=False).returncode == 0
        if present:  # imagePullPolicy IfNotPresent, as the DaemonSet says: what the runtime holds is used
            self.pulls.pop(key, None)
            return image
        failed = self.pulls.get(key)
        if failed is not None and failed.image == image and time.monotonic() < failed.next_try:
            self.event(pod, "Normal", "BackOff", f'Back-off pulling image "{image}"')
            return None
        self.event(pod, "Normal", "Pulling", f'Pulling image "{image}"', once=False)
        error = self.docker_pull(image, pod)
        if error is None:
            self.pulls.pop(key, None)
            self.event(pod, "Normal", "Pulled", f'Successfully pulled image "{image}"', once=False)
            return image
        failures = failed.failures + 1 if failed is not None and failed.image == image else 1
        wait = PullWait(image, error, failures)
        wait.next_try = time.monotonic() + wait.delay()
        self.pulls[key] = wait
        self.event(pod, "Warning", "Failed", f'Failed to pull image "{image}": {error}', once=False)
        self.event(pod, "Warning", "Failed", "Error: ErrImagePull", once=False)
        return None

    def docker_pull(self, image: str, pod: dict) -> str | None:
        """docker pull with the pod's registry credentials (a private config for this pull); None or docker's words."""
        names = [ref.get("name") for ref in pod["spec"].get("imagePullSecrets") or [] if ref.get("name")]
        try:
            auths = self.api.pull_auths(pod["metadata"]["namespace"], names) if names else {}
        except Exception as error:  # noqa: BLE001 - reported as the pull's failure
            return f"reading the pod's image pull secrets failed: {error}"
        with tempfile.TemporaryDirectory(prefix="pull-") as config:
            with open(os.path.join(config, "config.json"), "w") as handle:
                json.dump({"auths": auths}, handle)
            pulled = subprocess.run(["docker", "--config", config, "pull", "--quiet", image], stdin=subprocess.DEVNULL,
                                    capture_output=True, text=True, timeout=300, check=False)
        if pulled.returncode == 0:
            return None
        return " ".join(pulled.stderr.split()) or f"docker pull exited {pulled.returncode}"

    def sync_workload(self, key: str, pod: dict) -> None:
        phase = (pod.get("status") or {}).get("phase")
        with self.lock:
            workload = self.workloads.get(key)
        if workload is None:
            if phase in ("Succeeded", "Failed"):
                return  # finished before this kubelet started
            runtime_class = pod["spec"].get("runtimeClassName") or ""
            handler = ""
            if runtime_class:
                found = self.api.runtime_handler(runtime_class)
                if found is None:
                    self.event(pod, "Warning", "FailedCreatePodSandBox",
                               f'Failed to create pod sandbox: runtimeclass.node.k8s.io "{runtime_class}" not found')
                    return
                handler = found
            with self.lock:
                workload = self.workloads[key] = Workload(key, pod, handler)
            workload.start(self.kubelet, self.taken, self.admission)
            return
        outcome = workload.outcome
        if outcome is None:
            return
        if outcome.reason in ("FailedCreatePodSandBox", "UnexpectedAdmissionError"):
            self.event(pod, "Warning", outcome.reason, outcome.message)
        if workload.due():
            workload.start(self.kubelet, self.taken, self.admission)

    def event(self, pod: dict, kind: str, reason: str, message: str, once: bool = True) -> None:
        mark = (pod["metadata"]["uid"], reason, message)
        if once and mark in self.events_sent:
            return
        self.events_sent.add(mark)
        try:
            self.api.event(pod, self.facts.name, kind, reason, message)
        except Exception as error:  # noqa: BLE001 - an event is best effort, as the kubelet's are
            say(f"event {reason} for {pod['metadata']['name']} failed: {error!r}")

    def post_statuses(self, live: dict[str, dict]) -> None:
        for key, pod in live.items():
            with self.lock:
                runner = self.containers.get(key) or self.workloads.get(key) or self.pulls.get(key)
            if runner is None:
                continue
            report = runner.status(pod) if isinstance(runner, (Container, PullWait)) else runner.status()
            ready = "True" if report.pop("ready") else "False"
            status = {**report, "hostIP": self.facts.address, "hostIPs": [{"ip": self.facts.address}],
                      "conditions": [
                          {"type": "PodReadyToStartContainers", "status": "True"},
                          {"type": "Initialized", "status": "True"},
                          {"type": "Ready", "status": ready}, {"type": "ContainersReady", "status": ready},
                          {"type": "PodScheduled", "status": "True"}]}
            if pod["spec"].get("hostNetwork"):
                status.update(podIP=self.facts.address, podIPs=[{"ip": self.facts.address}])
            compared = json.dumps(status, sort_keys=True)
            previous = (pod.get("status") or {}).get("conditions") or []
            # posted before and still what the API holds; another writer (the node lifecycle controller marks a
            # NotReady node's pods not ready: seen at 100 nodes under load) makes the kubelet post it again
            held = {c["type"]: c.get("status") for c in previous}
            if self.sent.get(key) == compared and all(held.get(c["type"]) == c["status"] for c in status["conditions"]):
                continue
            stamps = {c["type"]: c.get("lastTransitionTime") for c in previous}
            for condition in status["conditions"]:
                same = held.get(condition["type"]) == condition["status"] and stamps.get(condition["type"])
                condition["lastTransitionTime"] = stamps[condition["type"]] if same else now()
            status.setdefault("startTime", (pod.get("status") or {}).get("startTime") or now())
            try:
                self.api.pod_status(pod["metadata"]["namespace"], pod["metadata"]["name"], status)
                self.sent[key] = compared
            except Exception as error:  # noqa: BLE001 - posted again next pass
                say(f"status of {key} not posted: {error!r}")

    def logs(self, namespace: str, name: str) -> str | None:
        key = f"{namespace}/{name}"
        with self.lock:
            container = self.containers.get(key)
            workload = self.workloads.get(key)
        if container is not None:
            return container.log_text()
        if workload is not None:
            return workload.outcome.log if workload.outcome else ""
        return None

    def loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.sync()
            except Exception as error:  # noqa: BLE001 - the kubelet keeps syncing; the error goes to its log
                say(f"sync failed: {error!r}")
            self.wake.wait(SYNC_BUSY if self.busy() else SYNC_IDLE)
            self.wake.clear()

    def busy(self) -> bool:
        """A container starting or not ready, or a workload not finished: the sync loop then runs twice a second.

        An idle node syncs every SYNC_IDLE seconds (pod changes wake it at once through the watch): at 100 nodes
        the half-second loop of every agent cost a third of a core with nothing to do.
        """
        with self.lock:
            starting = any(c.process is None or not c.ready for c in self.containers.values())
            running = any(w.outcome is None or w.outcome.phase in ("Pending", "Running")
                          for w in self.workloads.values())
        return starting or running

    def run(self) -> None:
        self.kubelet.restart()  # a starting kubelet clears the sockets a previous one left
        serve_logs(self)
        self.register()
        for target in (self.lease_loop, self.watch_loop):
            threading.Thread(target=target, daemon=True).start()
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        try:
            self.loop()
        finally:
            self.stopping.set()
            for container in list(self.containers.values()):
                container.stop()
            self.kubelet.stop()


def serve_logs(agent: Agent) -> None:
    """The kubelet's HTTPS port: ``/containerLogs/NS/POD/CONTAINER`` (``kubectl logs`` through the API server)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            split = urlsplit(self.path)
            parts = [p for p in split.path.split("/") if p]
            body, code = b"404 page not found\n", 404
            if parts == ["healthz"]:
                body, code = b"ok", 200
            elif len(parts) >= 3 and parts[0] == "containerLogs":
                text = agent.logs(parts[1], parts[2])
                if text is not None:
                    tail = parse_qs(split.query).get("tailLines", [""])[-1]
                    lines = text.splitlines(keepends=True)
                    if tail.isdigit():
                        lines = lines[-int(tail):] if int(tail) else []
                    body, code = "".join(lines).encode(), 200
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
            return

    server = ThreadingHTTPServer(("127.0.0.1", KUBELET_PORT), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*SERVING)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()


if __name__ == "__main__":
    import faulthandler

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # stacks into the agent's log
    with open(CONFIG) as handle:
        Agent(json.load(handle)).run()
