#!/usr/bin/python3
"""Stand-in for nvidia-container-cli @TOOLKIT_VERSION@ (libnvidia-container, the driver's side) in a simulated node.

Everything above it is NVIDIA's own: containerd or docker call NVIDIA's
``nvidia-container-runtime``, which in legacy mode adds NVIDIA's
``nvidia-container-runtime-hook`` as the container's prestart hook; runc runs the
hook, which reads the toolkit's config.toml and the container's environment
(NVIDIA_VISIBLE_DEVICES, the volume-mounts strategy, NVIDIA_REQUIRE_*,
NVIDIA_DRIVER_CAPABILITIES) and execs this program as
``nvidia-container-cli [--load-kmods ...] configure --ldconfig=... --device=...
--compute --utility --require=... --pid=PID ROOTFS``. The real one is C that talks
to the kernel driver, which a simulated node has not got; this one does what it
does with the simulated driver, inside the container's mount namespace (entered by
``--pid``, before runc's pivot_root, as the real one does):

- fails as it fails: an ``--ldconfig=@<path>`` whose host path does not exist
  ("ldcache error"), a ``--require`` the driver does not meet ("requirement
  error"; space-separated alternatives, comma-separated terms that must all hold);
  runc then reports the hook's exit and words to containerd or docker itself;
- creates the selected GPUs' device nodes, /dev/nvidiactl and /dev/nvidia-uvm
  (with the node's modes; a node the driver has not created is left out);
- mounts the simulated driver's ``libnvidia-ml.so.1`` (NVML's C ABI over the node's
  GPU state) where the driver installs it, and an ``nvidia-smi`` that lists exactly
  the selected GPUs;
- and what stands for the hardware itself: the node's GPU state file and its
  health-event folder (read-only, what the simulated NVML reads), and the node's
  CUDA-context folder, where the workload image's CUDA probe takes a GPU in an
  exclusive compute mode. A context's owner is the container's first process
  (``/run/gpunode-sim/container/owner``: its pid and start time on the node); a
  lock whose owner is gone is freed at the next configure, as the driver frees a
  dead process's context.
"""

import json
import os
import shutil
import subprocess
import sys

VERSION = "@TOOLKIT_VERSION@"
STATE = "/etc/gpunode-sim/gpu.json"
SELECTED_DIR = "/run/gpunode-sim/containers"  # one folder per GPU container: its nvidia-smi and its owner
EVENTS_DIR = "/run/gpunode-sim/events"
LIBRARY = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"  # where the driver installs NVML
CONTEXTS = "/run/gpunode-sim/contexts"  # one folder per GPU in an exclusive compute mode while a context holds it
OWNER_AT = "/run/gpunode-sim/container"  # where a container finds its own owner file


class CliFailed(Exception):
    """What nvidia-container-cli prints before it exits 1."""


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


def check_require(requirements: list[str], state: dict) -> None:
    """Each ``--require`` (one NVIDIA_REQUIRE_* value, as the hook passes it) judged against the driver."""
    facts = {"cuda": str(state.get("cuda_version", "")), "driver": str(state.get("driver_version", ""))}
    for requirement in requirements:
        groups = requirement.split()
        if not groups or any(all(term_holds(term, facts) for term in group.split(",")) for group in groups):
            continue
        first = next((term for group in groups for term in group.split(",") if term.startswith("cuda")), groups[0])
        raise CliFailed(f"nvidia-container-cli: requirement error: unsatisfied condition: {first}, please update "
                        "your driver to a newer version, or use an earlier cuda container")


def check_ldconfig(ldconfig: str) -> None:
    """``@<path>`` is a path on the host, which must exist (the cli runs it to refresh the container's cache)."""
    if ldconfig.startswith("@") and not os.path.exists(ldconfig[1:]):
        raise CliFailed(f"nvidia-container-cli: ldcache error: open failed: {ldconfig[1:]}: no such file or "
                        "directory")


def parse(argv: list[str]) -> tuple[dict[str, list[str]], str]:
    """``configure``'s options (``--name=value`` or bare flags, repeatable) and its ROOTFS argument."""
    options: dict[str, list[str]] = {}
    rest = argv[argv.index("configure") + 1:]
    rootfs = ""
    for arg in rest:
        if arg.startswith("--"):
            name, _, value = arg[2:].partition("=")
            options.setdefault(name, []).append(value)
        else:
            rootfs = arg
    if not rootfs:
        raise CliFailed("nvidia-container-cli: configure: missing ROOTFS argument")
    return options, rootfs


def selected_gpus(devices: list[str], gpus: list[dict]) -> list[dict]:
    """The GPUs ``--device`` names (``all``, indexes, GPU or MIG UUIDs, ``GPU:MIG`` indexes; a MIG device gives its
    GPU here); a name that is none of this node's is refused as the real cli refuses it."""
    wanted = [item.strip() for value in devices for item in value.split(",") if item.strip()]
    if "all" in wanted:
        return gpus
    chosen: list[dict] = []
    for item in wanted:
        gpu = next((g for g in gpus if item in (g["uuid"], str(g["index"]))
                    or item in [m.get("uuid") for m in g.get("mig_devices") or []]
                    or (":" in item and item.split(":", 1)[0] == str(g["index"])
                        and item.split(":", 1)[1].isdigit()
                        and int(item.split(":", 1)[1]) < len(g.get("mig_devices") or []))), None)
        if gpu is None:
            raise CliFailed(f"nvidia-container-cli: device error: {item}: unknown device")
        if gpu not in chosen:
            chosen.append(gpu)
    return [g for g in gpus if g in chosen]  # in the node's order, as NVML enumerates them in the container


