"""The simulated control plane: a loopback Kubernetes API for exactly the calls gpunode makes.

Serves Node, Namespace, ServiceAccount, Pod, RuntimeClass and DaemonSet objects:
get, list (label and field selectors), server-side apply with managed fields per
field manager, JSON merge patch (what ``kubectl label`` sends) and delete, with
the API server's Status errors (401, 403 with the RBAC wording, 404, 409 apply
conflicts). Anything else answers 501 with the method and path, so a test can
never pass against something this server does not really do.

Nodes of the simulated fleet appear as Node objects. A DaemonSet controller
binds one pod per matching node; each node's agent (``nodeagent``, run inside the
node) runs the pods' containers for real and reports, as the kubelet does,
capacity/allocatable and container states, from which Node, Pod and DaemonSet
status are written.

    python -m gpunode.sim.apiserver STATE_DIR ADDRESS PORT
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml

from gpunode.errors import GpunodeError
from gpunode.lint import resource_errors
from gpunode.sim.apistore import (
    DAEMONSET,
    EVENT,
    KINDS,
    NAMESPACE,
    NODE,
    POD,
    RUNTIME_CLASS,
    ApiFailure,
    Kind,
    Store,
    Stored,
    not_found,
    now,
)
from gpunode.sim.fleet import node_pid1, restart_node
from gpunode.sim.node import REBOOT_REQUEST
from gpunode.sim.paths import SimPaths

SERVER_VERSION = {"major": "1", "minor": "31", "gitVersion": "v1.31.0-gpunode-sim", "platform": "linux/amd64"}
READ_VERBS = {"get", "list"}
EXTENDED_PREFIX = "nvidia.com/"


def pod_requests(spec: dict) -> dict[str, int]:
    """Extended resources a pod asks for (limits; requests equal them once validated), summed over containers."""
    wanted: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for resource, count in ((container.get("resources") or {}).get("limits") or {}).items():
            if resource.startswith(EXTENDED_PREFIX):
                wanted[resource] = wanted.get(resource, 0) + int(count)
    return wanted


def verb_of(method: str, has_name: bool) -> str:
    return {"GET": "get" if has_name else "list", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())


def forbidden(user: str, verb: str, kind: Kind, namespace: str, name: str) -> ApiFailure:
    """403 in the RBAC authorizer's words."""
    subject = f'{kind.describe()} "{name}"' if name else kind.describe()
    scope = f'in the namespace "{namespace}"' if kind.namespaced and namespace else "at the cluster scope"
    message = (f'{subject} is forbidden: User "{user}" cannot {verb} resource "{kind.plural}" in API group '
               f'"{kind.group}" {scope}')
    return ApiFailure(403, "Forbidden", message, {"name": name, "kind": kind.plural} if name else
                      {"kind": kind.plural})


