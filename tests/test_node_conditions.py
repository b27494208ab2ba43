"""The node checker's conditions and record, and how --in-cluster reads them back (no cluster needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpunode import chain
from gpunode.diagnosis import Finding, Verdict
from gpunode.facts.labels import NodeLabelsState
from gpunode.verify.checks import NODE_STEPS, StepResult
from gpunode.verify.in_cluster import record_problem
from gpunode.verify.node_conditions import (
    CONDITIONS,
    camel,
    changed,
    conditions,
    heartbeat,
    reason_of,
    record,
    results_of,
    timestamp,
)

NOW = datetime(2026, 12, 3, 21, 0, 0, tzinfo=UTC)
BROKEN = Finding("runtime", Verdict.FINDING, "containerd on node01 has no nvidia runtime",
                 ["/etc/containerd/config.toml on node01: no runtimes.nvidia"], "gpunode deploy INVENTORY runtime",
                 "nvidia-runtime-missing")
WARNING = Finding("driver", Verdict.FINDING, "persistence mode is off on GPU 0", ["nvidia-smi on node01: Disabled"],
                  "systemctl enable --now nvidia-persistenced", "persistence-mode-off", breaks=False)
PROOF = Finding("driver", Verdict.OK, "driver 550.54.15 answers", ["nvidia-smi on node01: 550.54.15"], code="ok")


def healthy(host: str = "node01") -> dict[str, StepResult]:
    results = {step: StepResult(host, step, Verdict.OK, f"{step} holds",
                                [Finding(step, Verdict.OK, f"{step} holds", [f"read {step} on {host}"], code="ok")])
               for step in NODE_STEPS}
    results["driver"] = StepResult(host, "driver", Verdict.OK, PROOF.what, [WARNING, PROOF])
    return results


def test_every_node_link_has_one_condition_type_in_node_problem_detectors_style() -> None:
    assert list(CONDITIONS) == list(NODE_STEPS)
    kinds = [step.condition for step in chain.STEPS]
    assert len(set(kinds)) == len(kinds) == len(chain.STEPS)
    assert all(kind.endswith("Ready") and kind[0].isupper() and kind.isalnum() for kind in kinds)


@pytest.mark.parametrize(("code", "reason"), [("nvidia-runtime-missing", "NvidiaRuntimeMissing"),
                                              ("mig-caps-missing", "MigCapsMissing"),
                                              ("driver_mismatch", "DriverMismatch"), ("", "")])
def test_a_finding_code_becomes_a_camelcase_reason(code: str, reason: str) -> None:
    assert camel(code) == reason


def test_status_and_reason_follow_the_verdict() -> None:
    results = healthy()
    results["runtime"] = StepResult("node01", "runtime", Verdict.FINDING, BROKEN.what, [BROKEN])
    results["toolkit"] = StepResult("node01", "toolkit", Verdict.NOT_CHECKED, "not checked: CPU-only host")
    out = {c["type"]: c for c in conditions(results, {}, NOW)}
    assert out["NvidiaRuntimeReady"]["status"] == "False"
    assert out["NvidiaRuntimeReady"]["reason"] == "NvidiaRuntimeMissing"
    assert out["NvidiaRuntimeReady"]["message"] == BROKEN.what
    assert out["NvidiaContainerToolkitReady"]["status"] == "Unknown"
    assert out["GPUDriverReady"] == {"type": "GPUDriverReady", "status": "True", "reason": "Verified",
                                     "message": PROOF.what, "lastHeartbeatTime": "2026-12-03T21:00:00Z",
                                     "lastTransitionTime": "2026-12-03T21:00:00Z"}
    assert reason_of(results["driver"]) == "Verified"  # a warning does not break the link


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    first = {c["type"]: c for c in conditions(healthy(), {}, NOW)}
    later = NOW + timedelta(minutes=5)
    again = conditions(healthy(), first, later)
    assert all(c["lastTransitionTime"] == timestamp(NOW) and c["lastHeartbeatTime"] == timestamp(later)
               for c in again)
    assert changed(first, again) == []
    broken = healthy()
    broken["runtime"] = StepResult("node01", "runtime", Verdict.FINDING, BROKEN.what, [BROKEN])
    moved = changed(first, conditions(broken, first, later))
    assert [(c["type"], c["status"], c["lastTransitionTime"]) for c in moved] == [
        ("NvidiaRuntimeReady", "False", timestamp(later))]


def test_the_record_gives_back_every_verdict_with_its_evidence_fix_and_proof() -> None:
    results = healthy()
    results["runtime"] = StepResult("node01", "runtime", Verdict.FINDING, BROKEN.what, [BROKEN])
    facts = {"driver": {"nvidia_smi": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}, "health": [], "other": 1},
             "hostname": "node01"}
    data = record("node01", results, facts, 30)
    assert data["facts"] == {"driver": {"nvidia_smi": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}, "health": []},
                             "hostname": "node01"}
    back = results_of("gpu-a", data)
    assert back["runtime"].state is Verdict.FINDING and back["runtime"].findings == [BROKEN]
    assert back["driver"].state is Verdict.OK and back["driver"].proof == PROOF.evidence
    assert back["driver"].findings[0] == WARNING
    assert {step: r.as_json() for step, r in back.items()} == {step: r.as_json() for step, r in results.items()}
    assert all(r.host == "gpu-a" for r in back.values())


def state_with(beat: datetime | None, kinds: tuple[str, ...] = tuple(CONDITIONS.values())) -> NodeLabelsState:
    conds = {kind: {"status": "True", "lastHeartbeatTime": timestamp(beat) if beat else ""} for kind in kinds}
    return NodeLabelsState("node01", True, conditions=conds)


def test_results_that_are_missing_unreadable_or_stale_are_said_with_the_fix() -> None:
    data = record("node01", healthy(), {}, 30)
    assert record_problem("node01", "node01", "gpunode", data, state_with(NOW - timedelta(seconds=59)), NOW) is None
    stale = record_problem("node01", "node01", "gpunode", data, state_with(NOW - timedelta(seconds=61)), NOW)
    assert stale is not None and stale.code == "checker-stale" and "61 s ago, every 30 s expected" in stale.what
    assert "2026-12-03T20:58:59Z" in stale.evidence[0]
    assert "--field-selector spec.nodeName=node01" in stale.fix
    missing = record_problem("node01", "node01", "gpunode", None, state_with(NOW), NOW)
    assert missing is not None and missing.code == "checker-missing"
    assert missing.evidence == ["no ConfigMap gpunode/gpunode-node-node01"]
    unreadable = record_problem("node01", "node01", "gpunode", "key results.json is not JSON", state_with(NOW), NOW)
    assert unreadable is not None and unreadable.code == "checker-record-unreadable"
    no_condition = record_problem("node01", "node01", "gpunode", data, state_with(NOW, ("GPUDriverReady",)), NOW)
    assert no_condition is not None and "NvidiaRuntimeReady" in no_condition.what
    gone = record_problem("gpu-a", "node09", "gpunode", data, NodeLabelsState("node09", False), NOW)
    assert gone is not None and gone.code == "node-missing" and "k8s_node_name for gpu-a" in gone.fix


def test_heartbeat_is_the_oldest_of_the_chains_conditions() -> None:
    conds = {kind: {"lastHeartbeatTime": timestamp(NOW)} for kind in CONDITIONS.values()}
    conds["NvidiaRuntimeReady"] = {"lastHeartbeatTime": timestamp(NOW - timedelta(seconds=90))}
    assert heartbeat(conds) == NOW - timedelta(seconds=90)
    del conds["GPUDriverReady"]
    assert heartbeat(conds) is None
