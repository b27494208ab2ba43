"""The chain's node links as Node conditions, and the node checker's record of its findings.

The node checker (``gpunode node-check``, a DaemonSet on every GPU node) judges its own node's links with the same
facts command and diagnosis as ``gpunode verify`` and publishes them where the ecosystem reads them: one Node
condition per link, in node-problem-detector's style (``type`` from ``gpunode.chain``, ``status`` True / False /
Unknown for ok / finding / not checked, a CamelCase ``reason`` from the finding's code, ``message`` its one line),
an Event when a condition changes, and the whole verdict (evidence, fix, proof) in one ConfigMap per node.

Why a ConfigMap and not an annotation: every controller that watches Nodes (the scheduler, the node lifecycle
controller, autoscalers) receives the whole Node object on every change, so kilobytes of evidence on the Node
would be sent to all of them at every heartbeat; a ConfigMap per node is read only by whoever asks for it, and is
written only when the verdict changes. The conditions themselves are written when one changes, and otherwise once
per heartbeat (their ``lastHeartbeatTime``; 5 minutes by default, as node-problem-detector's), not at every check.

``gpunode verify --in-cluster`` reads them back (:func:`results_of`): one Node list and one ConfigMap list.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

from gpunode import chain
from gpunode.cluster.manifests import CHECKER  # noqa: F401 - the checker's name, read with its records
from gpunode.diagnosis import Verdict
from gpunode.facts.labels import api_time
from gpunode.facts.node_records import RECORD_KEY, RECORD_LABEL  # noqa: F401 - the checker writes them
from gpunode.verify.checks import StepResult

RECORD_PREFIX = "gpunode-node-"  # the ConfigMap of node X is gpunode-node-X in the plugin's namespace
STALE_AFTER = 2  # results older than this many heartbeats are stale: the checker is not running there
STATUS = {Verdict.OK: "True", Verdict.FINDING: "False", Verdict.NOT_CHECKED: "Unknown"}
CONDITIONS = {step.name: step.condition for step in chain.STEPS}  # every link: the checker judges them all
NODE_CONDITIONS = {step.name: step.condition for step in chain.STEPS if step.on_node}
MESSAGE_LIMIT = 1024  # a condition's message is one line; the record keeps the whole verdict


def camel(code: str) -> str:
    """``nvidia-runtime-missing`` as a condition reason: ``NvidiaRuntimeMissing``."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", code) if part)


def reason_of(result: StepResult) -> str:
    if result.state is Verdict.OK:
        return "Verified"
    if result.state is Verdict.NOT_CHECKED:
        return "NotChecked"
    code = next((f.code for f in result.findings if f.state is Verdict.FINDING and f.breaks and f.code), "")
    return camel(code) or "Finding"


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def conditions(results: dict[str, StepResult], previous: dict[str, dict], now: datetime) -> list[dict]:
    """The node links' conditions; a condition keeps its lastTransitionTime while its status stays the same."""
    out = []
    for step, kind in CONDITIONS.items():
        if step not in results:
            continue
        result = results[step]
        status = STATUS[result.state]
        before = previous.get(kind) or {}
        moved = before.get("status") != status or not before.get("lastTransitionTime")
        out.append({"type": kind, "status": status, "reason": reason_of(result),
                    "message": " ".join(result.reason.split())[:MESSAGE_LIMIT],
                    "lastHeartbeatTime": api_time(now),
                    "lastTransitionTime": api_time(now) if moved else before["lastTransitionTime"]})
    return out


def changed(previous: dict[str, dict], current: list[dict]) -> list[dict]:
    """The conditions whose status or reason differ from before (each gets an Event)."""
    return [c for c in current if (previous.get(c["type"]) or {}).get("status") != c["status"]
            or (previous.get(c["type"]) or {}).get("reason") != c["reason"]]


def record(node: str, results: dict[str, StepResult], facts: dict[str, dict], interval: float,
           heartbeat: float | None = None) -> dict:
    """What the ConfigMap keeps: every link's verdict as verify's JSON has it, the checker's interval and heartbeat
    (the longest it goes without writing its conditions), and the driver's GPUs and health (``--in-cluster``
    judges the cluster links again from them: expected labels, expected offer, exclusive compute)."""
    driver = facts.get("driver") or {}
    return {"node": node, "interval_s": interval, "heartbeat_s": heartbeat or interval,
            "steps": {step: results[step].as_json() for step in CONDITIONS if step in results},
            "facts": {"driver": {"nvidia_smi": driver.get("nvidia_smi"), "health": driver.get("health")},
                      "hostname": facts.get("hostname") or node}}


def encode(data: dict) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def results_of(host: str, data: dict) -> dict[str, StepResult]:
    """The node links' results a record holds, for ``host`` (its inventory name); the cluster links are judged
    again by the reader, from one list for the whole cluster."""
    steps = data.get("steps") or {}
    return {step: StepResult.from_json(host, step, steps[step]) if step in steps else
            StepResult(host, step, Verdict.NOT_CHECKED, f"not checked: the node checker's record has no {step}")
            for step in NODE_CONDITIONS}


def heartbeat(node_conditions: dict[str, dict]) -> datetime | None:
    """When the checker last wrote the node's conditions (the oldest of its node links'; None if one is
    missing)."""
    times = [parse_time((node_conditions.get(kind) or {}).get("lastHeartbeatTime"))
             for kind in NODE_CONDITIONS.values()]
    return None if None in times else min(t for t in times if t is not None)
