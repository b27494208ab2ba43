"""Operations of the runtime step: configure the nvidia runtime, restart only when that changed something.

Every file is backed up (``/var/backups/gpunode/<stamp>/<path>``) before it
changes, and kept; a restart that does not bring the runtime back restores
those backups, restarts again and fails the host with the runtime's own log.
"""

from __future__ import annotations

import io
import json
import tomllib

import tomlkit
from pyinfra import host
from pyinfra.api import FileUploadCommand, Host, operation

from gpunode import connection
from gpunode.diagnosis import failures
from gpunode.diagnosis.runtime import chosen_runtime, diagnose
from gpunode.errors import GpunodeError
from gpunode.facts.runtime import CONTAINERD_CONFIG, CONTAINERD_DROPIN_DIR, DOCKER_CONFIG, RuntimeConfig
from gpunode.operations import control_command, failing_command, step_fact
from gpunode.operations.backup import backup_command, backup_dir, restore_command
from gpunode.operations.driver import NO_GPU, gpu_present
from gpunode.settings import NodeSettings

DROPIN = f"{CONTAINERD_DROPIN_DIR}/99-nvidia.toml"
# containerd must answer AND load its CRI plugin (a config can start containerd yet break CRI)
READY_CHECK = {"containerd": "ctr version && ctr plugins ls | awk '$2==\"cri\"{n++; if ($4!=\"ok\") bad=1}"
                             " END{exit (n==0 || bad)}'",
               "docker": "docker info"}
# findings no change of this step can repair: the host fails with them (and their fix) instead of a restart that
# changes nothing; a CRI plugin that is off, or an nvidia runtime hand-edited away from runc's options, is the
# admin's to decide
BLOCKING = ("config-invalid", "config-rejected", "dump-unreadable", "no-runtime", "cdi-unsupported", "cri-disabled",
            "cri-plugin-missing", "nvidia-options-differ", "docker-cli-missing")


def with_systemd_cgroup(default_config: str, systemd_cgroup: bool) -> str | None:
    """containerd's default config with runc's SystemdCgroup set as asked (comments kept); None if unusable."""
    try:
        document = tomlkit.parse(default_config)
        version = int(document.get("version", 2))
        plugin = "io.containerd.cri.v1.runtime" if version >= 3 else "io.containerd.grpc.v1.cri"
        options = document["plugins"][plugin]["containerd"]["runtimes"]["runc"]["options"]
    except (KeyError, ValueError, tomlkit.exceptions.TOMLKitError):
        return None
    options["SystemdCgroup"] = systemd_cgroup
    return tomlkit.dumps(document)


def carried_settings(existing: str | None, default: str, migrated: str | None = None) -> dict:
    """What the existing config sets, in the schema of containerd's default config; {} when none can be carried.

    In the same schema that is the whole existing config. containerd 2.x reads an older schema by
    migrating it; its own migration (``containerd config migrate``) says where each setting goes in the
    new one, and what it holds apart from the defaults is the admin's. A schema-1 config on containerd
    1.x has no such migration: its keys mean other tables, so nothing is carried (the old file is backed up).
    """
    if not existing or not existing.strip():
        return {}
    try:
        current = tomllib.loads(existing)
        fresh = tomllib.loads(default)
    except ValueError:
        return {}
    version = int(fresh.get("version", 2))
    if int(current.get("version", 1)) == version:
        return current
    try:
        moved = tomllib.loads(migrated or "")
    except ValueError:
        return {}
    return _differing(moved, fresh) if int(moved.get("version", 1)) == version else {}


def _differing(values: dict, defaults: dict) -> dict:
    """The part of ``values`` that is not the same in ``defaults``, table by table."""
    found = {}
    for key, value in values.items():
        default = defaults.get(key)
        if isinstance(value, dict) and isinstance(default, dict):
            inner = _differing(value, default)
            if inner:
                found[key] = inner
        elif key not in defaults or value != default:
            found[key] = value
    return found


