#!/usr/bin/python3
"""Stand-in for nvidia-container-runtime @TOOLKIT_VERSION@ in a simulated node.

An OCI runtime that hands every call to runc, as the real one does. On
``create``, when the container's environment sets NVIDIA_VISIBLE_DEVICES (not
``void``/``none``/empty), it does what the real prestart hook does for the
simulated driver: the selected GPUs' device nodes, /dev/nvidiactl and
/dev/nvidia-uvm, and an ``nvidia-smi`` that lists exactly those GPUs (the node's
simulated GPU state), bound into the container. Where the real hook mounts the
driver's libraries, this one mounts the simulated driver's ``libnvidia-ml.so.1``
(NVML's C ABI over the node's GPU state, built by ``gpunode sim build``) with the
state it reads (the GPU state file and the health-event folder), so an NVML user
such as the device plugin's image runs its production backend unchanged. Under
plain runc none of it happens, so the container sees no GPU and no NVML.

Before injecting it reads the toolkit's config.toml as the real hook does, and fails
the way the real stack fails where the host cannot do what that file asks: an
``ldconfig = "@<path>"`` whose host path does not exist fails every GPU container
with nvidia-container-cli's words, written to the runtime's log as runc writes a
failed hook, so containerd reports it as "OCI runtime create failed". Likewise an
image whose NVIDIA_REQUIRE_CUDA the node's driver does not meet (``cuda>=X`` and
``driver`` terms; space-separated alternatives, comma-separated terms that must
all hold; ``NVIDIA_DISABLE_REQUIRE`` turns the check off, as for the real hook).

What the GPU itself enforces, a compute mode, is the driver's: the node's CUDA contexts are lock folders in one
shared folder (``CONTEXTS``, mounted into every GPU container, named by the container's id), which the workload
image's CUDA probe takes for a GPU in an exclusive compute mode; on ``delete`` this runtime frees the locks the
container still held (a process killed before it released them), as the driver frees a dead process's context.
"""

import datetime
import json
import os
import shutil
import sys
import tomllib

STATE = "/etc/gpunode-sim/gpu.json"
SELECTED_DIR = "/run/gpunode-sim/containers"
EVENTS_DIR = "/run/gpunode-sim/events"
LIBRARY = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"  # where the driver installs NVML, and the hook mounts it
# accept-nvidia-visible-devices-as-volume-mounts = true, as the device plugin's volume-mounts strategy needs
VOLUME_MOUNTS = "/var/run/nvidia-container-devices"
CONFIG = "/etc/nvidia-container-runtime/config.toml"
CONTEXTS = "/run/gpunode-sim/contexts"  # one folder per GPU in an exclusive compute mode while a context holds it


class HookFailed(Exception):
    """What the real prestart hook (nvidia-container-cli) prints before it exits 1."""


def check_config() -> None:
    try:
        with open(CONFIG, "rb") as handle:
            config = tomllib.load(handle)
    except FileNotFoundError:
        return  # the runtime's defaults, which nvidia-ctk computes for this host
    ldconfig = str(config.get("nvidia-container-cli", {}).get("ldconfig", "@/sbin/ldconfig"))
    if ldconfig.startswith("@") and not os.path.exists(ldconfig[1:]):
        raise HookFailed(f"nvidia-container-cli: ldcache error: open failed: {ldconfig[1:]}: no such file or "
                         "directory")


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def term_holds(term: str, facts: dict[str, str]) -> bool:
    for op in (">=", "<=", "=", ">", "<"):
        name, found, wanted = term.partition(op)
        if found:
            have = facts.get(name.strip())
            if have is None:
                return False  # brand, arch: not simulated, so never satisfied here
            a, b = version_key(have), version_key(wanted.strip())
            return {">=": a >= b, "<=": a <= b, "=": a == b, ">": a > b, "<": a < b}[op]
    return False


def check_require(env: dict[str, str], state: dict) -> None:
    """NVIDIA_REQUIRE_CUDA as nvidia-container-cli judges it against the driver."""
    if env.get("NVIDIA_DISABLE_REQUIRE", "").lower() in ("1", "true", "yes"):
        return
    require = env.get("NVIDIA_REQUIRE_CUDA", "").split()
    if not require:
        return
    facts = {"cuda": str(state.get("cuda_version", "")), "driver": str(state.get("driver_version", ""))}
    if any(all(term_holds(term, facts) for term in group.split(",")) for group in require):
        return
    first = next((term for group in require for term in group.split(",") if term.startswith("cuda")), require[0])
    raise HookFailed(f"nvidia-container-cli: requirement error: unsatisfied condition: {first}, please update your "
                     "driver to a newer version, or use an earlier cuda container")


def fail_as_runc(argv: list[str], error: HookFailed) -> None:
    """Write the error where runc writes a failed create (the --log file containerd reads), then exit 1."""
    message = ("runc create failed: unable to start container process: error during container init: error running "
               f"hook #0: error running hook: exit status 1, stdout: , stderr: {error}")
    log = next((argv[i + 1] for i, a in enumerate(argv) if a == "--log" and i + 1 < len(argv)), None)
    if log:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with open(log, "a") as handle:
            handle.write(json.dumps({"level": "error", "msg": message, "time": stamp}) + "\n")
    print(message, file=sys.stderr)
    sys.exit(1)


