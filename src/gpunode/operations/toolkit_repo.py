"""Operations of the toolkit repository step: trust NVIDIA's key only after checking it, then the source."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation

from gpunode.diagnosis.toolkit_repo import list_line, repo_file, rpm_key_id, unknown_family
from gpunode.facts.toolkit_repo import ToolkitRepoState
from gpunode.operations import failing_command, step_fact
from gpunode.operations.backup import backup_command
from gpunode.operations.driver import NO_GPU, gpu_present
from gpunode.settings import KEYRING_PATH, LIST_PATH, REPO_FILE_PATH, REPO_ID, RPM_KEY_PATH, NodeSettings


def fetch_key_command(url: str, fingerprint: str, keyring: str, dearmor: bool = True) -> str:
    """Shell that downloads the key, refuses it unless its fingerprint is the pinned one, then installs it
    (dearmored as apt's keyring; as published, armored, for rpm and dnf)."""
    q = shlex.quote
    return "\n".join([
        "set -eu",
        'tmp=$(mktemp -d); trap \'rm -rf "$tmp"\' EXIT',
        f"if ! curl -fsSL --retry 2 --connect-timeout 10 --max-time 60 {q(url)} -o \"$tmp/key\" 2>\"$tmp/err\"; then",
        f"  echo \"gpunode: cannot fetch the toolkit key from {url}: $(cat \"$tmp/err\")\" >&2; exit 1",
        "fi",
        "found=$(gpg --show-keys --with-colons \"$tmp/key\" 2>/dev/null | awk -F: '$1==\"fpr\"{print $10; exit}')",
        f"if [ \"$found\" != {q(fingerprint)} ]; then",
        f"  echo \"gpunode: the key at {url} has fingerprint ${{found:-none}}, not the pinned {fingerprint};"
        " refusing to trust it (check toolkit_key_url and toolkit_key_fingerprint)\" >&2; exit 1",
        "fi",
        *(["gpg --batch --yes --dearmor -o \"$tmp/keyring.gpg\" \"$tmp/key\""] if dearmor
          else ["cp \"$tmp/key\" \"$tmp/keyring.gpg\""]),
        f"install -D -m 0644 \"$tmp/keyring.gpg\" {q(keyring)}",
    ])


@operation()
def configured(settings: NodeSettings, keyring: str = KEYRING_PATH, list_path: str = LIST_PATH, stamp: str = ""):
    """
    Make NVIDIA's Container Toolkit repository an apt source: the key (fingerprint
    checked before it is trusted) as a dearmored keyring, the exact ``signed-by``
    list line, stale nvidia-docker/libnvidia-container lists removed, and
    ``apt-get update`` of this source only when something changed.

    + settings: the host's gpunode settings (repository URL, key URL, fingerprint)
    + keyring: where the dearmored key goes
    + list_path: the apt list file
    + stamp: this run's backup folder (each file is kept there before it changes; ``gpunode undo`` reads them)
    """
    if not gpu_present(host):
        host.noop(NO_GPU)
        return
    state = step_fact(host, "toolkit_repo", ToolkitRepoState, keyring=keyring, list_path=list_path)
    if state["family"] == "rpm":
        yield from configured_for_dnf(state, settings, stamp)
        return
    if state["family"] != "deb":
        yield failing_command(str(unknown_family(state)[0]))
        return
    want = list_line(settings, keyring)
    key_wrong = state["keyring_fingerprints"] != [settings.toolkit_key_fingerprint]
    list_wrong = (state["list"] or []) != [want]
    if stamp and (key_wrong or list_wrong or state["stale_lists"]):
        yield backup_command([keyring, list_path, *state["stale_lists"]], stamp)
    changed = False
    if key_wrong:
        yield fetch_key_command(settings.toolkit_key_url, settings.toolkit_key_fingerprint, keyring)
        changed = True
    if list_wrong:
        yield f"printf '%s\\n' {shlex.quote(want)} > {shlex.quote(list_path)}.gpunode-new" \
              f" && chmod 0644 {shlex.quote(list_path)}.gpunode-new" \
              f" && mv {shlex.quote(list_path)}.gpunode-new {shlex.quote(list_path)}"
        changed = True
    if state["stale_lists"]:
        yield "rm -f " + " ".join(shlex.quote(path) for path in state["stale_lists"])
        changed = True
    if not changed:
        host.noop("NVIDIA Container Toolkit repository already configured")
        return
    yield (f"apt-get update -q --error-on=any -o Dir::Etc::sourcelist={shlex.quote(list_path)}"
           " -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0")


def configured_for_dnf(state: dict, settings: NodeSettings, stamp: str = ""):
    """The dnf side of :func:`configured`: the key file (fingerprint checked), rpm's trust in it, the ``.repo``
    file, stale NVIDIA repository files removed, and dnf's metadata of this repository only when something changed."""
    q = shlex.quote
    want = repo_file(settings)
    lines = [line.strip() for line in state["repo_file"] or [] if line.strip() and not line.startswith("#")]
    if stamp and (state["rpm_key_fingerprints"] != [settings.toolkit_key_fingerprint] or lines != want
                  or state["stale_repos"]):
        yield backup_command([RPM_KEY_PATH, REPO_FILE_PATH, *state["stale_repos"]], stamp)
    changed = False
    if state["rpm_key_fingerprints"] != [settings.toolkit_key_fingerprint]:
        yield fetch_key_command(settings.toolkit_key_url, settings.toolkit_key_fingerprint, RPM_KEY_PATH,
                                dearmor=False)
        changed = True
    if changed or rpm_key_id(settings.toolkit_key_fingerprint) not in state["rpm_trusted_keys"]:
        yield f"rpm --import {q(RPM_KEY_PATH)}"  # only the file just checked (or found) with the pinned fingerprint
        changed = True
    if lines != want:
        text = "\n".join(want) + "\n"
        yield f"printf '%s' {q(text)} > {q(REPO_FILE_PATH)}.gpunode-new && chmod 0644 {q(REPO_FILE_PATH)}.gpunode-new" \
              f" && mv {q(REPO_FILE_PATH)}.gpunode-new {q(REPO_FILE_PATH)}"
        changed = True
    if state["stale_repos"]:
        yield "rm -f " + " ".join(q(path) for path in state["stale_repos"])
        changed = True
    if not changed:
        host.noop("NVIDIA Container Toolkit repository already configured (dnf)")
        return
    yield f"dnf -q -y --disablerepo='*' --enablerepo={REPO_ID} makecache"
