"""``gpunode doctor``: walk the chain for each node (and a pod) and name the FIRST broken link.

The chain: driver -> toolkit repository -> toolkit -> runtime -> node labels ->
device plugin -> allocatable GPUs -> scheduler -> a container that sees its GPU.
Each node's facts are read once (the verification's reader) and judged step by
step; the first failing step is the node's problem, with its evidence and fix.
Around the nodes: device-plugin pods on CPU nodes (a DaemonSet without the GPU
nodeSelector) and the ``nvidia`` RuntimeClass; with ``--pod``, why that pod is
Pending, cannot start or has no GPU. Read-only: nothing is changed anywhere.

Every link gets one of three states: "ok" with the evidence that proves it
(what was read, and where), a finding (what is wrong, evidence, fix), or "not
checked" with why (an earlier link is broken, or the link does not apply).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.node_v1 import RuntimeClass

from gpunode.cluster.client import ClusterSettings, api_call, get_or_none
from gpunode.cluster.manifests import RUNTIME_CLASS
from gpunode.diagnosis import Finding, Verdict, pods
from gpunode.diagnosis import workloads as workload_diagnosis
from gpunode.errors import GpunodeError
from gpunode.facts import claims, workloads
from gpunode.facts.device_plugin import DAEMONSET
from gpunode.facts.labels import CORDON_REASON
from gpunode.facts.workloads import KINDS as WORKLOAD_KINDS
from gpunode.host_settings import settings_of
from gpunode.verify.checks import CLUSTER_STEPS, CLUSTER_UNREADABLE, STEPS, ClusterView, StepResult
from gpunode.verify.engine import Verification
from gpunode.verify.in_cluster import InClusterVerification
from gpunode.verify.targets import load_inventory


@dataclass(frozen=True)
class Problem:
    """The first broken link found for a node (or the cluster, or a pod): whose, and the finding."""

    subject: str
    finding: Finding

    def as_json(self) -> dict:
        f = self.finding
        return {"subject": self.subject, "link": f.step, "what": f.what, "evidence": list(f.evidence), "fix": f.fix,
                "code": f.code}


@dataclass(frozen=True)
class Link:
    """One link of a subject's chain as doctor saw it: ok (with proof), a finding, or not checked (with why)."""

    name: str
    state: Verdict  # ok (with its proof), a finding, or not checked (with why)
    what: str
    evidence: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"link": self.name, "state": str(self.state), "what": self.what, "evidence": list(self.evidence)}


def link_of(finding: Finding, name: str | None = None) -> Link:
    return Link(name or finding.step, finding.state, finding.what, list(finding.evidence))


@dataclass
class DoctorReport:
    nodes: dict[str, str] = field(default_factory=dict)  # node -> "ok ..." summary
    problems: list[Problem] = field(default_factory=list)
    links: dict[str, list[Link]] = field(default_factory=dict)  # subject -> every link, in chain order

    def as_json(self) -> dict:
        return {"nodes": self.nodes, "problems": [p.as_json() for p in self.problems],
                "links": {subject: [link.as_json() for link in links] for subject, links in self.links.items()}}


def first_broken(host: str, verification: Verification) -> Problem | None:
    if host in verification.errors:
        return Problem(host, verification.errors[host])
    for step in STEPS:
        result = verification.result(host, step)
        if result.state is Verdict.FINDING and not cluster_unreadable(result):  # that one is the cluster's, named once
            finding = next((f for f in result.findings if f.state is Verdict.FINDING), None)
            return Problem(host, finding or Finding(step, Verdict.FINDING, result.reason))
    return None


def cluster_unreadable(result: StepResult) -> Finding | None:
    """The finding of a cluster step that could not read the API at all (down, credentials, RBAC), if it is one."""
    return next((f for f in result.findings if f.code == CLUSTER_UNREADABLE), None)


def host_links(host: str, verification: Verification) -> list[Link]:
    """Each step's verdict for ``host`` as a link: its proof, its first failure, or why it was not checked."""
    if host in verification.errors:
        error = verification.errors[host]
        return [Link(error.step, Verdict.FINDING, error.what, list(error.evidence)),
                *(Link(step, Verdict.NOT_CHECKED, "the host could not be read") for step in STEPS)]
    links = []
    for step in STEPS:
        result = verification.result(host, step)
        if result.state is Verdict.OK:  # with its warnings (findings that do not break it), each with its evidence
            warned = [f for f in result.findings if f.state is Verdict.FINDING and not f.breaks]
            links.append(Link(step, Verdict.OK, result.reason, result.proof + [
                f"warning: {f.what} ({'; '.join(f.evidence)}; fix: {f.fix})" for f in warned]))
        elif cluster_unreadable(result):
            links.append(Link(step, Verdict.NOT_CHECKED, f"the Kubernetes API could not be read: {result.reason}"))
        elif result.state is Verdict.FINDING:
            first = result.findings[0] if result.findings else None
            links.append(Link(step, Verdict.FINDING, result.reason, list(first.evidence) if first else []))
        else:
            evidence = [line for f in result.findings for line in f.evidence]
            links.append(Link(step, Verdict.NOT_CHECKED, result.reason, evidence))
    return links


