"""Diagnosis of the labels step: the Node carries exactly the labels its GPU facts call for."""

from __future__ import annotations

from gpunode.diagnosis import Finding, Verdict, with_proof
from gpunode.facts.labels import NodeLabelsState

STEP = "labels"
FIX = "re-run deploys/labels.py"


def plan(state: NodeLabelsState, desired: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the labels gpunode applies, the labels it leaves because another manager holds them with another value)."""
    foreign = {key: value for key, value in desired.items()
               if key in state.others and key not in state.ours and state.labels.get(key) != value}
    return {k: v for k, v in desired.items() if k not in foreign}, foreign


def up_to_date(state: NodeLabelsState, applied: dict[str, str]) -> bool:
    """True when gpunode owns exactly ``applied`` and the node shows those values: nothing to write."""
    return set(state.ours) == set(applied) and all(state.labels.get(k) == v for k, v in applied.items())


def diagnose(state: NodeLabelsState, desired: dict[str, str]) -> list[Finding]:
    if not state.exists:
        return [Finding(STEP, Verdict.FINDING, f"the cluster has no Node named {state.name}",
                        ["kubectl get node " + state.name + ": NotFound"],
                        "set k8s_node_name for this host in the inventory (the name 'kubectl get nodes' shows), "
                        "or join the node to the cluster", code="node-missing")]
    applied, foreign = plan(state, desired)
    findings = [Finding(STEP, Verdict.FINDING, f"label {key} is owned by {state.others[key]} "
                        f"(value {state.labels.get(key)!r}, gpunode would set {value!r}); gpunode leaves it",
                        fix=f"remove it with the tool that set it, then {FIX}", code="label-foreign", breaks=False)
                for key, value in sorted(foreign.items())]
    wrong = [f"{key}: {state.labels.get(key, '<missing>')} (want {value})" for key, value in sorted(applied.items())
             if state.labels.get(key) != value]
    stale = sorted(state.ours - set(applied))
    if not desired and stale:
        findings.append(Finding(STEP, Verdict.FINDING, f"{state.name} carries GPU labels but has no working GPU",
                                [f"{key}={state.labels.get(key)}" for key in stale], FIX, code="labels-stale"))
    elif wrong or stale:
        evidence = wrong + [f"{key}={state.labels.get(key)} (no longer true)" for key in stale]
        findings.append(Finding(STEP, Verdict.FINDING, f"{state.name}'s GPU labels do not match its GPUs", evidence,
                                FIX, code="labels-stale"))
    if not desired:
        return with_proof(findings, STEP, f"{state.name} carries no GPU labels (no working GPU)",
                          [f"kubectl get node {state.name}: labels owned by gpunode: "
                           f"{', '.join(sorted(state.ours)) or 'none'}"])
    return with_proof(findings, STEP, f"{state.name} carries the labels of its GPUs",
                      [f"kubectl get node {state.name}: {key}={state.labels.get(key)}" for key in sorted(applied)])
