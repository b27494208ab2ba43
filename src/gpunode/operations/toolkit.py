"""Operations of the toolkit step: the four toolkit packages at one pinned version."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation

from gpunode.facts.toolkit import ToolkitPackages
from gpunode.operations import failing_command, step_fact
from gpunode.operations.driver import NO_GPU, gpu_present
from gpunode.settings import REPO_ID, TOOLKIT_PACKAGES, NodeSettings


def install_command(version: str) -> str:
    """Shell that checks the pinned version exists, then installs (or downgrades) all four packages to it."""
    pins = " ".join(f"{package}={version}" for package in TOOLKIT_PACKAGES)
    v = shlex.quote(version)
    return "\n".join([
        "set -eu",
        f"if ! apt-cache madison nvidia-container-toolkit | awk -F'|' '{{gsub(/ /,\"\",$2); print $2}}'"
        f" | grep -qx {v}; then",
        "  available=$(apt-cache madison nvidia-container-toolkit | awk -F'|' '{gsub(/ /,\"\",$2); print $2}'"
        " | tr '\\n' ' ')",
        f"  echo \"gpunode: toolkit version {version} is not in the configured repository"
        " (available: ${available:-none}); fix toolkit_version\" >&2",
        "  exit 1",
        "fi",
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades --allow-change-held-packages"
        f" -o Dpkg::Options::=--force-confold {pins}",
    ])


def dnf_install_command(version: str) -> str:
    """Shell that checks the pinned version is in NVIDIA's repository, then installs all four packages at it (dnf
    installs a named older version as a downgrade)."""
    pins = " ".join(f"{package}-{version}" for package in TOOLKIT_PACKAGES)
    v = shlex.quote(version)
    return "\n".join([
        "set -eu",
        f"if ! available=$(dnf -q --disablerepo='*' --enablerepo={REPO_ID} repoquery --qf '%{{version}}-%{{release}}'"
        " nvidia-container-toolkit 2>&1); then",
        "  echo \"gpunode: dnf could not read the toolkit repository: $available\" >&2; exit 1",
        "fi",
        f"if ! printf '%s\\n' \"$available\" | grep -qx {v}; then",
        f"  echo \"gpunode: toolkit version {version} is not in the configured repository"
        " (available: $(echo $available)); fix toolkit_version\" >&2",
        "  exit 1",
        "fi",
        f"dnf -q -y install {pins}",
    ])


def pinned_with_dnf(state: dict, settings: NodeSettings):
    """The dnf side of :func:`pinned`: a changed pin moves all four packages, and their versionlock entries with
    them (a lock at the old version would hide the new one from dnf)."""
    version = settings.toolkit_version
    wrong = [name for name, installed in state["versions"].items() if installed != version]
    locks: dict[str, str] = state["locks"]
    stale = sorted(name for name, locked in locks.items() if wrong or locked != version or not settings.toolkit_hold)
    if stale:
        yield f"dnf -q versionlock delete {' '.join(stale)}"
    if wrong:
        yield dnf_install_command(version)
    kept = {name for name, locked in locks.items() if name not in stale}
    if settings.toolkit_hold and kept != set(TOOLKIT_PACKAGES):
        yield f"dnf -q versionlock add {' '.join(name for name in TOOLKIT_PACKAGES if name not in kept)}"
    elif not wrong and not stale:
        host.noop(f"NVIDIA Container Toolkit {version} already installed (dnf)")


@operation()
def pinned(settings: NodeSettings):
    """
    Install nvidia-container-toolkit, nvidia-container-toolkit-base,
    libnvidia-container-tools and libnvidia-container1 at ``toolkit_version``,
    all four together (a changed pin upgrades or downgrades them as one), and hold
    them when ``toolkit_hold`` is set.

    + settings: the host's gpunode settings (toolkit_version, toolkit_hold)
    """
    if not gpu_present(host):
        host.noop(NO_GPU)
        return
    state = step_fact(host, "toolkit", ToolkitPackages)
    if state["family"] == "rpm":
        yield from pinned_with_dnf(state, settings)
        return
    if state["family"] != "deb":
        yield failing_command("gpunode cannot tell whether this host installs packages with apt or dnf "
                              "(/etc/os-release names neither family); see deploys/toolkit_repo.py's finding")
        return
    version = settings.toolkit_version
    wrong = [name for name, installed in state["versions"].items() if installed != version]
    packages = " ".join(TOOLKIT_PACKAGES)
    if wrong:
        if state["held"]:
            yield f"apt-mark unhold {' '.join(state['held'])}"
        yield install_command(version)
    held = set(state["held"]) if not wrong else set()
    if settings.toolkit_hold and held != set(TOOLKIT_PACKAGES):
        yield f"apt-mark hold {packages}"
    elif not settings.toolkit_hold and held:
        yield f"apt-mark unhold {' '.join(sorted(held))}"
    elif not wrong:
        host.noop(f"NVIDIA Container Toolkit {version} already installed")
