"""Diagnosis of the toolkit repository step: trusted key, exact source line, no conflicting lists."""

from __future__ import annotations

from gpunode.diagnosis import Finding, Severity, with_proof
from gpunode.settings import KEYRING_PATH, LIST_PATH, NodeSettings

STEP = "toolkit_repo"


def list_line(settings: NodeSettings, keyring: str = KEYRING_PATH) -> str:
    """The one apt source line the node must have (NVIDIA's flat repository layout)."""
    return f"deb [signed-by={keyring}] {settings.toolkit_repository_url} /"


def diagnose(state: dict, settings: NodeSettings) -> list[Finding]:
    findings = []
    expected = settings.toolkit_key_fingerprint
    if not state["keyring_fingerprints"]:
        findings.append(Finding(STEP, Severity.FAIL, f"the toolkit keyring {KEYRING_PATH} is missing or unreadable",
                                [f"gpg --show-keys {KEYRING_PATH}: no key"],
                                "re-run deploys/toolkit_repo.py (it fetches the key and checks its fingerprint)"))
    elif expected not in state["keyring_fingerprints"]:
        findings.append(Finding(STEP, Severity.FAIL, "the toolkit keyring holds a key other than the pinned one",
                                [f"keyring fingerprints: {', '.join(state['keyring_fingerprints'])}",
                                 f"pinned (toolkit_key_fingerprint): {expected}"],
                                "re-run deploys/toolkit_repo.py, or correct toolkit_key_fingerprint"))
    want = list_line(settings)
    lines = [line.strip() for line in state["list"] or [] if line.strip() and not line.startswith("#")]
    if state["list"] is None:
        findings.append(Finding(STEP, Severity.FAIL, f"the apt source {LIST_PATH} is missing", [f"expected: {want}"],
                                "re-run deploys/toolkit_repo.py"))
    elif lines != [want]:
        findings.append(Finding(STEP, Severity.FAIL, f"the apt source {LIST_PATH} is not the pinned line",
                                [f"found: {' | '.join(lines) or '(empty)'}", f"expected: {want}"],
                                "re-run deploys/toolkit_repo.py"))
    if state["stale_lists"]:
        findings.append(Finding(STEP, Severity.FAIL, "stale NVIDIA apt sources conflict with the toolkit source "
                                "(apt: 'Conflicting values set for option Signed-By')", state["stale_lists"],
                                f"remove them: rm {' '.join(state['stale_lists'])}"))
    return with_proof(findings, STEP, "the toolkit's apt source is the pinned line, signed by the pinned key",
                      [f"gpg --show-keys {KEYRING_PATH}: {', '.join(state['keyring_fingerprints'])}",
                       f"{LIST_PATH}: {' | '.join(lines)}",
                       f"other NVIDIA sources in /etc/apt/sources.list.d: {', '.join(state['stale_lists']) or 'none'}"])