def keeping_existing(base: str, settings: dict) -> str:
    """``base`` (containerd's default config) with every value of ``settings`` (:func:`carried_settings`) laid
    over it: an admin's sandbox image, oom_score_adj or registry mirrors survive the move to a full config."""
    if not settings:
        return base
    try:
        document = tomlkit.parse(base)
    except tomlkit.exceptions.TOMLKitError:
        return base

    def lay(target: dict, values: dict) -> None:
        for key, value in values.items():
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                lay(target[key], value)
            else:
                # an item of its own: tomlkit 0.15.3 keeps the replaced string's quoting on a plain assignment,
                # 0.15.2 does not; a new item is written the same by both
                target[key] = tomlkit.item(value)

    lay(document, settings)
    return tomlkit.dumps(document)


def without_default_nvidia(text: str) -> str | None:
    """``text`` with ``default_runtime_name = "nvidia"`` set back to runc, or None if it does not set it."""
    document = tomlkit.parse(text)
    changed = False
    for plugin in ("cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"):  # schema 1, 2, 3
        table = document.get("plugins", {}).get(plugin, {}).get("containerd", {})
        if table.get("default_runtime_name") == "nvidia":
            table["default_runtime_name"] = "runc"
            changed = True
    return tomlkit.dumps(document) if changed else None


def upload(text: str, path: str) -> list:
    temp = f"{path}.gpunode-new"
    return [FileUploadCommand(io.BytesIO(text.encode()), temp), f"chmod 0644 {temp} && mv {temp} {path}"]


@operation()
def nvidia_runtime(settings: NodeSettings, stamp: str):
    """
    Make the node's runtime (containerd or docker) able to run the nvidia runtime,
    as default or not per ``nvidia_runtime_default``, with CDI per ``cdi_enabled``.
    Runs ``nvidia-ctk runtime configure`` only when the effective config lacks
    what the inventory asks for; writes containerd's default config first when
    the config is missing or Debian's stub; refuses configs that do not parse.

    + settings: the host's gpunode settings
    + stamp: names this run's backup folder
    """
    if not gpu_present(host):
        host.noop(NO_GPU)
        return
    state = step_fact(host, "runtime", RuntimeConfig)
    findings = failures(diagnose(state, settings))
    runtime = chosen_runtime(state, settings)
    codes = {f.code for f in findings}
    blocking = [f for f in findings if f.code in BLOCKING]
    if blocking:
        yield failing_command("\n".join(str(f) for f in blocking))
        return
    if not codes:
        host.noop(f"{runtime} already configured for the nvidia runtime")
        return
    if codes == {"runtime-down"}:
        yield f"systemctl enable {runtime}"  # config is right; the restart that follows starts it
        return
    config_path = CONTAINERD_CONFIG if runtime == "containerd" else DOCKER_CONFIG
    touched = [config_path] + ([DROPIN] if runtime == "containerd" else [])
    yield backup_command(touched, stamp)

    if runtime == "containerd" and "base-config-missing" in codes:
        default = state["containerd_default"] or ""
        base = with_systemd_cgroup(default, settings.containerd_systemd_cgroup)
        if base is None:
            yield failing_command("containerd's config has no runc runtime and 'containerd config default' gave "
                                  "no usable base config; write one by hand")
            return
        carried = carried_settings(state["containerd_config"], default, state.get("containerd_migrated"))
        yield from upload(keeping_existing(base, carried), CONTAINERD_CONFIG)
    if runtime == "docker" and state["docker_config"] is not None and not state["docker_config"].strip():
        yield from upload("{}\n", DOCKER_CONFIG)  # nvidia-ctk fails on an empty daemon.json ('EOF')

    if codes & {"nvidia-runtime-missing", "cdi-missing", "base-config-missing", "cri-plugin-failed"} or (
            "default-runtime-wrong" in codes and settings.nvidia_runtime_default):
        flags = [f"--runtime={runtime}", f"--config={config_path}"]
        if settings.nvidia_runtime_default:
            flags.append("--set-as-default")
        if settings.cdi_enabled:
            flags.append("--cdi.enabled")
        yield "nvidia-ctk runtime configure " + " ".join(flags)

    if "default-runtime-wrong" in codes and not settings.nvidia_runtime_default:
        yield from unset_default(runtime, state)