def visible(env: list[str]) -> str | None:
    values = dict(item.split("=", 1) for item in env if "=" in item)
    chosen = values.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    return None if chosen in ("", "void", "none") else chosen


def selected_gpus(chosen: str, mounts: list[dict]) -> list[dict]:
    with open(STATE) as handle:
        gpus = json.load(handle).get("gpus", [])
    if chosen == "all":
        return gpus
    if chosen == VOLUME_MOUNTS:  # the device plugin's volume-mounts strategy: one mount per device under it
        wanted = [m["destination"].rsplit("/", 1)[1] for m in mounts
                  if m.get("destination", "").startswith(VOLUME_MOUNTS + "/")]
    else:
        wanted = [item.strip() for item in chosen.split(",")]
    return [g for g in gpus if g["uuid"] in wanted or str(g["index"]) in wanted]


def inject(bundle: str, container: str) -> None:
    path = os.path.join(bundle, "config.json")
    with open(path) as handle:
        spec = json.load(handle)
    chosen = visible(spec.get("process", {}).get("env", []))
    if chosen is None:
        return
    check_config()
    with open(STATE) as handle:
        check_require(dict(item.split("=", 1) for item in spec.get("process", {}).get("env", []) if "=" in item),
                      json.load(handle))
    gpus = selected_gpus(chosen, spec.get("mounts", []))
    folder = os.path.join(SELECTED_DIR, container)
    os.makedirs(folder, exist_ok=True)
    smi = os.path.join(folder, "nvidia-smi")
    lines = "".join(f"GPU {i}: {g['name']} (UUID: {g['uuid']})\\n" for i, g in enumerate(gpus))
    with open(smi, "w") as handle:
        handle.write("#!/bin/sh\n# nvidia-smi of the simulated driver, as mounted by nvidia-container-runtime\n"
                     "# NVML opens /dev/nvidiactl read-write first; as the real one, fail where this user cannot\n"
                     "if [ ! -r /dev/nvidiactl ] || [ ! -w /dev/nvidiactl ]; then\n"
                     "  echo 'Failed to initialize NVML: Insufficient Permissions'; exit 255\nfi\n"
                     f"printf '{lines}'\n")
    os.chmod(smi, 0o755)
    mounts = spec.setdefault("mounts", [])
    mounts.append({"destination": "/usr/bin/nvidia-smi", "type": "bind", "source": smi,
                   "options": ["rbind", "ro"]})
    for device in [f"/dev/nvidia{g['minor']}" for g in gpus] + ["/dev/nvidiactl", "/dev/nvidia-uvm"]:
        if os.path.exists(device):
            mounts.append({"destination": device, "type": "bind", "source": device, "options": ["rbind"]})
    # the simulated driver's "libraries": its state for NVML users, read-only
    os.makedirs(EVENTS_DIR, exist_ok=True)
    mounts.append({"destination": STATE, "type": "bind", "source": STATE, "options": ["rbind", "ro"]})
    mounts.append({"destination": EVENTS_DIR, "type": "bind", "source": EVENTS_DIR, "options": ["rbind", "ro"]})
    os.makedirs(CONTEXTS, exist_ok=True)
    os.chmod(CONTEXTS, 0o1777)  # any user's container takes a context; none removes another's lock
    mounts.append({"destination": CONTEXTS, "type": "bind", "source": CONTEXTS, "options": ["rbind", "rw"]})
    process = spec.setdefault("process", {})
    env = [f"GPUNODE_SIM_HEALTH_EVENTS={EVENTS_DIR}/health-events",  # where the simulated NVML reads its events
           f"GPUNODE_SIM_CONTAINER={container}"]  # who holds a context: freed when the container is deleted
    if os.path.exists(LIBRARY):  # the simulated driver's NVML, mounted where the real hook mounts the driver's
        mounts.append({"destination": LIBRARY, "type": "bind", "source": os.path.realpath(LIBRARY),
                       "options": ["rbind", "ro"]})
    else:  # a node started before the library existed: the plugin's simulated backend reads the same state
        env.append("GPUNODE_PLUGIN_BACKEND=sim")
    process["env"] = [*process.get("env", []), *env]
    with open(path, "w") as handle:
        json.dump(spec, handle)


def release_contexts(container: str) -> None:
    """Free the contexts a deleted container still held (its process was killed before it let them go)."""
    try:
        locks = os.listdir(CONTEXTS)
    except FileNotFoundError:
        return
    for lock in locks:
        folder = os.path.join(CONTEXTS, lock)
        try:
            with open(os.path.join(folder, "owner")) as handle:
                owner = handle.read().strip()
        except OSError:
            continue
        if owner == container:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> None:
    if "delete" in argv and argv[-1] != "delete":
        release_contexts(argv[-1])
    if "create" in argv:
        bundle = next((argv[i + 1] for i, a in enumerate(argv) if a in ("--bundle", "-b") and i + 1 < len(argv)),
                      os.getcwd())
        try:
            inject(bundle, argv[-1])
        except HookFailed as error:
            fail_as_runc(argv, error)
    os.execvp("runc", ["runc", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