def cpu_node_plugin(host: str, settings: ClusterSettings, namespace: str, node_name: str,
                    cluster: ClusterView) -> Problem | Link:
    """A device-plugin pod on a CPU node: the DaemonSet lost its GPU nodeSelector (runbook failure 4)."""
    pod = cluster.plugin_pod(settings, namespace, node_name)
    if not pod.exists:
        return Link("no plugin on a CPU node", Verdict.OK, f"no device-plugin pod runs on the CPU node {node_name}",
                    [f"kubectl -n {namespace} get pods -l app.kubernetes.io/name={DAEMONSET} "
                     f"--field-selector spec.nodeName={node_name}: none"])
    return Problem(host, Finding(
        "device_plugin", Verdict.FINDING, f"a device-plugin pod runs on the CPU node {node_name}"
        + (" and crash-loops (no GPU, no NVML)" if pod.waiting == "CrashLoopBackOff" else "")
        + (" and cannot start (the runtime refuses its sandbox)"
           if any(w.startswith("FailedCreatePodSandBox") for w in pod.warnings) else ""),
        [f"pod {namespace}/{pod.name}: {pod.phase}{', ' + pod.waiting if pod.waiting else ''}, "
         f"restarts={pod.restarts}", *[f"log: {line}" for line in pod.log_tail if line.strip()],
         *[f"event {line}" for line in pod.warnings]],
        "the DaemonSet must select nvidia.com/gpu.present=true nodes only: re-run deploys/device_plugin.py "
        "(gpunode's manifest has that nodeSelector)", "plugin-on-cpu-node"))


def runtime_class_problem(settings: ClusterSettings) -> Problem | Link:
    found = api_call(settings, "read runtimeclass nvidia",
                     lambda client: get_or_none(client, RuntimeClass, RUNTIME_CLASS))
    if found is not None and found.handler != RUNTIME_CLASS:
        return Problem("cluster", Finding(
            "device_plugin", Verdict.FINDING,
            f'the RuntimeClass "{RUNTIME_CLASS}" names the handler {found.handler!r}, '
            f'but gpunode configures the runtime as "{RUNTIME_CLASS}": its pods cannot start',
            [f"kubectl get runtimeclass {RUNTIME_CLASS}: handler {found.handler}"],
            "re-run deploys/device_plugin.py (it applies the RuntimeClass with handler nvidia)",
            "runtimeclass-handler-wrong"))
    if found is not None:
        return Link("runtimeclass", Verdict.OK, f'the RuntimeClass "{RUNTIME_CLASS}" exists',
                    [f"kubectl get runtimeclass {RUNTIME_CLASS}: handler {found.handler}"])
    return Problem("cluster", Finding(
        "device_plugin", Verdict.FINDING, 'the RuntimeClass "nvidia" does not exist: pods with runtimeClassName: '
        "nvidia are rejected and pods without it get no GPU (nvidia is not the default runtime)",
        [f"kubectl get runtimeclass {RUNTIME_CLASS}: NotFound"],
        "re-run deploys/device_plugin.py (it applies the RuntimeClass), or set nvidia_runtime_default = True and "
        "re-run deploys/runtime.py", "runtimeclass-missing"))


def container_views(pod: Pod) -> tuple[pods.ContainerView, ...]:
    views = []
    for status in (pod.status.containerStatuses or []) if pod.status else []:
        state = status.state
        if state and state.running:
            views.append(pods.ContainerView(status.name, "running", ready=bool(status.ready),
                                            restarts=status.restartCount or 0))
        elif state and state.terminated:
            done = state.terminated
            views.append(pods.ContainerView(status.name, "terminated", done.reason or "", done.message or "",
                                            done.exitCode, bool(status.ready), status.restartCount or 0))
        elif state and state.waiting:
            views.append(pods.ContainerView(status.name, "waiting", state.waiting.reason or "",
                                            state.waiting.message or "", None, False, status.restartCount or 0))
        else:
            views.append(pods.ContainerView(status.name, "", restarts=status.restartCount or 0))
    return tuple(views)


def event_moment(event: Event) -> int:
    stamp = event.lastTimestamp or event.eventTime or event.firstTimestamp
    return int(stamp.timestamp()) if stamp else 0  # whole seconds, as most events carry; ties keep the API order