def start_time(pid: str) -> str | None:
    """A process's start time on this node (field 22 of /proc/PID/stat), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(owner: str) -> bool:
    """Whether an owner ("PID STARTTIME") still runs; an owner in another form is not this program's to free."""
    pid, _, started = owner.strip().partition(" ")
    if not (pid.isdigit() and started.isdigit()):
        return True
    return start_time(pid) == started


def free_dead_contexts() -> None:
    """Free the contexts (and the per-container folders) of containers whose first process is gone."""
    for folder in [os.path.join(parent, n) for parent in (CONTEXTS, SELECTED_DIR) for n in _list(parent)]:
        try:
            with open(os.path.join(folder, "owner")) as handle:
                owner = handle.read()
        except OSError:
            continue
        if not alive(owner):
            shutil.rmtree(folder, ignore_errors=True)


def _list(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def mount_script(rootfs: str, gpus: list[dict], folder: str) -> str:
    """The shell lines run in the container's mount namespace: device nodes, then bind mounts."""
    lines = ["set -e"]
    for device in [f"/dev/nvidia{g['minor']}" for g in gpus] + ["/dev/nvidiactl", "/dev/nvidia-uvm"]:
        try:
            st = os.stat(device)
        except FileNotFoundError:
            continue  # not created by the driver on this node
        target = rootfs + device
        lines.append(f"rm -f '{target}'; mknod -m {st.st_mode & 0o7777:o} '{target}' c "
                     f"{os.major(st.st_rdev)} {os.minor(st.st_rdev)}")
    binds = [(os.path.join(folder, "nvidia-smi"), "/usr/bin/nvidia-smi", "file", "ro")]
    if os.path.exists(LIBRARY):
        binds.append((os.path.realpath(LIBRARY), LIBRARY, "file", "ro"))
    binds += [(STATE, STATE, "file", "ro"), (EVENTS_DIR, EVENTS_DIR, "dir", "ro"), (folder, OWNER_AT, "dir", "ro"),
              (CONTEXTS, CONTEXTS, "dir", "rw")]
    for source, destination, kind, mode in binds:
        target = rootfs + destination
        make = f"mkdir -p '{target}'" if kind == "dir" else (
            f"mkdir -p '{os.path.dirname(target)}'; [ -e '{target}' ] || : > '{target}'")
        lines.append(f"{make}; mount --bind '{source}' '{target}'")
        if mode == "ro":
            lines.append(f"mount -o remount,bind,ro '{target}'")
    return "\n".join(lines) + "\n"


def configure(argv: list[str]) -> None:
    options, rootfs = parse(argv)
    for ldconfig in options.get("ldconfig", []):
        check_ldconfig(ldconfig)
    with open(STATE) as handle:
        state = json.load(handle)
    check_require(options.get("require", []), state)
    pid = (options.get("pid") or [""])[0]
    if not pid or start_time(pid) is None:
        raise CliFailed(f"nvidia-container-cli: container error: failed to get process: no such process: {pid}")
    free_dead_contexts()
    gpus = selected_gpus(options.get("device", []), state.get("gpus", []))
    name = os.path.basename(os.path.dirname(rootfs.rstrip("/"))) or pid
    folder = os.path.join(SELECTED_DIR, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "owner"), "w") as handle:
        handle.write(f"{pid} {start_time(pid)}\n")
    lines = "".join(f"GPU {i}: {g['name']} (UUID: {g['uuid']})\\n" for i, g in enumerate(gpus))
    smi = os.path.join(folder, "nvidia-smi")
    with open(smi, "w") as handle:
        handle.write("#!/bin/sh\n# nvidia-smi of the simulated driver, as mounted by nvidia-container-cli\n"
                     "# NVML opens /dev/nvidiactl read-write first; as the real one, fail where this user cannot\n"
                     "if [ ! -r /dev/nvidiactl ] || [ ! -w /dev/nvidiactl ]; then\n"
                     "  echo 'Failed to initialize NVML: Insufficient Permissions'; exit 255\nfi\n"
                     f"printf '{lines}'\n")
    os.chmod(smi, 0o755)
    os.makedirs(EVENTS_DIR, exist_ok=True)
    os.makedirs(CONTEXTS, exist_ok=True)
    os.chmod(CONTEXTS, 0o1777)  # any user's container takes a context; none removes another's lock
    result = subprocess.run(["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--", "/bin/sh", "-c",
                             mount_script(rootfs, gpus, folder)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CliFailed(f"nvidia-container-cli: mount error: {result.stderr.strip() or result.stdout.strip()}")


def main(argv: list[str]) -> None:
    if "configure" not in argv:  # --version, info, list: what the toolkit's facts read
        print(f"cli-version: {VERSION}\nlib-version: {VERSION}")
        return
    try:
        configure(argv)
    except CliFailed as error:
        print(error, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
