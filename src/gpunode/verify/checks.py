"""Reading every step's facts from a host in one command, and judging each step from them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from lightkube.resources.core_v1 import Pod

from gpunode import chain
from gpunode.cluster.client import ClusterSettings
from gpunode.cluster.labels import PLUGIN_LABEL, gpu_labels
from gpunode.cluster.plugin_config import GPU_RESOURCE, expected_offer
from gpunode.diagnosis import Finding, Verdict, device_plugin, failures, labels
from gpunode.diagnosis.device_plugin import DRA_DRIVER
from gpunode.errors import GpunodeError
from gpunode.facts.claims import read_offered
from gpunode.facts.coexistence import ForeignDaemonSet, read_foreign, registrar_on
from gpunode.facts.device_plugin import (
    PluginPodState,
    RolloutState,
    being_deleted,
    plugin_pod_state,
    read_plugin_pods,
    read_rollout,
)
from gpunode.facts.labels import NodeLabelsState, read_nodes
from gpunode.facts.node_events import read_node_warnings
from gpunode.host_settings import HostSettings

NODE_STEPS, CLUSTER_STEPS, STEPS = chain.NODE_STEPS, chain.CLUSTER_STEPS, chain.NAMES
DIAGNOSES = {step.name: chain.load(step.diagnose) for step in chain.STEPS if step.diagnose}


@dataclass
class StepResult:
    """The verdict on one step of one host."""

    host: str
    step: str
    state: Verdict  # ok (with proof), a finding, or not checked (and why)
    reason: str = ""
    findings: list[Finding] = field(default_factory=list)

    @property
    def proof(self) -> list[str]:
        """What was read that shows the step holds (empty unless it passed)."""
        return [line for f in self.findings if f.state is Verdict.OK for line in f.evidence]

    def as_json(self) -> dict:
        """The result as verify's JSON report has it (findings: every one that is not a proof)."""
        return {"state": str(self.state), "reason": self.reason, "proof": self.proof,
                "findings": [{"state": str(f.state), "breaks": f.breaks, "what": f.what, "evidence": f.evidence,
                              "fix": f.fix, "code": f.code} for f in self.findings if f.state is not Verdict.OK]}

    @classmethod
    def from_json(cls, host: str, step: str, data: dict) -> StepResult:
        """The result :meth:`as_json` wrote (the node checker's record); the proof comes back as one ok finding."""
        findings = [Finding(step, Verdict(f["state"]), f["what"], list(f.get("evidence") or []), f.get("fix") or "",
                            f.get("code") or "", bool(f.get("breaks", True))) for f in data.get("findings") or []]
        state = Verdict(data["state"])
        if data.get("proof"):
            findings.append(Finding(step, Verdict.OK, data.get("reason") or "", list(data["proof"]), code="ok"))
        return cls(host, step, state, data.get("reason") or "", findings)


def verdict(host: str, step: str, findings: list[Finding]) -> StepResult:
    """A finding when one breaks the step; not checked when it does not apply; ok only with a proof (positive
    evidence)."""
    failed = failures(findings)
    skipped = [f for f in findings if f.state is Verdict.NOT_CHECKED]
    if failed:
        return StepResult(host, step, Verdict.FINDING, failed[0].what, failed)
    if skipped:
        return StepResult(host, step, Verdict.NOT_CHECKED, skipped[0].what, skipped)
    proofs = [f for f in findings if f.state is Verdict.OK]
    if not proofs:
        return StepResult(host, step, Verdict.NOT_CHECKED,
                          "not checked: the diagnosis read nothing that proves this step",
                          findings)
    return StepResult(host, step, Verdict.OK, proofs[0].what, findings)


CLUSTER_UNREADABLE = "cluster-unreadable"  # the code of a cluster step that could not read the API