def pod_findings(reference: str, settings: ClusterSettings, verification: Verification) -> list[Finding]:
    """The pod's first broken link, or the proof of each link it passed (and what could not be checked).

    ``reference`` is NAMESPACE/NAME (a pod, else a workload of that name) or NAMESPACE/KIND/NAME (a workload):
    a workload's most troubled pod is diagnosed, and a workload without pods gets its controller's refusal."""
    parts = reference.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise GpunodeError(f"--pod {reference!r} is not NAMESPACE/NAME or NAMESPACE/KIND/NAME",
                           "write it like default/trainer-0 or ml/deployment/trainer")
    namespace, name = parts[0], parts[-1]
    kind = workloads.kind_of(parts[1]) if len(parts) == 3 else None
    if len(parts) == 3 and kind is None:
        raise GpunodeError(f"--pod {reference!r}: {parts[1]!r} is not a workload kind",
                           f"use one of {', '.join(k.lower() for k in WORKLOAD_KINDS)}")

    def find(client):
        pod = get_or_none(client, Pod, name, namespace) if kind is None else None
        if pod is not None:
            return name, None
        found = workloads.find(client, namespace, name, kind)
        if found is None:
            return None
        view, owned = workloads.read(client, namespace, *found)
        return (pick(owned).metadata.name if owned else None), (view, len(owned))

    located = api_call(settings, f"read pod or workload {reference}", find)
    if located is None:
        raise GpunodeError(f'no pod or workload named "{name}" in namespace {namespace}' if kind is None else
                           f'{kind.lower()} "{name}" not found in namespace {namespace}',
                           f"kubectl -n {namespace} get pods,deployments,statefulsets,jobs lists them "
                           "(--pod NAMESPACE/KIND/NAME names a workload)")
    pod_name, workload = located
    if pod_name is None:
        return workload_diagnosis.diagnose(workload[0])
    findings = one_pod_findings(namespace, pod_name, settings, verification)
    if workload is None:
        return findings
    view, count = workload
    line = f"{view.title}: diagnosing its pod {namespace}/{pod_name} ({count} pod(s))"
    return [replace(f, evidence=[line, *f.evidence]) for f in findings]


def pick(owned: list) -> object:
    """The pod that tells most: the first not running and ready (nor done), else the oldest."""
    def healthy(pod) -> bool:
        phase = pod.status.phase if pod.status else ""
        return phase == "Succeeded" or (phase == "Running" and all(
            c.ready for c in (pod.status.containerStatuses or [])))
    return next((p for p in owned if not healthy(p)), owned[0])


def one_pod_findings(namespace: str, name: str, settings: ClusterSettings,
                     verification: Verification) -> list[Finding]:
    def read(client):
        pod = get_or_none(client, Pod, name, namespace)
        if pod is None:
            return None
        events = [(e.reason or "", e.message or "") for e in sorted(
            client.list(Event, namespace=namespace, fields={"involvedObject.name": name}),
            key=event_moment)]
        started = any(v.state in ("running", "terminated") for v in container_views(pod))
        log = "".join(client.log(name, namespace=namespace)) if started else ""
        nodes = list(client.list(Node))
        everyone = [(p.metadata.namespace, p.metadata.name, p.status.phase if p.status else "", p.spec.to_dict())
                    for p in client.list(Pod, namespace="*")]
        return pod, events, log, nodes, everyone, claims.read(client, namespace, pod.to_dict())

    found = api_call(settings, f"read pod {namespace}/{name}", read)
    if found is None:
        raise GpunodeError(f'pods "{name}" not found in namespace {namespace}', "kubectl get pods -A lists them")
    pod, events, log, nodes, everyone, dra = found
    containers = container_views(pod)
    waiting = next((c for c in containers if c.state == "waiting"), None)
    view = pods.PodView(namespace, name, pod.status.phase or "", pod.spec.to_dict(), events, log,
                        waiting.reason if waiting else "", waiting.message if waiting else "",
                        pod.status.reason or "", pod.status.message or "", containers, dra)
    node_views = [pods.NodeView(n.metadata.name, dict(n.metadata.labels or {}),
                                int((n.status.allocatable or {}).get(pods.GPU, "0")),
                                nvidia_default_of(n.metadata.name, verification),
                                bool(n.spec and n.spec.unschedulable),
                                (n.metadata.annotations or {}).get(CORDON_REASON, ""),
                                tuple(t.to_dict() for t in (n.spec.taints or [] if n.spec else []))) for n in nodes]
    return pods.diagnose(view, node_views, everyone)


def nvidia_default_of(node: str, verification: Verification) -> bool | None:
    """Whether nvidia is the default runtime on ``node`` (known when its runtime step passed), else None."""
    for host, target in verification.targets.items():
        facts = verification.facts.get(host, {})
        if (facts.get("hostname") or host) == node and host in verification.verdicts:
            if verification.result(host, "runtime").state is Verdict.OK:
                return settings_of(target).node.nvidia_runtime_default
    return None


