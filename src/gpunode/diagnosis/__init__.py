"""Findings: what is wrong on a node, the evidence, and the fix.

Each step has a diagnosis module of the same name that turns that step's facts
into findings. The deploy fails a host with them, the verification suites
assert on them and ``gpunode doctor`` reports them; none of them changes a host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Verdict(StrEnum):
    """The one vocabulary of a verdict, the same from a diagnosis to doctor's and verify's text, JSON and JUnit."""

    OK = "ok"  # positive evidence that the link holds: what was read, and where
    FINDING = "finding"  # something is wrong: what, the evidence, the fix
    NOT_CHECKED = "not checked"  # with why: the link does not apply (CPU-only host) or an earlier one is broken


@dataclass(frozen=True)
class Finding:
    """One thing wrong, not applicable, or proven right on a host, for one step."""

    step: str
    state: Verdict
    what: str
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    code: str = ""  # stable identifier operations act on (e.g. "nvidia-runtime-missing")
    breaks: bool = True  # False: a warning shown with the link, which it does not break (a finding all the same)

    def __str__(self) -> str:
        text = self.what
        if self.evidence:
            text += "\n  evidence: " + "\n            ".join(self.evidence)
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


def failures(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.state is Verdict.FINDING and f.breaks]


def proven(step: str, what: str, evidence: list[str]) -> Finding:
    """The step holds: ``evidence`` quotes what was read that shows it (never fixed text)."""
    return Finding(step, Verdict.OK, what, evidence, code="ok")


def with_proof(findings: list[Finding], step: str, what: str, evidence: list[str]) -> list[Finding]:
    """``findings`` plus the step's proof when none of them is a failure."""
    return findings if failures(findings) else [*findings, proven(step, what, evidence)]
