"""Findings: what is wrong on a node, the evidence, and the fix.

Each step has a diagnosis module of the same name that turns that step's facts
into findings. The deploy fails a host with them, the verification suites
assert on them and ``gpunode doctor`` reports them; none of them changes a host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Severity(StrEnum):
    FAIL = "fail"
    SKIP = "skip"  # not checked: the step does not apply (CPU-only host) or an earlier link is broken
    WARN = "warn"
    OK = "ok"  # positive evidence that the step holds: what was read, and where


@dataclass(frozen=True)
class Finding:
    """One thing wrong, not applicable, or proven right on a host, for one step."""

    step: str
    severity: Severity
    what: str
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    code: str = ""  # stable identifier operations act on (e.g. "nvidia-runtime-missing")

    def __str__(self) -> str:
        text = self.what
        if self.evidence:
            text += "\n  evidence: " + "\n            ".join(self.evidence)
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


def failures(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity is Severity.FAIL]


def proven(step: str, what: str, evidence: list[str]) -> Finding:
    """The step holds: ``evidence`` quotes what was read that shows it (never fixed text)."""
    return Finding(step, Severity.OK, what, evidence, code="ok")


def with_proof(findings: list[Finding], step: str, what: str, evidence: list[str]) -> list[Finding]:
    """``findings`` plus the step's proof when none of them is a failure."""
    return findings if failures(findings) else [*findings, proven(step, what, evidence)]
