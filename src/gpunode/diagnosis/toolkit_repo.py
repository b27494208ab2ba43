"""Diagnosis of the toolkit repository step: trusted key, exact source, no conflicting sources; apt or dnf."""

from __future__ import annotations

from gpunode.diagnosis import Finding, Verdict, with_proof
from gpunode.settings import KEYRING_PATH, LIST_PATH, REPO_FILE_PATH, REPO_ID, RPM_KEY_PATH, NodeSettings

STEP = "toolkit_repo"


def list_line(settings: NodeSettings, keyring: str = KEYRING_PATH) -> str:
    """The one apt source line the node must have (NVIDIA's flat repository layout)."""
    return f"deb [signed-by={keyring}] {settings.toolkit_repository_url} /"


def repo_file(settings: NodeSettings) -> list[str]:
    """dnf's repository file for NVIDIA's rpm repository: packages and metadata both signature-checked,
    with the key gpunode fetched and checked (never a key URL dnf would trust on first use)."""
    return [f"[{REPO_ID}]", "name=NVIDIA Container Toolkit", f"baseurl={settings.toolkit_rpm_repository_url}",
            "enabled=1", "gpgcheck=1", "repo_gpgcheck=1", f"gpgkey=file://{RPM_KEY_PATH}"]


def rpm_key_id(fingerprint: str) -> str:
    """How rpm names an imported key (``gpg-pubkey-<id>``): the fingerprint's last 8 hex digits, lower case."""
    return fingerprint[-8:].lower()


def unknown_family(state: dict) -> list[Finding]:
    return [Finding(STEP, Verdict.FINDING, "gpunode cannot tell whether this host installs packages with apt or dnf",
                    [f"/etc/os-release: {state.get('os_release') or 'unreadable'}"],
                    "gpunode supports Debian and Ubuntu (apt) and the RHEL family: RHEL, Rocky, Alma, Fedora (dnf); "
                    "on a derivative, make sure /etc/os-release's ID_LIKE names its parent")]


def diagnose(state: dict, settings: NodeSettings) -> list[Finding]:
    family = state["family"]
    if family == "rpm":
        return diagnose_rpm(state, settings)
    if family != "deb":
        return unknown_family(state)
    findings = []
    expected = settings.toolkit_key_fingerprint
    if not state["keyring_fingerprints"]:
        findings.append(Finding(STEP, Verdict.FINDING, f"the toolkit keyring {KEYRING_PATH} is missing or unreadable",
                                [f"gpg --show-keys {KEYRING_PATH}: no key"],
                                "re-run deploys/toolkit_repo.py (it fetches the key and checks its fingerprint)"))
    elif expected not in state["keyring_fingerprints"]:
        findings.append(Finding(STEP, Verdict.FINDING, "the toolkit keyring holds a key other than the pinned one",
                                [f"keyring fingerprints: {', '.join(state['keyring_fingerprints'])}",
                                 f"pinned (toolkit_key_fingerprint): {expected}"],
                                "re-run deploys/toolkit_repo.py, or correct toolkit_key_fingerprint"))
    want = list_line(settings)
    lines = [line.strip() for line in state["list"] or [] if line.strip() and not line.startswith("#")]
    if state["list"] is None:
        findings.append(Finding(STEP, Verdict.FINDING, f"the apt source {LIST_PATH} is missing", [f"expected: {want}"],
                                "re-run deploys/toolkit_repo.py"))
    elif lines != [want]:
        findings.append(Finding(STEP, Verdict.FINDING, f"the apt source {LIST_PATH} is not the pinned line",
                                [f"found: {' | '.join(lines) or '(empty)'}", f"expected: {want}"],
                                "re-run deploys/toolkit_repo.py"))
    if state["stale_lists"]:
        findings.append(Finding(STEP, Verdict.FINDING, "stale NVIDIA apt sources conflict with the toolkit source "
                                "(apt: 'Conflicting values set for option Signed-By')", state["stale_lists"],
                                f"remove them: rm {' '.join(state['stale_lists'])}"))
    return with_proof(findings, STEP, "the toolkit's apt source is the pinned line, signed by the pinned key",
                      [f"gpg --show-keys {KEYRING_PATH}: {', '.join(state['keyring_fingerprints'])}",
                       f"{LIST_PATH}: {' | '.join(lines)}",
                       f"other NVIDIA sources in /etc/apt/sources.list.d: {', '.join(state['stale_lists']) or 'none'}"])


def diagnose_rpm(state: dict, settings: NodeSettings) -> list[Finding]:
    findings = []
    expected = settings.toolkit_key_fingerprint
    fingerprints = state["rpm_key_fingerprints"]
    if fingerprints != [expected]:
        findings.append(Finding(
            STEP, Verdict.FINDING, f"the toolkit key file {RPM_KEY_PATH} is missing" if not fingerprints
            else f"the toolkit key file {RPM_KEY_PATH} holds a key other than the pinned one",
            [f"gpg --show-keys {RPM_KEY_PATH}: {', '.join(fingerprints) or 'no key'}",
             f"pinned (toolkit_key_fingerprint): {expected}"],
            "re-run deploys/toolkit_repo.py (it fetches the key and checks its fingerprint), or correct "
            "toolkit_key_fingerprint"))
    if rpm_key_id(expected) not in state["rpm_trusted_keys"]:
        findings.append(Finding(STEP, Verdict.FINDING, "rpm does not trust the toolkit key: dnf cannot check the "
                                "packages' signatures (gpgcheck=1)",
                                [f"rpm -q gpg-pubkey: {', '.join(state['rpm_trusted_keys']) or 'no key'}",
                                 f"wanted: gpg-pubkey-{rpm_key_id(expected)}"],
                                "re-run deploys/toolkit_repo.py (it imports the checked key)"))
    want = repo_file(settings)
    lines = [line.strip() for line in state["repo_file"] or [] if line.strip() and not line.startswith("#")]
    if state["repo_file"] is None:
        findings.append(Finding(STEP, Verdict.FINDING, f"dnf's repository file {REPO_FILE_PATH} is missing",
                                [f"expected: {' | '.join(want)}"], "re-run deploys/toolkit_repo.py"))
    elif lines != want:
        findings.append(Finding(STEP, Verdict.FINDING, f"dnf's repository file {REPO_FILE_PATH} is not the pinned one",
                                [f"found: {' | '.join(lines) or '(empty)'}", f"expected: {' | '.join(want)}"],
                                "re-run deploys/toolkit_repo.py"))
    if state["stale_repos"]:
        findings.append(Finding(STEP, Verdict.FINDING, "stale NVIDIA repository files define the same packages "
                                "(dnf picks among them)", state["stale_repos"],
                                f"remove them: rm {' '.join(state['stale_repos'])}"))
    return with_proof(findings, STEP, "the toolkit's dnf repository is the pinned one, metadata and packages "
                      "checked with the pinned key",
                      [f"/etc/os-release: {state.get('os_release')} (dnf)",
                       f"gpg --show-keys {RPM_KEY_PATH}: {', '.join(fingerprints)}",
                       f"rpm -q gpg-pubkey: gpg-pubkey-{rpm_key_id(expected)} imported",
                       f"{REPO_FILE_PATH}: {' | '.join(lines)}",
                       "other NVIDIA repository files in /etc/yum.repos.d: "
                       f"{', '.join(state['stale_repos']) or 'none'}"])