def unreadable_finding(error: GpunodeError) -> Finding:
    return Finding("api", Verdict.FINDING, error.problem, [], error.fix or "", CLUSTER_UNREADABLE)


def examine(inventory: str, limit: list[str] | None = None, data: dict[str, str] | None = None,
            node: str | None = None, pod: str | None = None, in_cluster: bool = False) -> DoctorReport:
    targets = load_inventory(inventory, limit or None, data)
    if node:
        targets = [t for t in targets if t.name == node]
        if not targets:
            raise GpunodeError(f"no host {node!r} in {inventory}", "use a host name of the inventory")
    verification = (InClusterVerification if in_cluster else Verification)(targets)
    verification.read_all()
    report = DoctorReport()
    cluster: ClusterSettings | None = None
    cluster_error: Finding | None = None  # the API could not be read: one problem, the nodes still checked
    needs_runtime_class = False
    for host, target in verification.targets.items():
        problem = first_broken(host, verification)
        links = host_links(host, verification)
        parsed = settings_of(target)
        settings = parsed.cluster
        facts = verification.facts.get(host, {})
        unreadable = next(filter(None, (cluster_unreadable(verification.result(host, step))
                                        for step in CLUSTER_STEPS)), None) if host in verification.verdicts else None
        if unreadable is not None:
            cluster_error = cluster_error or unreadable
        elif (problem is None and settings.cluster_steps
              and verification.result(host, "driver").state is Verdict.NOT_CHECKED):
            try:
                checked = cpu_node_plugin(host, settings, parsed.manifests.namespace, settings.k8s_node_name
                                          or facts.get("hostname") or host, verification.cluster)
            except GpunodeError as error:
                cluster_error = cluster_error or unreadable_finding(error)
                checked = Link("no plugin on a CPU node", Verdict.NOT_CHECKED, f"the Kubernetes API could not be read: "
                               f"{error.problem}")
            if isinstance(checked, Link):
                links.append(checked)
            else:
                problem = checked
                links.append(link_of(checked.finding, "no plugin on a CPU node"))
        report.links[host] = links
        if problem:
            report.problems.append(problem)
            report.nodes[host] = f"BROKEN at {problem.finding.step}"
        else:
            gpu = verification.result(host, "driver").state is Verdict.OK
            unchecked = [link.name for link in links if link.state is Verdict.NOT_CHECKED]
            report.nodes[host] = ("ok: every link from the driver to allocatable GPUs holds" if gpu else
                                  "ok: CPU-only (no GPU labels, no device plugin)") + (
                f"; not checked: {', '.join(unchecked)}" if gpu and unchecked else "")
        if settings.cluster_steps:
            cluster = cluster or settings
            needs_runtime_class |= not parsed.node.nvidia_runtime_default
    if cluster_error is not None:
        report.problems.append(Problem("cluster", cluster_error))
        report.links["cluster"] = [link_of(cluster_error, "api")]
    elif cluster is not None and needs_runtime_class:
        try:
            checked: Problem | Link = runtime_class_problem(cluster)
        except GpunodeError as error:
            checked = Problem("cluster", unreadable_finding(error))
        if isinstance(checked, Link):
            report.links["cluster"] = [checked]
        else:
            report.problems.append(checked)
            report.links["cluster"] = [link_of(checked.finding, "api" if checked.finding.code == CLUSTER_UNREADABLE
                                               else "runtimeclass")]
    if pod:
        if cluster is None:
            raise GpunodeError("--pod needs the cluster, and every host has cluster_steps = False")
        subject = f"pod {pod}"
        findings = pod_findings(pod, cluster, verification)
        report.links[subject] = [link_of(f) for f in findings]
        broken = [f for f in findings if f.state is Verdict.FINDING]
        if broken:
            report.problems.append(Problem(subject, broken[0]))
        else:
            report.nodes[subject] = "; ".join(f"{'ok' if f.state is Verdict.OK else 'not checked'}: {f.what}"
                                              for f in findings)
    verification.close()
    return report


def render(report: DoctorReport) -> str:
    """Per subject: its summary, then each link with its state and the evidence; then the problems."""
    lines = []
    for subject in dict.fromkeys([*report.nodes, *report.links]):
        lines.append(f"{subject:<12} {report.nodes.get(subject, '')}".rstrip())
        for link in report.links.get(subject, []):
            lines.append(f"  {link.name:<24} {link.state:<12} {link.what}")
            lines += [f"  {'':<24} {'':<12}   {line}" for line in link.evidence]
    for problem in report.problems:
        lines.append("")
        lines.append(f"{problem.subject}: {problem.finding.step}: {problem.finding}")
    lines.append("")
    lines.append("nothing is broken" if not report.problems else
                 f"{len(report.problems)} broken link(s): fix the first one of each node first")
    return "\n".join(lines)
