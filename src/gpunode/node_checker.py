"""The node checker: one node judges its own links and publishes them as Node conditions (``gpunode node-check``).

It runs on every GPU node (a DaemonSet, ``templates/node-checker.yaml.j2``) and reads the node through a local
connection, no SSH: pyinfra's ``@local`` connector, or its ``@chroot`` connector over the host's root mounted
read-only into the pod (``--root /host``: the host's own nvidia-smi, dpkg and configuration files answer). The facts
command and the diagnosis are ``gpunode verify``'s (``gpunode.verify.engine``), so a node's condition says what
verify would say. Every ``interval`` seconds, and at once on SIGUSR1 (``kubectl exec ... -- kill -USR1 1``), it:

* patches its Node's status with one condition per link of the chain (``gpunode.verify.node_conditions``) when a
  condition's status, reason or message changed, or its last write is a ``heartbeat`` old (node-problem-detector's
  rule, and its 5 minutes by default): a fleet whose chain holds costs the API server one write per node and
  heartbeat, not per interval, and ``verify --in-cluster`` judges staleness against the heartbeat,
* writes its record ConfigMap when the verdict changed (evidence, fix, proof: ``verify --in-cluster`` reads it),
* creates an Event on the Node for each condition whose status or reason changed.

The cluster links (labels, device plugin) are judged from this node's share of the API only (its Node, the
plugin's DaemonSet, the pods bound to it: ``gpunode.verify.own_node``); ``verify --in-cluster`` judges them again
from one list for the whole cluster.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpunode.cluster import node_status
from gpunode.diagnosis import Verdict
from gpunode.errors import GpunodeError
from gpunode.facts.labels import read_node
from gpunode.facts.node_records import read_record_text
from gpunode.host_settings import settings_of
from gpunode.verify.checks import NODE_STEPS, StepResult, judge_cluster
from gpunode.verify.engine import Verification
from gpunode.verify.node_conditions import (
    CHECKER,
    CONDITIONS,
    RECORD_KEY,
    RECORD_LABEL,
    RECORD_PREFIX,
    changed,
    conditions,
    encode,
    parse_time,
    record,
)
from gpunode.verify.own_node import OwnNodeView
from gpunode.verify.targets import Target

EVENT_NAMESPACE = "default"  # where the kubelet and node-problem-detector put a Node's Events


def node_settings(path: str | None, node: str) -> tuple[dict[str, Any], str | None]:
    """The host's inventory data from ``--settings``: a YAML file, or a folder with one NODE.yaml per node (the
    DaemonSet's ConfigMap, which the kubelet updates in place after a deploy: the checker reads it before every
    check). Returns (data, a note when the folder has no file for this node: the defaults are expected)."""
    import yaml

    if not path:
        return {}, None
    chosen = Path(path) / f"{node}.yaml" if Path(path).is_dir() else Path(path)
    if not chosen.exists() and chosen.parent == Path(path):
        return {}, f"node {node}: no {chosen}: the inventory's defaults are expected"
    try:
        loaded = yaml.safe_load(chosen.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise GpunodeError(f"--settings {chosen} cannot be read: {error}",
                           "give a YAML mapping of inventory data keys") from error
    if not isinstance(loaded, dict | None):
        raise GpunodeError(f"--settings {chosen} is not a mapping", "give a YAML mapping of data keys")
    return loaded or {}, None


def local_target(node: str, root: str, data: dict[str, Any]) -> Target:
    """This node as a verification target: ``@local``, or ``@chroot/ROOT`` when the host's root is mounted there.
    The API is reached with the pod's ServiceAccount unless the data names a kubeconfig."""
    name = "@local" if root in ("", "/") else f"@chroot/{root.rstrip('/')}"
    return Target(name, {"kubeconfig": "in-cluster", **data, "k8s_node_name": node}, [])


@dataclass
class CheckerState:
    """What the checker last published (read back from the API when it starts)."""

    conditions: dict[str, dict] = field(default_factory=dict)
    record: str | None = None  # None: not read yet


def judge_own(target: Target, node: str | None = None) -> tuple[dict[str, StepResult], dict[str, dict]]:
    """Every link's result and the facts they were judged from: the node links from the node (one that cannot be
    read fails at the driver link with why, as verify says it), the cluster links from this node's share of the
    API (``OwnNodeView``), where ``cluster_steps`` is on."""
    quiet = Target(target.name, {**target.data, "cluster_steps": False}, target.groups)
    verification = Verification([quiet])
    try:
        verification.read_all()
    finally:
        verification.close()
    results = {step: verification.result(quiet.name, step) for step in NODE_STEPS}
    facts = verification.facts.get(quiet.name, {})
    parsed = settings_of(target)
    name = node or parsed.cluster.k8s_node_name or facts.get("hostname") or target.name
    results.update(judge_cluster(target.name, results["driver"], facts, parsed, OwnNodeView(name)))
    return results, facts