def unset_default(runtime: str, state: dict):
    """Commands that stop nvidia being the default runtime, in whichever file sets it."""
    if runtime == "docker":
        config = json.loads(state["docker_config"] or "{}")
        config.pop("default-runtime", None)
        yield from upload(json.dumps(config, indent=4, sort_keys=True), DOCKER_CONFIG)
        return
    files = {CONTAINERD_CONFIG: state["containerd_config"] or "", **state["containerd_dropins"]}
    for path, text in files.items():
        fixed = without_default_nvidia(text) if text else None
        if fixed is not None:
            tomllib.loads(fixed)
            yield from upload(fixed, path)


def recheck(target: Host, settings: NodeSettings) -> None:
    """Read the runtime's facts again after the change and restart: what the step found must be gone."""
    status, stdout, stderr = connection.run(target, RuntimeConfig().command())
    if not status:
        raise GpunodeError(f"could not read the runtime's facts again after the change: {' '.join(stderr).strip()}",
                           "run 'gpunode verify' on the host")
    left = failures(diagnose(RuntimeConfig().process(stdout), settings))
    if left:
        raise GpunodeError("the runtime step changed the config and restarted the runtime, but the check still "
                           "fails:\n" + "\n".join(str(f) for f in left),
                           left[0].fix or "run 'gpunode doctor' on the host")
    target.log("runtime re-checked after the change: the nvidia runtime is in place")


@operation(is_idempotent=False)
def rechecked(settings: NodeSettings):
    """
    Read the runtime's effective config again after this run changed and restarted it, and fail the host
    if what the step set out to fix is still wrong (a change that fixes nothing must not report success).
    Gate it on the configure operation (``_if=configure.did_change``).

    + settings: the host's gpunode settings
    """
    yield control_command(recheck, settings)


@operation(is_idempotent=False)
def restarted(settings: NodeSettings, stamp: str):
    """
    Restart the runtime and wait until it answers (``ctr version`` / ``docker info``).
    If it does not within ``runtime_restart_timeout`` seconds: restore this run's
    backups, restart again and fail with the runtime's own log. Gate it on the
    configure operation (``_if=configure.did_change``).

    + settings: the host's gpunode settings (container_runtime, runtime_restart_timeout)
    + stamp: this run's backup folder
    """
    runtime = chosen_runtime(step_fact(host, "runtime", RuntimeConfig), settings)
    if runtime not in READY_CHECK:
        yield failing_command(f"no supported container runtime to restart (found {runtime!r})")
        return
    check = READY_CHECK[runtime]
    timeout = settings.runtime_restart_timeout
    yield "\n".join([
        "set -u",
        f"systemctl restart {runtime} || true",
        f"end=$(( $(date +%s) + {timeout} ))",
        f"until ( {check} ) >/dev/null 2>&1; do",
        "  if [ \"$(date +%s)\" -ge \"$end\" ]; then",
        f"    echo \"gpunode: {runtime} did not answer '{check.split(' &&')[0]}' within {timeout} s after the restart;"
        f" restoring the configs saved in {backup_dir(stamp)}\" >&2",
        f"    journalctl -u {runtime} -n 20 --no-pager >&2 2>/dev/null || true",
        f"    {restore_command(stamp)}",
        f"    systemctl restart {runtime} || true",
        "    exit 1",
        "  fi",
        "  sleep 0.5",
        "done",
    ])
