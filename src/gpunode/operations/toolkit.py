"""Operations of the toolkit step: the four toolkit packages at one pinned version, and the installed toolkit
usable on this host (its config's ldconfig exists here, its programs executable, a CDI spec of this node's GPUs
where CDI is used)."""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import operation

from gpunode.diagnosis.toolkit import (
    cdi_findings,
    config_findings,
    ldconfig_choice,
    not_executable,
    volume_mount_findings,
)
from gpunode.facts.toolkit import VOLUME_MOUNTS_KEY, ToolkitPackages
from gpunode.operations import failing_command, step_fact
from gpunode.operations.backup import backup_command
from gpunode.operations.driver import NO_GPU, gpu_present
from gpunode.settings import REPO_ID, TOOLKIT_CONFIG, TOOLKIT_PACKAGES, NodeSettings


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


def pinned_with_dnf(state: dict, settings: NodeSettings, stamp: str):
    """The dnf side of :func:`pinned`: a changed pin moves all four packages, and their versionlock entries with
    them (a lock at the old version would hide the new one from dnf)."""
    version = settings.toolkit_version
    wrong = [name for name, installed in state["versions"].items() if installed != version]
    locks: dict[str, str] = state["locks"]
    stale = sorted(name for name, locked in locks.items() if wrong or locked != version or not settings.toolkit_hold)
    if stale:
        yield f"dnf -q versionlock delete {' '.join(stale)}"
    if wrong:
        if stamp:
            yield backup_command([TOOLKIT_CONFIG], stamp)
        yield dnf_install_command(version)
    kept = {name for name, locked in locks.items() if name not in stale}
    if settings.toolkit_hold and kept != set(TOOLKIT_PACKAGES):
        yield f"dnf -q versionlock add {' '.join(name for name in TOOLKIT_PACKAGES if name not in kept)}"
    elif not wrong and not stale:
        host.noop(f"NVIDIA Container Toolkit {version} already installed (dnf)")


@operation()
def pinned(settings: NodeSettings, stamp: str = ""):
    """
    Install nvidia-container-toolkit, nvidia-container-toolkit-base,
    libnvidia-container-tools and libnvidia-container1 at ``toolkit_version``,
    all four together (a changed pin upgrades or downgrades them as one), and hold
    them when ``toolkit_hold`` is set.

    + settings: the host's gpunode settings (toolkit_version, toolkit_hold)
    + stamp: the run's backup folder name: the toolkit's config.toml, which the packages' post-install writes, is
      backed up (or noted absent) before packages move, so ``gpunode undo --packages`` can leave no trace
    """
    if not gpu_present(host):
        host.noop(NO_GPU)
        return
    state = step_fact(host, "toolkit", ToolkitPackages)
    if state["family"] == "rpm":
        yield from pinned_with_dnf(state, settings, stamp)
        return
    if state["family"] != "deb":
        yield failing_command("gpunode cannot tell whether this host installs packages with apt or dnf "
                              "(/etc/os-release names neither family); see deploys/toolkit_repo.py's finding")
        return
    version = settings.toolkit_version
    wrong = [name for name, installed in state["versions"].items() if installed != version]
    packages = " ".join(TOOLKIT_PACKAGES)
    if wrong:
        if stamp:
            yield backup_command([TOOLKIT_CONFIG], stamp)
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


def ldconfig_command(choice: str) -> str:
    """NVIDIA's own way to set one key of its config (``nvidia-ctk config --set``, toolkit 1.14 and later)."""
    return f"nvidia-ctk config --in-place --config-file={TOOLKIT_CONFIG} --set nvidia-container-cli.ldconfig={choice}"


CDI_SPEC = "/etc/cdi/nvidia.yaml"  # where NVIDIA's docs have nvidia-ctk write the spec an admin keeps


def cdi_generate_command(path: str) -> str:
    """NVIDIA's own generator of the node's CDI spec (it reads the GPUs through NVML and finds the driver's files)."""
    return f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && nvidia-ctk cdi generate --output={shlex.quote(path)}"


@operation()
def usable(stamp: str, settings: NodeSettings | None = None):
    """
    Make the installed toolkit usable on this host as its packages leave it: a config.toml whose ldconfig does
    not exist here or is not a host path gets the ldconfig nvidia-ctk picks for this host (config backed up
    first); where the device plugin hands GPUs as volume mounts, the hook is told to take them
    (accept-nvidia-visible-devices-as-volume-mounts, NVIDIA's own ``nvidia-ctk config --set``); a toolkit
    program without an execute bit gets 0755; where CDI is used, a CDI spec that is missing, does not parse or
    names other GPUs than nvidia-smi's is written again by ``nvidia-ctk cdi generate`` (the old one backed up
    first). No restart: the runtime and its hook read all of them at every container's creation.

    + stamp: the run's backup folder name
    + settings: the host's settings (whether containerd or docker has CDI enabled)
    """
    if not gpu_present(host):
        host.noop(NO_GPU)
        return
    state = step_fact(host, "toolkit", ToolkitPackages)
    changed = False
    for finding in config_findings(state):
        choice = ldconfig_choice(state["paths"])
        if finding.code in ("toolkit-ldconfig-missing", "toolkit-ldconfig-in-container") and choice:
            yield backup_command([TOOLKIT_CONFIG], stamp)
            yield ldconfig_command(choice)
            changed = True
        else:
            yield failing_command(f"{finding.what}\n  evidence: {'; '.join(finding.evidence)}\n  fix: {finding.fix}")
            return
    settings = settings or NodeSettings()
    if volume_mount_findings(state, settings):
        if not changed:  # backed up once per run: the ldconfig repair above did it
            yield backup_command([TOOLKIT_CONFIG], stamp)
        yield f"nvidia-ctk config --in-place --config-file={TOOLKIT_CONFIG} --set {VOLUME_MOUNTS_KEY}=true"
        changed = True
    stuck = not_executable(state)
    if stuck:
        yield f"chmod 0755 {' '.join(stuck)}"
        changed = True
    if cdi_findings(state, settings):
        path = (state.get("cdi_specs") or [CDI_SPEC])[0]
        yield backup_command([path], stamp)
        yield cdi_generate_command(path)
        changed = True
    if not changed:
        config = state.get("config")
        host.noop("the toolkit's config and programs are usable here" + (
            f" (ldconfig {config['ldconfig']})" if config and config.get("ldconfig") else ""))