class ClusterView:
    """The cluster as the verification reads it: the rollout once per namespace, nodes and pods per host."""

    def __init__(self) -> None:
        self.rollouts: dict[tuple[str, str, str], RolloutState] = {}
        self.nodes: dict[tuple[str, str], dict[str, NodeLabelsState]] = {}
        self.plugin_pods: dict[tuple[str, str, str], dict[str, Pod]] = {}
        self.foreign_lists: dict[tuple[str, str], list[ForeignDaemonSet]] = {}
        self.warnings: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
        self.slices: dict[tuple[str, str], dict[str, dict[str, list[str]]] | GpunodeError] = {}
        self.lock = threading.Lock()  # hosts are judged in parallel: each list is read once

    def rollout(self, settings: ClusterSettings, namespace: str) -> RolloutState:
        key = (str(settings.kubeconfig_path), settings.kube_context, namespace)
        with self.lock:
            if key not in self.rollouts:
                self.rollouts[key] = read_rollout(settings, namespace)
            return self.rollouts[key]

    def node(self, settings: ClusterSettings, name: str) -> NodeLabelsState:
        """The Node from one list of the cluster's Nodes per verification (not a read per host)."""
        key = (str(settings.kubeconfig_path), settings.kube_context)
        with self.lock:
            if key not in self.nodes:
                self.nodes[key] = read_nodes(settings)
            return self.nodes[key].get(name) or NodeLabelsState(name, exists=False)

    def foreign(self, settings: ClusterSettings) -> list[ForeignDaemonSet]:
        """NVIDIA's device plugin and GFD DaemonSets, from one list per verification."""
        key = (str(settings.kubeconfig_path), settings.kube_context)
        with self.lock:
            if key not in self.foreign_lists:
                self.foreign_lists[key] = read_foreign(settings)
            return self.foreign_lists[key]

    def slice_list(self, settings: ClusterSettings) -> dict[str, dict[str, list[str]]] | GpunodeError:
        """Each node's ResourceSlice devices per DRA driver, from one list per verification, or why they could
        not be read."""
        key = (str(settings.kubeconfig_path), settings.kube_context)
        with self.lock:
            if key not in self.slices:
                try:
                    self.slices[key] = read_offered(settings)
                except GpunodeError as error:
                    self.slices[key] = error
            return self.slices[key]

    def offered(self, settings: ClusterSettings) -> dict[str, dict[str, list[str]]]:
        """The slices' offer, empty where they cannot be read (no DRA API: the check of a node offered twice only
        adds a finding, it never needs one)."""
        listed = self.slice_list(settings)
        return {} if isinstance(listed, GpunodeError) else listed

    def dra_devices(self, settings: ClusterSettings, node: str) -> list[str] | None:
        """The devices gpunode's DRA driver publishes for ``node``, from the one list of slices (None: this view
        does not read ResourceSlices); a DRA node's proof, so a list the API refused raises its GpunodeError (never
        read as "no devices")."""
        listed = self.slice_list(settings)
        if isinstance(listed, GpunodeError):
            raise listed
        return sorted(entry.split("/", 1)[-1] for entry in listed.get(node, {}).get(DRA_DRIVER, []))

    def node_warnings(self, settings: ClusterSettings, name: str) -> tuple[str, ...]:
        """The node's recent Warning events, from one list per verification, read only once a link fails."""
        key = (str(settings.kubeconfig_path), settings.kube_context)
        with self.lock:
            if key not in self.warnings:
                self.warnings[key] = read_node_warnings(settings)
            return self.warnings[key].get(name, ())

    def plugin_pod(self, settings: ClusterSettings, namespace: str, node: str,
                   read_log: bool = False) -> PluginPodState:
        """The node's plugin pod from one list of the plugin's pods per verification (its log read where the node
        offers fewer GPUs than it should, or the pod is not ready)."""
        key = (str(settings.kubeconfig_path), settings.kube_context, namespace)
        with self.lock:
            if key not in self.plugin_pods:
                self.plugin_pods[key] = read_plugin_pods(settings, namespace)
            pod = self.plugin_pods[key].get(node)
        # a pod being deleted (a taint evicting it, no successor yet) is not the node's plugin at this moment
        return plugin_pod_state(settings, namespace, node, None if being_deleted(pod) else pod, read_log)

    def judge(self, host: str, parsed: HostSettings, facts: dict[str, dict], gpu_ok: bool) -> dict[str, StepResult]:
        """Verdicts of the cluster steps for one host; skipped where cluster_steps is False."""
        settings = parsed.cluster
        if not settings.cluster_steps:
            return {step: StepResult(host, step, Verdict.NOT_CHECKED,
                                     "cluster_steps = False") for step in CLUSTER_STEPS}
        gpus = ((facts.get("driver") or {}).get("nvidia_smi") or {}).get("gpus") or [] if gpu_ok else []
        desired = gpu_labels(gpus, parsed.labels).labels
        name = settings.k8s_node_name or facts.get("hostname") or host
        results: dict[str, StepResult] = {}
        try:
            node = self.node(settings, name)
            registrar = registrar_on(self.foreign(settings), name) if desired else None
            kept = registrar is not None and node.labels.get(PLUGIN_LABEL) != "true"
            if kept:  # NVIDIA's plugin serves the node and gpunode rightly left it alone: its labels only
                desired = {key: value for key, value in desired.items() if key != PLUGIN_LABEL}
            results["labels"] = verdict(host, "labels", labels.diagnose(node, desired))
            if registrar is not None and kept:
                results["device_plugin"] = StepResult(
                    host, "device_plugin", Verdict.NOT_CHECKED,
                    f"not checked: node {name} is served by NVIDIA's device plugin {registrar.reference} (pod "
                    f"{registrar.pods[name]}), not gpunode's: 'gpunode migrate INVENTORY --limit {host}' moves it")
                return results
            if not desired:
                results["device_plugin"] = StepResult(host, "device_plugin", Verdict.NOT_CHECKED,
                                                      "no working GPU on this host")
                return results
            if not node.exists:
                results["device_plugin"] = StepResult(host, "device_plugin", Verdict.NOT_CHECKED,
                                                      f"no Node named {name}")
                return results
            manifests = parsed.manifests
            namespace = manifests.namespace
            if parsed.labels.allocation == "dra":
                results["device_plugin"] = self.judge_dra(host, parsed, node, gpus)
                return results
            offer = expected_offer(gpus, manifests.mig_strategy, manifests.plugin_config)
            short = offer.count is not None and device_plugin.allocatable_of(node, offer.resource) < offer.count
            findings = device_plugin.diagnose(self.rollout(settings, namespace),
                                              self.plugin_pod(settings, namespace, name, read_log=short), node, offer,
                                              namespace)
            if registrar is not None:
                findings = [device_plugin.two_registrars(name, registrar.reference, registrar.pods[name], namespace),
                            *findings]
            twice = device_plugin.offered_twice(node, offer.resource, self.offered(settings).get(name, {}))
            if twice is not None:
                findings = [twice, *findings]
            clash = device_plugin.exclusive_time_slicing(name, (facts.get("driver") or {}).get("health") or [],
                                                         manifests.plugin_config)
            if clash is not None:
                findings = [clash, *findings]
            if any(f.state is Verdict.FINDING for f in findings):
                findings = device_plugin.with_node_warnings(findings, name, self.node_warnings(settings, name))
            results["device_plugin"] = verdict(host, "device_plugin", findings)
        except GpunodeError as error:
            # the API could not be read (down, credentials, RBAC): every host says so; doctor names it once
            finding = Finding("api", Verdict.FINDING, error.problem, [f"while reading node {name}"],
                              error.fix or "", CLUSTER_UNREADABLE)
            for step in CLUSTER_STEPS:
                results.setdefault(step, StepResult(host, step, Verdict.FINDING, error.problem, [finding]))
        return results


    def judge_dra(self, host: str, parsed: HostSettings, node: NodeLabelsState, gpus: list[dict]) -> StepResult:
        """The device_plugin link of a node on gpunode's DRA driver: its ResourceSlice, and no second offer."""
        devices = self.dra_devices(parsed.cluster, node.name)
        if devices is None:
            return StepResult(host, "device_plugin", Verdict.NOT_CHECKED,
                              f"node {node.name} uses gpunode's DRA driver (gpu_allocation = dra): its ResourceSlice "
                              "is judged by verify and doctor, which list every slice once")
        findings = device_plugin.dra_offer(node, gpus, devices, parsed.manifests.namespace)
        twice = device_plugin.offered_twice(node, GPU_RESOURCE, self.offered(parsed.cluster).get(node.name, {}))
        return verdict(host, "device_plugin", [twice, *findings] if twice is not None else findings)


