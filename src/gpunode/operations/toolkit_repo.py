"""Operations of the toolkit repository step: trust NVIDIA's key only after checking it, then the source."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation

from gpunode.diagnosis.toolkit_repo import list_line
from gpunode.facts.toolkit_repo import ToolkitRepoState
from gpunode.operations import step_fact
from gpunode.operations.driver import NO_GPU, gpu_present
from gpunode.settings import KEYRING_PATH, LIST_PATH, NodeSettings


def fetch_key_command(url: str, fingerprint: str, keyring: str) -> str:
    """Shell that downloads the key, refuses it unless its fingerprint is the pinned one, then dearmors it."""
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
        "gpg --batch --yes --dearmor -o \"$tmp/keyring.gpg\" \"$tmp/key\"",
        f"install -D -m 0644 \"$tmp/keyring.gpg\" {q(keyring)}",
    ])


@operation()
def configured(settings: NodeSettings, keyring: str = KEYRING_PATH, list_path: str = LIST_PATH):
    """
    Make NVIDIA's Container Toolkit repository an apt source: the key (fingerprint
    checked before it is trusted) as a dearmored keyring, the exact ``signed-by``
    list line, stale nvidia-docker/libnvidia-container lists removed, and
    ``apt-get update`` of this source only when something changed.

    + settings: the host's gpunode settings (repository URL, key URL, fingerprint)
    + keyring: where the dearmored key goes
    + list_path: the apt list file
    """
    if not gpu_present(host):
        host.noop(NO_GPU)
        return
    state = step_fact(host, "toolkit_repo", ToolkitRepoState, keyring=keyring, list_path=list_path)
    changed = False
    if state["keyring_fingerprints"] != [settings.toolkit_key_fingerprint]:
        yield fetch_key_command(settings.toolkit_key_url, settings.toolkit_key_fingerprint, keyring)
        changed = True
    want = list_line(settings, keyring)
    if (state["list"] or []) != [want]:
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
