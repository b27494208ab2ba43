"""``gpunode doctor``: walk the chain for each node (and a pod) and name the FIRST broken link.

The chain: driver -> toolkit repository -> toolkit -> runtime -> node labels ->
device plugin -> allocatable GPUs -> scheduler -> a container that sees its GPU.
Each node's facts are read once (the verification's reader) and judged step by
step; the first failing step is the node's problem, with its evidence and fix.
Around the nodes: device-plugin pods on CPU nodes (a DaemonSet without the GPU
nodeSelector) and the ``nvidia`` RuntimeClass; with ``--pod``, why that pod is
Pending, cannot start or has no GPU. Read-only: nothing is changed anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.node_v1 import RuntimeClass

from gpunode.cluster.client import ClusterSettings, api_call, get_or_none
from gpunode.cluster.manifests import ManifestSettings
from gpunode.diagnosis import Finding, Severity, pods
from gpunode.errors import GpunodeError
from gpunode.facts.device_plugin import read_plugin_pod
from gpunode.settings import NodeSettings
from gpunode.verify.checks import STEPS
from gpunode.verify.plugin import Verification
from gpunode.verify.targets import load_inventory

RUNTIME_CLASS = "nvidia"


@dataclass(frozen=True)
class Problem:
    """The first broken link found for a node (or the cluster, or a pod): whose, and the finding."""

    subject: str
    finding: Finding

    def as_json(self) -> dict:
        f = self.finding
        return {"subject": self.subject, "link": f.step, "what": f.what, "evidence": list(f.evidence), "fix": f.fix,
                "code": f.code}


@dataclass
class DoctorReport:
    nodes: dict[str, str] = field(default_factory=dict)  # node -> "ok ..." summary
    problems: list[Problem] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"nodes": self.nodes, "problems": [p.as_json() for p in self.problems]}


def first_broken(host: str, verification: Verification) -> Problem | None:
    if host in verification.errors:
        return Problem(host, Finding("connection", Severity.FAIL, verification.errors[host],
                                     fix="check SSH access to the host", code="unreachable"))
    for step in STEPS:
        result = verification.result(host, step)
        if result.outcome == "fail":
            finding = next((f for f in result.findings if f.severity is Severity.FAIL), None)
            return Problem(host, finding or Finding(step, Severity.FAIL, result.reason))
    return None


def cpu_node_plugin(host: str, settings: ClusterSettings, data: dict, node_name: str) -> Problem | None:
    """A device-plugin pod on a CPU node: the DaemonSet lost its GPU nodeSelector (runbook failure 4)."""
    namespace = ManifestSettings.from_data(data).namespace
    pod = read_plugin_pod(settings, namespace, node_name)
    if not pod.exists:
        return None
    return Problem(host, Finding(
        "device_plugin", Severity.FAIL, f"a device-plugin pod runs on the CPU node {node_name}"
        + (" and crash-loops (no GPU, no NVML)" if pod.waiting == "CrashLoopBackOff" else "")
        + (" and cannot start (the runtime refuses its sandbox)"
           if any(w.startswith("FailedCreatePodSandBox") for w in pod.warnings) else ""),
        [f"pod {namespace}/{pod.name}: {pod.phase}{', ' + pod.waiting if pod.waiting else ''}, "
         f"restarts={pod.restarts}", *[f"log: {line}" for line in pod.log_tail if line.strip()],
         *[f"event {line}" for line in pod.warnings]],
        "the DaemonSet must select nvidia.com/gpu.present=true nodes only: re-run deploys/device_plugin.py "
        "(gpunode's manifest has that nodeSelector)", "plugin-on-cpu-node"))


def runtime_class_problem(settings: ClusterSettings) -> Problem | None:
    found = api_call(settings, "read runtimeclass nvidia",
                     lambda client: get_or_none(client, RuntimeClass, RUNTIME_CLASS))
    if found is not None:
        return None
    return Problem("cluster", Finding(
        "device_plugin", Severity.FAIL, 'the RuntimeClass "nvidia" does not exist: pods with runtimeClassName: '
        "nvidia are rejected and pods without it get no GPU (nvidia is not the default runtime)",
        ["kubectl get runtimeclass nvidia: NotFound"],
        "re-run deploys/device_plugin.py (it applies the RuntimeClass), or set nvidia_runtime_default = True and "
        "re-run deploys/runtime.py", "runtimeclass-missing"))


def pod_problem(reference: str, settings: ClusterSettings, verification: Verification) -> Problem | None:
    namespace, _, name = reference.partition("/")
    if not name:
        raise GpunodeError(f"--pod {reference!r} is not NAMESPACE/NAME", "write it like default/trainer-0")

    def read(client):
        pod = get_or_none(client, Pod, name, namespace)
        if pod is None:
            return None
        events = [(e.reason or "", e.message or "") for e in client.list(
            Event, namespace=namespace, fields={"involvedObject.name": name})]
        log = "" if pod.status.phase == "Pending" else "".join(client.log(name, namespace=namespace))
        nodes = list(client.list(Node))
        everyone = [(p.metadata.namespace, p.metadata.name, p.status.phase if p.status else "", p.spec.to_dict())
                    for p in client.list(Pod, namespace="*")]
        return pod, events, log, nodes, everyone

    found = api_call(settings, f"read pod {reference}", read)
    if found is None:
        raise GpunodeError(f'pods "{name}" not found in namespace {namespace}', "kubectl get pods -A lists them")
    pod, events, log, nodes, everyone = found
    statuses = pod.status.containerStatuses or []
    waiting = statuses[0].state.waiting if statuses and statuses[0].state else None
    view = pods.PodView(namespace, name, pod.status.phase or "", pod.spec.to_dict(), events, log,
                        waiting.reason if waiting else "", (waiting.message or "") if waiting else "")
    node_views = [pods.NodeView(n.metadata.name, dict(n.metadata.labels or {}),
                                int((n.status.allocatable or {}).get(pods.GPU, "0")),
                                nvidia_default_of(n.metadata.name, verification)) for n in nodes]
    findings = pods.diagnose(view, node_views, everyone)
    return Problem(f"pod {reference}", findings[0]) if findings else None


def nvidia_default_of(node: str, verification: Verification) -> bool | None:
    """Whether nvidia is the default runtime on ``node`` (known when its runtime step passed), else None."""
    for host, target in verification.targets.items():
        facts = verification.facts.get(host, {})
        if (facts.get("hostname") or host) == node and host in verification.verdicts:
            if verification.result(host, "runtime").outcome == "pass":
                return NodeSettings.from_data(target.data).nvidia_runtime_default
    return None


def examine(inventory: str, limit: list[str] | None = None, data: dict[str, str] | None = None,
            node: str | None = None, pod: str | None = None) -> DoctorReport:
    targets = load_inventory(inventory, limit or None, data)
    if node:
        targets = [t for t in targets if t.name == node]
        if not targets:
            raise GpunodeError(f"no host {node!r} in {inventory}", "use a host name of the inventory")
    verification = Verification(targets)
    verification.read_all()
    report = DoctorReport()
    cluster: ClusterSettings | None = None
    needs_runtime_class = False
    for host, target in verification.targets.items():
        problem = first_broken(host, verification)
        settings = ClusterSettings.from_data(target.data)
        facts = verification.facts.get(host, {})
        if problem is None and settings.cluster_steps and verification.result(host, "driver").outcome == "skip":
            problem = cpu_node_plugin(host, settings, target.data, settings.k8s_node_name or facts.get("hostname")
                                      or host)
        if problem:
            report.problems.append(problem)
            report.nodes[host] = f"BROKEN at {problem.finding.step}"
        else:
            gpu = verification.result(host, "driver").outcome == "pass"
            report.nodes[host] = "ok: every link from the driver to allocatable GPUs holds" if gpu else \
                "ok: CPU-only (no GPU labels, no device plugin)"
        if settings.cluster_steps:
            cluster = cluster or settings
            needs_runtime_class |= not NodeSettings.from_data(target.data).nvidia_runtime_default
    if cluster is not None and needs_runtime_class:
        problem = runtime_class_problem(cluster)
        if problem:
            report.problems.append(problem)
    if pod:
        if cluster is None:
            raise GpunodeError("--pod needs the cluster, and every host has cluster_steps = False")
        problem = pod_problem(pod, cluster, verification)
        if problem:
            report.problems.append(problem)
        else:
            report.nodes[f"pod {pod}"] = "ok: scheduled, started, and its container saw its GPUs"
    verification.connections.close()
    return report


def render(report: DoctorReport) -> str:
    lines = [f"{subject:<12} {summary}" for subject, summary in report.nodes.items()]
    for problem in report.problems:
        lines.append("")
        lines.append(f"{problem.subject}: {problem.finding.step}: {problem.finding}")
    lines.append("")
    lines.append("nothing is broken" if not report.problems else
                 f"{len(report.problems)} broken link(s): fix the first one of each node first")
    return "\n".join(lines)