def judge_node(host: str, facts: dict[str, dict], settings: HostSettings) -> dict[str, StepResult]:
    """A verdict per node step, from the host's facts; the GPU steps are skipped where the driver step failed or
    the host is CPU-only."""
    results: dict[str, StepResult] = {}
    for step in NODE_STEPS:
        if step != "driver":
            gate = results["driver"]
            if gate.state is not Verdict.OK:
                why = ("CPU-only host" if gate.state is Verdict.NOT_CHECKED else "the driver step failed")
                results[step] = StepResult(host, step, Verdict.NOT_CHECKED, why)
                continue
        if step not in facts:
            results[step] = StepResult(host, step, Verdict.FINDING, "could not read the step's facts from the host")
            continue
        results[step] = verdict(host, step, DIAGNOSES[step](facts[step], settings.node))
    return results


def judge_cluster(host: str, driver: StepResult, facts: dict[str, dict], settings: HostSettings,
                  cluster: ClusterView | None) -> dict[str, StepResult]:
    """A verdict per cluster step, from the API (not checked without ``cluster`` or where the driver failed)."""
    if driver.state is Verdict.FINDING:
        return {step: StepResult(host, step, Verdict.NOT_CHECKED, "the driver step failed") for step in CLUSTER_STEPS}
    if cluster is None:
        return {step: StepResult(host, step, Verdict.NOT_CHECKED, "cluster not checked") for step in CLUSTER_STEPS}
    return cluster.judge(host, settings, facts, driver.state is Verdict.OK)


def judge(host: str, facts: dict[str, dict], settings: HostSettings,
          cluster: ClusterView | None = None) -> dict[str, StepResult]:
    """A verdict per step: the node steps from the host's facts, the cluster steps from the API when ``cluster``
    is given (skipped otherwise)."""
    results = judge_node(host, facts, settings)
    return {**results, **judge_cluster(host, results["driver"], facts, settings, cluster)}
