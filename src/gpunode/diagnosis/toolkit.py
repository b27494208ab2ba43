"""Diagnosis of the toolkit step: all four packages at the pinned version (and held, if asked); apt or dnf."""

from __future__ import annotations

from gpunode.diagnosis import Finding, Severity, with_proof
from gpunode.settings import VERSIONLOCK_LIST, NodeSettings

STEP = "toolkit"


def diagnose(state: dict, settings: NodeSettings) -> list[Finding]:
    want = settings.toolkit_version
    rpm = state["family"] == "rpm"
    wrong = {name: version for name, version in state["versions"].items() if version != want}
    findings = []
    if wrong:
        evidence = [f"{name}: {version or 'not installed'}" for name, version in sorted(wrong.items())]
        what = ("the NVIDIA Container Toolkit is not installed" if all(v is None for v in state["versions"].values())
                else f"toolkit packages are not all at the pinned {want}")
        findings.append(Finding(STEP, Severity.FAIL, what, evidence,
                                f"re-run deploys/toolkit.py (installs all four at {want})"))
    locks = state["locks"]
    if rpm and locks and any(version != want for version in locks.values()):
        findings.append(Finding(STEP, Severity.FAIL, f"dnf versionlock holds toolkit packages at another version "
                                f"than the pinned {want}: dnf will not move them",
                                [f"{VERSIONLOCK_LIST}: {name} locked at {version}" for name, version in
                                 sorted(locks.items()) if version != want],
                                "re-run deploys/toolkit.py (it moves the locks with the pin)"))
    elif settings.toolkit_hold and not wrong:
        unheld = sorted(set(state["versions"]) - set(state["held"]))
        if unheld:
            findings.append(Finding(STEP, Severity.FAIL, "toolkit packages are not held at the pinned version",
                                    [f"not held: {', '.join(unheld)}"]
                                    + ([f"{VERSIONLOCK_LIST}: no lock for them"] if rpm else []),
                                    f"{'dnf versionlock add' if rpm else 'apt-mark hold'} {' '.join(unheld)} "
                                    "(or re-run deploys/toolkit.py)"))
    source = "rpm -q" if rpm else "dpkg-query"
    held = "locked by dnf versionlock" if rpm else "held"
    evidence = [f"{source}: {name} {version}" + (f" ({held})" if name in state["held"] else " (not held)")
                for name, version in sorted(state["versions"].items())]
    return with_proof(findings, STEP, f"the toolkit packages are at the pinned {want}"
                      + (" and held" if settings.toolkit_hold else ""), evidence)
