"""Verification from the cluster itself: the node checker's results instead of a command on every host.

``gpunode verify --in-cluster`` and ``gpunode doctor --in-cluster`` read one Node list (the chain's conditions and
their heartbeat) and one list of the checker's ConfigMaps (the whole verdict of each node's links), then judge the
cluster links (labels, device plugin) from the API as the SSH path does, with the GPUs the checker read. Nothing is
run on any host; a node whose checker wrote nothing, or nothing for two heartbeats, fails at the chain's first link
with that said, and every later link is "not checked".
"""

from __future__ import annotations

from datetime import UTC, datetime

from gpunode.cluster.labels import GFD
from gpunode.diagnosis import Finding, Verdict
from gpunode.errors import GpunodeError
from gpunode.facts.labels import NodeLabelsState
from gpunode.facts.node_records import read_node_records
from gpunode.host_settings import HostSettings, settings_of
from gpunode.verify.checks import CLUSTER_UNREADABLE, StepResult, judge_cluster
from gpunode.verify.engine import Verification
from gpunode.verify.node_conditions import (
    CHECKER,
    NODE_CONDITIONS,
    RECORD_PREFIX,
    STALE_AFTER,
    heartbeat,
    results_of,
)

CHECKER_LINK = "node checker"
GPU_PRESENT = f"{GFD}gpu.present"  # the node checker's DaemonSet selects the nodes with it


def pods_command(namespace: str, node: str) -> str:
    return (f"kubectl -n {namespace} get pods -l app.kubernetes.io/name={CHECKER} -o wide "
            f"--field-selector spec.nodeName={node}")


def record_problem(host: str, node: str, namespace: str, record: dict | str | None, state: NodeLabelsState,
                   now: datetime) -> Finding | None:
    """Why the node's results cannot be used (missing, unreadable, stale), or None."""
    where = f"ConfigMap {namespace}/{RECORD_PREFIX}{node}"
    fix = (f"see why the node checker does not report on {node}: {pods_command(namespace, node)}; "
           f"or verify {host} over SSH (without --in-cluster)")
    if not state.exists:
        return Finding(CHECKER_LINK, Verdict.FINDING, f"no Node named {node} in the cluster",
                       [f"the Node list has no {node}"], f"set k8s_node_name for {host} to its Node's name, or verify "
                       "it over SSH (without --in-cluster) until it joins", "node-missing")
    if record is None:
        return Finding(CHECKER_LINK, Verdict.FINDING, f"no results from the node checker for node {node}",
                       [f"no {where}"], fix, "checker-missing")
    if isinstance(record, str):
        return Finding(CHECKER_LINK, Verdict.FINDING, f"the node checker's results for node {node} cannot be read",
                       [record], fix, "checker-record-unreadable")
    beat = heartbeat(state.conditions)
    if beat is None:
        missing = sorted(kind for kind in NODE_CONDITIONS.values() if kind not in state.conditions)
        return Finding(CHECKER_LINK, Verdict.FINDING, f"node {node} carries no condition {', '.join(missing)}",
                       [f"Node {node} conditions: {', '.join(sorted(state.conditions)) or 'none'}"], fix,
                       "checker-missing")
    interval = float(record.get("interval_s") or 0)
    period = max(interval, float(record.get("heartbeat_s") or 0))  # the longest it goes without writing them
    age = (now - beat).total_seconds()
    if period > 0 and age > STALE_AFTER * period:
        return Finding(CHECKER_LINK, Verdict.FINDING,
                       f"the node checker's results for node {node} are stale: last written {int(age)} s ago, "
                       f"every {period:g} s expected",
                       [f"Node {node} lastHeartbeatTime of its chain conditions: "
                        f"{beat.strftime('%Y-%m-%dT%H:%M:%SZ')}"], fix, "checker-stale")
    return None


class InClusterVerification(Verification):
    """The engine's verification, read from the cluster: same results, same reports."""

    def read_all(self) -> None:
        records: dict[tuple[str, str, str], dict[str, dict | str]] = {}
        now = datetime.now(UTC)
        for name, target in self.targets.items():
            try:
                parsed = settings_of(target)
            except GpunodeError as error:
                self.errors[name] = Finding("inventory data", Verdict.FINDING,
                                            f"bad inventory data for {name}: {error.problem}", fix=error.fix or "",
                                            code="bad-data")
                continue
            outcome = self._from_cluster(name, parsed, records, now)
            if isinstance(outcome, Finding):
                self.errors[name] = outcome
            else:
                self.verdicts[name] = outcome

    def _from_cluster(self, name: str, parsed: HostSettings, records: dict, now: datetime) \
            -> dict[str, StepResult] | Finding:
        settings = parsed.cluster
        if not settings.cluster_steps:
            return Finding(CHECKER_LINK, Verdict.FINDING,
                           f"{name} has cluster_steps = False: its results are not in a cluster",
                           fix=f"verify {name} over SSH (without --in-cluster)", code="checker-missing")
        node = settings.k8s_node_name or name
        namespace = parsed.manifests.namespace
        key = (str(settings.kubeconfig_path), settings.kube_context, namespace)
        try:
            if key not in records:
                records[key] = read_node_records(settings, namespace)
            state = self.cluster.node(settings, node)
        except GpunodeError as error:
            return Finding("api", Verdict.FINDING, error.problem, [f"while reading node {node}"], error.fix or "",
                           CLUSTER_UNREADABLE)
        record = records[key].get(node)
        if record is None and state.exists and state.labels.get(GPU_PRESENT) != "true":
            # the checker runs where the labels step found a working GPU: elsewhere, the node links are unread
            why = (f"no node checker on {node}: its Node has no {GPU_PRESENT}=true (a CPU-only node, or one whose "
                   "GPU labels are missing: verify it over SSH)")
            results = {step: StepResult(name, step, Verdict.NOT_CHECKED, why) for step in NODE_CONDITIONS}
            self.facts[name] = {"hostname": node}
            return {**results, **judge_cluster(name, results["driver"], self.facts[name], parsed, self.cluster)}
        problem = record_problem(name, node, namespace, record, state, now)
        if problem is not None:
            return problem
        results = results_of(name, record)
        facts = dict(record.get("facts") or {})
        facts["hostname"] = node
        self.facts[name] = facts
        return {**results, **judge_cluster(name, results["driver"], facts, parsed, self.cluster)}