def evidence_of(result: StepResult) -> list[str]:
    """What an Event quotes: the breaking finding's evidence and fix, or the proof."""
    if result.state is Verdict.OK:
        return result.proof
    lines: list[str] = []
    for finding in result.findings:
        if finding.state is Verdict.FINDING and finding.breaks:
            lines += [*finding.evidence, *([f"fix: {finding.fix}"] if finding.fix else [])]
            break
    return lines


def due(previous: dict[str, dict], current: list[dict], now: datetime, heartbeat: float) -> bool:
    """Whether the conditions must be written: one is new or says something else, or the oldest write is
    ``heartbeat`` seconds old (a second of slack: a check that lands just before the beat does not wait a whole
    interval more)."""
    for condition in current:
        before = previous.get(condition["type"]) or {}
        if any(before.get(key) != condition[key] for key in ("status", "reason", "message")):
            return True
        written = parse_time(before.get("lastHeartbeatTime"))
        if written is None or (now - written).total_seconds() >= heartbeat - 1:
            return True
    return False


def publish(target: Target, node: str, results: dict[str, StepResult], facts: dict[str, dict], interval: float,
            state: CheckerState, now: datetime | None = None, heartbeat: float = 0, force: bool = False) -> list[dict]:
    """Write the node's conditions (when one changed, the ``heartbeat`` is due, or ``force``), its record (when
    changed) and the Events of the conditions that changed; returns those."""
    parsed = settings_of(target)
    settings, namespace = parsed.cluster, parsed.manifests.namespace
    name = f"{RECORD_PREFIX}{node}"
    if state.record is None:
        state.conditions = read_node(settings, node).conditions
        state.record = read_record_text(settings, namespace, name)
    moment = now or datetime.now(UTC)
    current = conditions(results, state.conditions, moment)
    write = force or due(state.conditions, current, moment, heartbeat)
    if write:
        node_status.patch_conditions(settings, node, current)
    text = encode(record(node, results, facts, interval, max(heartbeat, interval)))
    if text != state.record:  # its evidence or proof moved, even where no condition did
        node_status.apply_record(settings, namespace, name, {RECORD_LABEL: node,
                                                             "app.kubernetes.io/managed-by": CHECKER},
                                 {RECORD_KEY: text})
        state.record = text
    if not write:
        return []
    moved = changed(state.conditions, current)
    step_of = {kind: step for step, kind in CONDITIONS.items()}
    for condition in moved:
        evidence = evidence_of(results[step_of[condition["type"]]])
        node_status.emit_event(settings, node, EVENT_NAMESPACE, condition, evidence, moment)
    state.conditions = {c["type"]: c for c in current}
    return moved


def check_once(target: Target, node: str, interval: float, state: CheckerState, heartbeat: float = 0) -> list[dict]:
    results, facts = judge_own(target, node)
    return publish(target, node, results, facts, interval, state, heartbeat=heartbeat)


def run(target_of: Callable[[], Target], node: str, interval: float, say: Any, heartbeat: float = 0) -> None:
    """Check every ``interval`` seconds, and at once on SIGUSR1, until SIGTERM or SIGINT, with the target
    ``target_of`` gives before each check (its settings may have changed since). Settings that cannot be read or
    a failed publish are said and tried again at the next interval (the API may be restarting); neither stops the
    loop (the conditions then go stale, and ``verify --in-cluster`` says so)."""
    wake, stop = threading.Event(), threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: wake.set())
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: (stop.set(), wake.set()))
    state = CheckerState()
    while not stop.is_set():
        try:
            target = target_of()
        except GpunodeError as error:
            say(f"node {node}: not checked: {error.problem}" + (f" (fix: {error.fix})" if error.fix else ""))
        else:
            try:
                moved = check_once(target, node, interval, state, heartbeat)
                say(f"node {node} checked: "
                    + (", ".join(f"{c['type']}={c['status']} ({c['reason']})" for c in moved) or "no change"))
            except GpunodeError as error:
                say(f"node {node}: cannot publish: {error.problem}" + (f" (fix: {error.fix})" if error.fix else ""))
                state.record = None  # read back what is there before the next publish
        wake.wait(interval)
        wake.clear()
