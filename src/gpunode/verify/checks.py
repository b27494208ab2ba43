"""Reading every step's facts from a host in one command, and judging each step from them."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpunode.diagnosis import Finding, Severity, driver, runtime, toolkit, toolkit_repo
from gpunode.facts.driver import DriverState
from gpunode.facts.runtime import RuntimeConfig
from gpunode.facts.toolkit import ToolkitPackages
from gpunode.facts.toolkit_repo import ToolkitRepoState
from gpunode.settings import NodeSettings

STEPS = ("driver", "toolkit_repo", "toolkit", "runtime")
FACTS = {"driver": DriverState, "toolkit_repo": ToolkitRepoState, "toolkit": ToolkitPackages,
         "runtime": RuntimeConfig}
DIAGNOSES = {"driver": driver.diagnose, "toolkit_repo": toolkit_repo.diagnose, "toolkit": toolkit.diagnose,
             "runtime": runtime.diagnose}
FACT_MARK = "##gpunode-fact:"


def facts_command(steps: tuple[str, ...] = STEPS) -> str:
    """One shell command printing every step's fact output, each behind its own marker."""
    parts = []
    for step in steps:
        parts.append(f"echo '{FACT_MARK}{step}'")
        parts.append(f"( {FACTS[step]().command()} ) 2>/dev/null")
    return "; ".join(parts)


def split_facts(stdout: str) -> dict[str, dict]:
    chunks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith(FACT_MARK):
            current = chunks.setdefault(line[len(FACT_MARK):], [])
        elif current is not None:
            current.append(line)
    return {step: FACTS[step]().process(lines) for step, lines in chunks.items()}


@dataclass
class StepResult:
    """The verdict on one step of one host."""

    host: str
    step: str
    outcome: str  # "pass", "fail" or "skip"
    reason: str = ""
    findings: list[Finding] = field(default_factory=list)


def judge(host: str, facts: dict[str, dict], settings: NodeSettings) -> dict[str, StepResult]:
    """A verdict per step; GPU steps are skipped where the driver step failed or the host is CPU-only."""
    results: dict[str, StepResult] = {}
    for step in STEPS:
        if step != "driver":
            gate = results["driver"]
            if gate.outcome != "pass":
                why = ("CPU-only host" if gate.outcome == "skip" else "the driver step failed")
                results[step] = StepResult(host, step, "skip", why)
                continue
        if step not in facts:
            results[step] = StepResult(host, step, "fail", "could not read the step's facts from the host")
            continue
        findings = DIAGNOSES[step](facts[step], settings)
        failed = [f for f in findings if f.severity is Severity.FAIL]
        skipped = [f for f in findings if f.severity is Severity.SKIP]
        if failed:
            results[step] = StepResult(host, step, "fail", failed[0].what, failed)
        elif skipped:
            results[step] = StepResult(host, step, "skip", skipped[0].what, skipped)
        else:
            results[step] = StepResult(host, step, "pass")
    return results