def matches_selector(labels: dict, selector: str) -> bool:
    """Equality-based label selectors (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``), comma-separated."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(obj: dict, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        current: object = obj
        for part in key.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        if str(current or "") != value:
            return False
    return True


def tolerates(tolerations: list[dict], taints: list[dict], effects: tuple[str, ...] = ("NoSchedule", "NoExecute")
              ) -> bool:
    """Whether the tolerations cover every taint with one of ``effects`` (scheduling: both; staying: NoExecute)."""
    for taint in taints:
        if taint.get("effect") not in effects:
            continue
        if not any(t.get("key") in (None, "", taint.get("key"))
                   and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
                   and t.get("effect") in (None, "", taint.get("effect")) for t in tolerations):
            return False
    return True


class AgentLink:
    """The control plane's end of one node's agent (a process inside the node)."""

    def __init__(self, node: str, pid1: int, on_report, log: Path) -> None:
        nsenter = shutil.which("nsenter") or "nsenter"
        argv = [nsenter, "-t", str(pid1), "-m", "-u", "-i", "-n", "-p", "-r", "-w",
                sys.executable, "-m", "gpunode.sim.nodeagent"]
        self.node = node
        with log.open("ab") as errors:
            self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
                                            text=True, bufsize=1, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        self.sent = ""
        threading.Thread(target=self._read, args=(on_report,), daemon=True).start()

    def _read(self, on_report) -> None:
        for line in self.process.stdout:
            try:
                on_report(self.node, json.loads(line))
            except json.JSONDecodeError:
                continue

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, pods: dict) -> None:
        line = json.dumps({"pods": pods}, sort_keys=True)
        if line != self.sent and self.alive():
            try:
                self.process.stdin.write(line + "\n")
                self.sent = line
            except (BrokenPipeError, OSError):
                return

    def close(self) -> None:
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()


class ControlPlane:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        environment = SimPaths.from_env()  # the fleet's env: cache folder and address block
        self.paths = SimPaths(state_dir, environment.cache, environment.net_block)
        self.store = Store()
        tokens_file = state_dir / "run" / "apiserver-tokens.json"
        self.tokens: dict[str, dict] = json.loads(tokens_file.read_text()) if tokens_file.exists() else {}
        self.audit = (state_dir / "run" / "apiserver-audit.log").open("a", buffering=1)
        self.fleet_mtime = 0.0
        self.agents: dict[str, AgentLink] = {}
        self.reports: dict[str, dict] = {}
        self.last_events: dict[str, tuple[str, str]] = {}
        self.logs: dict[tuple[str, str], str] = {}  # (namespace, pod) -> its container's output
        self.stopping = threading.Event()

    # -- requests ------------------------------------------------------------------------------------------

    def authenticate(self, header: str | None) -> dict:
        token = (header or "").removeprefix("Bearer ").strip()
        user = self.tokens.get(token)
        if not token or user is None or user.get("expired"):
            raise ApiFailure(401, "Unauthorized", "Unauthorized")
        return user

    def record(self, user: str, method: str, uri: str, code: int, manager: str = "", changed: bool = False) -> None:
        self.audit.write(json.dumps({"time": now(), "user": user, "verb": method, "uri": uri, "code": code,
                                     "fieldManager": manager, "changed": changed}) + "\n")

    @staticmethod
    def route(path: str) -> tuple[Kind, str, str, str]:
        """(kind, namespace, name, subresource) of a resource path; ApiFailure 501 for anything else."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiFailure(501, "NotImplemented", f"the simulated control plane does not serve {path}")
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        kind = next((k for k in KINDS if (k.group, k.version, k.plural) == (group, version, rest[0] if rest else "")),
                    None)
        if kind is None or len(rest) > 3 or (kind.namespaced is False and namespace):
            raise ApiFailure(501, "NotImplemented", f"the simulated control plane does not serve {path}")
        return kind, namespace, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""

    def handle(self, method: str, uri: str, headers: dict, body: bytes) -> tuple[int, dict | str]:
        split = urlsplit(uri)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        if split.path == "/version" and method == "GET":
            return 200, SERVER_VERSION
        user = self.authenticate(headers.get("authorization"))
        kind, namespace, name, sub = self.route(split.path)
        served = {("log", "Pod", "GET"), ("eviction", "Pod", "POST")}
        if (sub and (sub, kind.kind, method) not in served) or query.get("watch") in ("true", "1") \
                or "dryRun" in query:
            raise ApiFailure(501, "NotImplemented", f"the simulated control plane does not implement {method} {uri}")
        verb = "create" if (method, bool(name), kind.kind) == ("POST", False, "Pod") else verb_of(method, bool(name))
        if sub == "eviction":
            verb = "create"
        if verb not in ("get", "list", "patch", "delete", "create"):
            raise ApiFailure(501, "NotImplemented", f"the simulated control plane does not implement {method} {uri}")
        if user.get("role") != "admin" and verb not in READ_VERBS:
            raise forbidden(user["user"], verb, kind, namespace, name)
        with self.store.lock:
            if sub == "log":
                self.store.require(kind, namespace, name)
                return 200, self.logs.get((namespace, name), "")
            if sub == "eviction":  # no PodDisruptionBudgets here: an eviction always goes through
                self.store.delete(kind, namespace, name)
                self.record(user["user"], method, uri, 201, changed=True)
                self.reconcile()
                return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
            if verb == "create":
                stored = self.create_pod_request(namespace, body)
                self.record(user["user"], method, uri, 201, changed=True)
                self.reconcile()
                return 201, stored.render()
            if verb == "get":
                return 200, self.store.require(kind, namespace, name).render()
            if verb == "list":
                return 200, self.list(kind, namespace or None, query)
            if verb == "delete":
                self.store.delete(kind, namespace, name)
                self.record(user["user"], method, uri, 200, changed=True)
                return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                             "details": {"name": name, "kind": kind.plural}}
            stored, changed, manager = self.patch(kind, namespace, name, headers, body, query)
        self.record(user["user"], method, uri, 200, manager, changed)
        return 200, stored.render()

    def create_pod_request(self, namespace: str, body: bytes) -> Stored:
        """POST of a Pod: the API server's validation and RuntimeClass admission, then the object, unscheduled."""
        try:
            pod = json.loads(body.decode() or "{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ApiFailure(400, "BadRequest", f"error decoding the pod: {error}") from error
        meta, spec = pod.setdefault("metadata", {}), pod.setdefault("spec", {})
        name = meta.get("name", "")
        meta["namespace"] = namespace
        if self.store.get(NAMESPACE, "", namespace) is None:
            raise not_found(NAMESPACE, namespace)
        if self.store.get(POD, namespace, name) is not None:
            raise ApiFailure(409, "AlreadyExists", f'pods "{name}" already exists', {"name": name, "kind": "pods"})
        errors = resource_errors(spec)
        if errors:
            raise ApiFailure(422, "Invalid", f'Pod "{name}" is invalid: ' + ", ".join(map(str, errors)),
                             {"name": name, "kind": "Pod", "causes": [
                                 {"reason": "FieldValueRequired" if e.kind == "Required value" else "FieldValueInvalid",
                                  "message": f"{e.kind}: {e.detail}", "field": e.field} for e in errors]})
        handler = spec.get("runtimeClassName")
        if handler and self.store.get(RUNTIME_CLASS, "", handler) is None:
            raise ApiFailure(403, "Forbidden", f'pods "{name}" is forbidden: pod rejected: RuntimeClass "{handler}" '
                             "not found", {"name": name, "kind": "pods"})
        pod["status"] = {"phase": "Pending"}
        return self.store.create(POD, pod)

    def event(self, pod: Stored, kind: str, reason: str, message: str, component: str = "default-scheduler") -> None:
        """An Event on ``pod`` (one per distinct message, as ``kubectl describe`` shows them)."""
        meta = pod.obj["metadata"]
        if self.last_events.get(meta["uid"]) == (reason, message):
            return
        self.last_events[meta["uid"]] = (reason, message)
        name = f"{meta['name']}.{uuid.uuid4().hex[:16]}"
        self.store.create(EVENT, {"metadata": {"name": name, "namespace": meta["namespace"]},
                                  "involvedObject": {"kind": "Pod", "namespace": meta["namespace"],
                                                     "name": meta["name"], "uid": meta["uid"]},
                                  "reason": reason, "message": message, "type": kind, "count": 1,
                                  "firstTimestamp": now(), "lastTimestamp": now(),
                                  "source": {"component": component}})

    def schedule(self) -> None:
        """The scheduler's filters for what gpunode's pods need: nodeSelector, taints, extended resources."""
        nodes = self.store.items(NODE)
        pods = self.store.items(POD)
        for pod in pods:
            spec = pod.obj["spec"]
            if spec.get("nodeName") or pod.obj["status"].get("phase") not in ("Pending", None):
                continue
            wanted = pod_requests(spec)
            reasons: dict[str, int] = {}
            fits = []
            for node in nodes:
                why = self.unfit(node, spec, wanted, pods)
                if why:
                    reasons[why] = reasons.get(why, 0) + 1
                else:
                    fits.append(node)
            meta = pod.obj["metadata"]
            if fits:
                chosen = fits[0].obj["metadata"]["name"]
                spec["nodeName"] = chosen
                pod.obj["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
                self.store.bump(pod)
                self.event(pod, "Normal", "Scheduled",
                           f"Successfully assigned {meta['namespace']}/{meta['name']} to {chosen}")
                continue
            message = f"0/{len(nodes)} nodes are available: " + ", ".join(
                f"{count} {why}" for why, count in sorted(reasons.items())) + "."
            condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            if pod.obj["status"].get("conditions") != [condition]:
                pod.obj["status"]["conditions"] = [condition]
                self.store.bump(pod)
            self.event(pod, "Warning", "FailedScheduling", message)

    @staticmethod
    def unfit(node: Stored, spec: dict, wanted: dict[str, int], pods: list[Stored]) -> str | None:
        """Why ``node`` cannot take the pod, in the scheduler's words; None when it can."""
        labels = node.obj["metadata"].get("labels", {})
        if node.obj.get("spec", {}).get("unschedulable"):
            return "node(s) were unschedulable"
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return "node(s) didn't match Pod's node affinity/selector"
        for taint in node.obj.get("spec", {}).get("taints") or []:
            if not tolerates(spec.get("tolerations") or [], [taint]):
                return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
        name = node.obj["metadata"]["name"]
        allocatable = node.obj["status"].get("allocatable", {})
        for resource, count in sorted(wanted.items()):
            used = sum(pod_requests(p.obj["spec"]).get(resource, 0) for p in pods
                       if p.obj["spec"].get("nodeName") == name
                       and p.obj["status"].get("phase") not in ("Succeeded", "Failed"))
            if int(allocatable.get(resource, "0")) - used < count:
                return f"Insufficient {resource}"
        return None

    def list(self, kind: Kind, namespace: str | None, query: dict) -> dict:
        items = []
        for stored in self.store.items(kind, namespace):
            rendered = stored.render()
            if not matches_selector(rendered["metadata"].get("labels", {}), query.get("labelSelector", "")):
                continue
            if not matches_fields(rendered, query.get("fieldSelector", "")):
                continue
            rendered.pop("apiVersion", None)
            rendered.pop("kind", None)
            items.append(rendered)
        return {"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": self.store.version}, "items": items}

    def patch(self, kind: Kind, namespace: str, name: str, headers: dict, body: bytes,
              query: dict) -> tuple[Stored, bool, str]:
        content_type = headers.get("content-type", "").split(";")[0].strip()
        manager = query.get("fieldManager", "")
        try:
            document = yaml.safe_load(body.decode() or "{}")
        except (yaml.YAMLError, UnicodeDecodeError) as error:
            raise ApiFailure(400, "BadRequest", f"error decoding patch: {error}") from error
        if not isinstance(document, dict):
            raise ApiFailure(400, "BadRequest", "the patch is not an object")
        if kind.namespaced and kind.kind != "Namespace" and self.store.get(NAMESPACE, "", namespace) is None:
            raise not_found(NAMESPACE, namespace)
        if content_type == "application/apply-patch+yaml":
            if not manager:
                raise ApiFailure(422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required '
                                 "value: is required for apply patch")
            if document.get("apiVersion") != kind.api_version or document.get("kind") != kind.kind:
                raise ApiFailure(400, "BadRequest", f"the body's apiVersion/kind ({document.get('apiVersion')}/"
                                 f"{document.get('kind')}) does not match {kind.api_version}/{kind.kind} of the URL")
            if (document.get("metadata") or {}).get("name") != name:
                raise ApiFailure(400, "BadRequest", f"the name in the body does not match the URL's {name!r}")
            stored, changed = self.store.apply(kind, namespace, name, document, manager,
                                               query.get("force") in ("true", "1"))
        elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            stored, changed = self.store.merge_patch(kind, namespace, name, document, manager or "unknown")
        else:
            raise ApiFailure(501, "NotImplemented", f"the simulated control plane does not implement "
                             f"{content_type or 'this'} patches")
        if changed and kind.kind in ("Node", "DaemonSet"):
            self.reconcile()
        return stored, changed, manager

    # -- the fleet's nodes ---------------------------------------------------------------------------------

    def sync_nodes(self) -> None:
        fleet_file = self.state_dir / "fleet.json"
        try:
            mtime = fleet_file.stat().st_mtime
        except FileNotFoundError:
            mtime = -1.0
        if mtime == self.fleet_mtime:
            return
        self.fleet_mtime = mtime
        try:
            nodes = json.loads(fleet_file.read_text()).get("nodes", {}) if mtime >= 0 else {}
        except (json.JSONDecodeError, OSError):
            return
        node_kind = NODE
        with self.store.lock:
            for name, entry in nodes.items():
                if self.store.get(node_kind, "", name) is None:
                    self.add_node(name, entry)
            for stored in self.store.items(node_kind):
                if stored.obj["metadata"]["name"] not in nodes:
                    gone = stored.obj["metadata"]["name"]
                    self.store.delete(node_kind, "", gone)
                    self.drop_agent(gone)

    def add_node(self, name: str, entry: dict) -> None:
        cpu = str(os.cpu_count() or 1)
        memory = "0Ki"
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    memory = f"{line.split()[1]}Ki"
        base = {"cpu": cpu, "memory": memory, "pods": "110"}
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}
        stored = self.store.create(NODE, {"metadata": {"name": name}})
        self.store.merge_patch(NODE, "", name, {"metadata": {"labels": labels}}, "kubelet")
        stored.obj["status"] = {
            "capacity": dict(base), "allocatable": dict(base),
            "addresses": [{"type": "InternalIP", "address": entry.get("address", "")},
                          {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status", "lastTransitionTime": now()}],
            "nodeInfo": {"kubeletVersion": SERVER_VERSION["gitVersion"], "kubeProxyVersion": "",
                         "operatingSystem": "linux", "architecture": "amd64",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "kernelVersion": os.uname().release,
                         "containerRuntimeVersion": self.runtime_version(entry.get("runtime", "containerd")),
                         "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
                         "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_URL, name)), "bootID": str(uuid.uuid4())},
        }

    def runtime_version(self, runtime: str) -> str:
        """``containerd://1.6.20~ds1-...`` as the kubelet reports it, from the runtime layer's dpkg status."""
        package = {"containerd": "containerd", "docker": "docker.io"}.get(runtime, runtime)
        status = self.state_dir / "layers" / runtime / "var/lib/dpkg/status"
        version = "unknown"
        if status.exists():
            for block in status.read_text().split("\n\n"):
                if f"Package: {package}\n" in f"{block}\n":
                    version = next((line.split(": ", 1)[1] for line in block.splitlines()
                                    if line.startswith("Version: ")), version)
        return f"{runtime}://{version}"

    def pid1(self, node: str) -> int | None:
        try:
            return node_pid1(self.paths, node)
        except GpunodeError:  # a node that is not running has no agent
            return None

    def drop_agent(self, node: str) -> None:
        link = self.agents.pop(node, None)
        self.reports.pop(node, None)
        if link:
            link.close()

    def on_report(self, node: str, report: dict) -> None:
        with self.store.lock:
            self.reports[node] = report
            self.reconcile()

    # -- controllers ---------------------------------------------------------------------------------------

    def reconcile(self) -> None:
        """One pass of the DaemonSet controller and the kubelets' status updates."""
        with self.store.lock:
            self.daemonsets()
            self.schedule()
            self.kubelets()
            self.daemonset_status()

    def daemonsets(self) -> None:
        nodes = self.store.items(NODE)
        for ds in self.store.items(DAEMONSET):
            meta, spec = ds.obj["metadata"], ds.obj.get("spec", {})
            template = spec.get("template", {})
            revision = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
            pod_spec = template.get("spec", {})
            selector = ",".join(f"{k}={v}" for k, v in (pod_spec.get("nodeSelector") or {}).items())
            tolerations = pod_spec.get("tolerations") or []
            owned = self.owned_pods(ds)
            on_node = {p.obj["spec"]["nodeName"]: p for p in owned}
            # a new pod needs every NoSchedule/NoExecute taint tolerated; a running one is evicted by NoExecute only
            wanted = {n.obj["metadata"]["name"] for n in nodes
                      if matches_selector(n.obj["metadata"].get("labels", {}), selector)
                      and tolerates(tolerations, n.obj.get("spec", {}).get("taints") or [],
                                    ("NoExecute",) if n.obj["metadata"]["name"] in on_node
                                    else ("NoSchedule", "NoExecute"))}
            for node, pod in on_node.items():
                if node not in wanted or pod.obj["metadata"]["labels"].get("controller-revision-hash") != revision:
                    self.store.delete(POD, meta["namespace"], pod.obj["metadata"]["name"])
                    if node in wanted:
                        self.create_pod(ds, template, revision, node)
            for node in sorted(wanted - on_node.keys()):
                self.create_pod(ds, template, revision, node)

    def owned_pods(self, ds: Stored) -> list[Stored]:
        meta = ds.obj["metadata"]
        return [p for p in self.store.items(POD, meta["namespace"])
                if any(o.get("uid") == meta["uid"] for o in p.obj["metadata"].get("ownerReferences", []))]

    def create_pod(self, ds: Stored, template: dict, revision: str, node: str) -> None:
        meta = ds.obj["metadata"]
        suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        labels = {**template.get("metadata", {}).get("labels", {}), "controller-revision-hash": revision,
                  "pod-template-generation": str(meta.get("generation", 1))}
        pod = {"metadata": {"name": f"{meta['name']}-{suffix}", "namespace": meta["namespace"], "labels": labels,
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": meta["name"],
                                                 "uid": meta["uid"], "controller": True}]},
               "spec": {**copy.deepcopy(template.get("spec", {})), "nodeName": node},
               "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}}
        self.store.create(POD, pod)

    def kubelets(self) -> None:
        pods_by_node: dict[str, dict[str, dict]] = {}
        for pod in self.store.items(POD):
            spec = pod.obj["spec"]
            if not spec.get("containers") or not spec.get("nodeName"):
                continue
            plugin = any(o.get("kind") == "DaemonSet" for o in pod.obj["metadata"].get("ownerReferences", []))
            entry = {"role": "plugin" if plugin else "workload", "container": spec["containers"][0]}
            if not plugin:
                runtime_class = self.store.get(RUNTIME_CLASS, "", spec.get("runtimeClassName") or "")
                entry["handler"] = runtime_class.obj.get("handler", "") if runtime_class else ""
            pods_by_node.setdefault(spec["nodeName"], {})[pod.obj["metadata"]["name"]] = entry
        for node in self.store.items(NODE):
            name = node.obj["metadata"]["name"]
            wanted = pods_by_node.get(name, {})
            link = self.agents.get(name)
            if wanted and (link is None or not link.alive()):
                pid1 = self.pid1(name)
                if pid1 is None:
                    continue
                if link:
                    link.close()
                link = self.agents[name] = AgentLink(name, pid1, self.on_report,
                                                     self.state_dir / "run" / f"agent-{name}.log")
            if link:
                link.send(wanted)
            self.node_status(node, self.reports.get(name, {}))
        for pod in self.store.items(POD):
            if not pod.obj["spec"].get("nodeName"):
                continue
            report = self.reports.get(pod.obj["spec"]["nodeName"], {}).get("pods", {})
            state = report.get(pod.obj["metadata"]["name"])
            if state and state.get("workload"):
                self.workload_status(pod, state)
            else:
                self.pod_status(pod, state)

    def node_status(self, node: Stored, report: dict) -> None:
        status = node.obj["status"]
        capacity = {k: v for k, v in status["capacity"].items() if not k.startswith(EXTENDED_PREFIX)}
        allocatable = {k: v for k, v in status["allocatable"].items() if not k.startswith(EXTENDED_PREFIX)}
        for resource, counts in report.get("resources", {}).items():
            capacity[resource] = str(counts["capacity"])
            allocatable[resource] = str(counts["allocatable"])
        if capacity != status["capacity"] or allocatable != status["allocatable"]:
            status["capacity"], status["allocatable"] = capacity, allocatable
            self.store.bump(node)

    def workload_status(self, pod: Stored, state: dict) -> None:
        """A workload pod's status, its log and its kubelet events from the node agent's report."""
        container = pod.obj["spec"]["containers"][0]
        phase = state["phase"]
        if phase == "Running":
            current = {"running": {}}
        elif phase in ("Succeeded", "Failed") and state.get("exit_code") is not None:
            current = {"terminated": {"exitCode": state["exit_code"], "reason": state["reason"]}}
        else:
            current = {"waiting": {"reason": state.get("reason") or "ContainerCreating",
                                   **({"message": state["message"]} if state.get("message") else {})}}
        status = {"phase": phase, "conditions": pod.obj["status"].get("conditions", []),
                  "containerStatuses": [{"name": container["name"], "image": container.get("image", ""),
                                         "imageID": "", "ready": phase == "Running",
                                         "restartCount": 0, "state": current}]}
        if phase == "Failed" and state.get("reason") == "UnexpectedAdmissionError":
            status.update(reason="UnexpectedAdmissionError", message=state["message"])
            status.pop("containerStatuses")
        self.logs[(pod.obj["metadata"]["namespace"], pod.obj["metadata"]["name"])] = state.get("log", "")
        changed = pod.obj["status"] != status
        if state.get("reason") in ("FailedCreatePodSandBox", "UnexpectedAdmissionError"):
            self.event(pod, "Warning", state["reason"], state.get("message", ""), "kubelet")
        if changed:
            pod.obj["status"] = status
            self.store.bump(pod)

    def pod_status(self, pod: Stored, state: dict | None) -> None:
        container = pod.obj["spec"]["containers"][0]["name"]
        if state is not None:
            self.logs[(pod.obj["metadata"]["namespace"], pod.obj["metadata"]["name"])] = state.get("log_tail", "")
        if state is None:
            status = {"phase": "Pending", "containerStatuses": [
                {"name": container, "image": pod.obj["spec"]["containers"][0].get("image", ""), "imageID": "",
                 "ready": False, "restartCount": 0,
                 "state": {"waiting": {"reason": "ContainerCreating"}}}]}
        else:
            if state["running"]:
                current = {"running": {}}
            elif state["waiting"] == "CrashLoopBackOff":
                current = {"waiting": {"reason": "CrashLoopBackOff", "message":
                                       f"back-off restarting failed container={container} "
                                       f"pod={pod.obj['metadata']['name']}"}}
            else:
                current = {"waiting": {"reason": state["waiting"] or "ContainerCreating"}}
            image = pod.obj["spec"]["containers"][0].get("image", "")
            entry = {"name": container, "image": image, "imageID": "", "ready": state["ready"],
                     "restartCount": state["restarts"], "state": current}
            if state["last_exit"] is not None:
                entry["lastState"] = {"terminated": {"exitCode": state["last_exit"], "reason": "Error"}}
            status = {"phase": "Running" if state["running"] or state["restarts"] else "Pending",
                      "containerStatuses": [entry]}
        ready = all(c["ready"] for c in status["containerStatuses"])
        status["conditions"] = [{"type": "PodScheduled", "status": "True"},
                                {"type": "Ready", "status": "True" if ready else "False"}]
        if pod.obj.get("status") != status:
            pod.obj["status"] = status
            self.store.bump(pod)

    def daemonset_status(self) -> None:
        for ds in self.store.items(DAEMONSET):
            meta = ds.obj["metadata"]
            owned = self.owned_pods(ds)
            ready = sum(1 for p in owned if p.obj["status"].get("conditions", [{}])[-1].get("status") == "True")
            generation = str(meta.get("generation", 1))
            updated = sum(1 for p in owned if p.obj["metadata"]["labels"].get("pod-template-generation") == generation)
            status = {"observedGeneration": meta.get("generation", 1), "desiredNumberScheduled": len(owned),
                      "currentNumberScheduled": len(owned), "updatedNumberScheduled": updated, "numberReady": ready,
                      "numberAvailable": ready, "numberMisscheduled": 0}
            if len(owned) - ready:
                status["numberUnavailable"] = len(owned) - ready
            if ds.obj.get("status") != status:
                ds.obj["status"] = status
                self.store.bump(ds)

    def reboots(self) -> None:
        """Carry out reboots the nodes asked for (their ``reboot`` stand-in), one thread each."""
        with self.store.lock:  # the fleet's nodes, as sync_nodes keeps them
            names = [node.obj["metadata"]["name"] for node in self.store.items(NODE)]
        for name in names:
            request = self.paths.node(name) / "data" / "gpunode-sim" / REBOOT_REQUEST
            if request.exists():
                request.unlink(missing_ok=True)
                threading.Thread(target=self.reboot, args=(self.paths, name), daemon=True).start()

    def reboot(self, paths: SimPaths, name: str) -> None:
        time.sleep(1)  # the reboot command returns and the SSH session closes first, as on a real machine
        with self.store.lock:
            self.drop_agent(name)
        try:
            restart_node(paths, name, lambda line: print(line, file=sys.stderr, flush=True))
        except Exception as error:  # noqa: BLE001 - a failed reboot is logged; the node stays down
            print(f"reboot of {name} failed: {error!r}", file=sys.stderr, flush=True)

    def run_controllers(self) -> None:
        while not self.stopping.is_set():
            try:
                self.sync_nodes()
                self.reboots()
                self.reconcile()
            except Exception as error:  # noqa: BLE001 - the control plane keeps serving; the error goes to its log
                print(f"controller error: {error!r}", file=sys.stderr, flush=True)
            self.stopping.wait(0.5)

    def shutdown(self) -> None:
        self.stopping.set()
        for node in list(self.agents):
            self.drop_agent(node)


class Handler(BaseHTTPRequestHandler):
    plane: ControlPlane
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            code, answer = self.plane.handle(self.command, self.path, headers, body)
        except ApiFailure as failure:
            code, answer = failure.code, failure.status()
            if failure.code in (401, 403, 409, 422, 501) or self.command != "GET":
                self.plane.record(self._user(headers), self.command, self.path, failure.code)
        text = isinstance(answer, str)
        payload = answer.encode() if text else json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if text else "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _user(self, headers: dict) -> str:
        token = headers.get("authorization", "").removeprefix("Bearer ").strip()
        return self.plane.tokens.get(token, {}).get("user", "")

    do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _serve  # noqa: N815 - the names http.server calls

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        return


def main(argv: list[str]) -> None:
    state_dir, address, port = Path(argv[0]), argv[1], int(argv[2])
    plane = ControlPlane(state_dir)
    Handler.plane = plane
    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=plane.run_controllers, daemon=True).start()
    def stop(*_: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    (state_dir / "run" / "apiserver.ready").write_text(f"{address}:{port}\n")
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        plane.shutdown()
        (state_dir / "run" / "apiserver.ready").unlink(missing_ok=True)


if __name__ == "__main__":
    import faulthandler

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # stacks into the server's log
    main(sys.argv[1:])
