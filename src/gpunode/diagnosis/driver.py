"""Diagnosis of the driver step: is the NVIDIA driver loaded, recent enough, consistent and complete?"""

from __future__ import annotations

from gpunode.diagnosis import Finding, Verdict, with_proof
from gpunode.gpu_generations import GENERATION_MINIMUM, gpu_family
from gpunode.settings import NodeSettings, version_key

STEP = "driver"
DRIVER_DOWN = "couldn't communicate with the NVIDIA driver"
MISMATCH = "Driver/library version mismatch"
REBOOT_REQUIRED = "reboot-required"
REBOOT_FIX = ("reboot the node (drain it first) so the new kernel module loads; with reboot_on_mismatch = True "
              "gpunode cordons, drains, reboots, re-checks and uncordons it")


def fail(what: str, evidence: list[str], fix: str, code: str = "") -> Finding:
    return Finding(STEP, Verdict.FINDING, what, evidence, fix, code)


def diagnose(state: dict, settings: NodeSettings) -> list[Finding]:
    """Findings for the driver step; without a failure, the last one is the proof the driver is fit."""
    smi = state["nvidia_smi"]
    rc, output = smi["rc"], smi["output"]
    first = output[0] if output else ""
    modules = state["modules"]
    if rc == 127 and not state["module_version"] and not state["devices"]:
        if "nouveau" in modules:
            return [nouveau_finding(modules)]
        if settings.gpu_required:
            return [fail("no NVIDIA driver is installed (nvidia-smi not found, no nvidia module, no /dev/nvidia*)",
                         [f"nvidia-smi: exit {rc} (command not found)"],
                         "install the NVIDIA driver (e.g. apt-get install nvidia-driver-550-server) and reboot, "
                         "or set gpu_required: false for this host")]
        return [Finding(STEP, Verdict.NOT_CHECKED, "CPU-only host: no NVIDIA driver and no GPU (gpu_required is false)",
                        [f"nvidia-smi: exit {rc} (command not found)"])]
    if "nouveau" in modules and "nvidia" not in modules:
        return [nouveau_finding(modules)]
    if rc == 9 or DRIVER_DOWN in first:
        return [fail("the NVIDIA kernel module is not loaded: nvidia-smi cannot reach the driver",
                     [f"nvidia-smi (exit {rc}): {first}"],
                     "load it with 'modprobe nvidia' and read 'dmesg | grep -i nvrm' if that fails "
                     "(Secure Boot: 'Key was rejected by service' means the module is not signed)")]
    if MISMATCH in " ".join(output) or rc == 18:
        return [fail("driver upgraded without reboot: the loaded kernel module and the user-space driver differ",
                     [f"nvidia-smi (exit {rc}): {first}",
                      f"/sys/module/nvidia/version: {state['module_version'] or 'absent'}"],
                     REBOOT_FIX, REBOOT_REQUIRED)]
    if rc == 15 or "GPU is lost" in " ".join(output):
        return [fail("a GPU has fallen off the bus (Xid 79): the driver lost it",
                     [f"nvidia-smi (exit {rc}): {first}"],
                     "drain and reboot the node; if it recurs, check the GPU's power and seating (hardware ticket)")]
    if rc == 6 or "No devices were found" in first:
        return [fail("the driver is loaded but no GPU initialised", [f"nvidia-smi (exit {rc}): {first}"],
                     "check 'dmesg | grep -i nvrm' (probe errors, nouveau, NVRM: The NVIDIA probe routine...)")]
    if rc != 0 or not smi["gpus"]:
        return [fail(f"nvidia-smi failed (exit {rc})", output[:3] or [f"nvidia-smi: exit {rc}, no output"],
                     "run 'nvidia-smi' on the node and read its message")]
    return with_proof(healthy_driver_checks(state, settings), STEP, "the driver is loaded and sees every GPU",
                      driver_evidence(state))


def driver_evidence(state: dict) -> list[str]:
    """What was read that shows a working driver: nvidia-smi's GPUs, the loaded module, the device nodes."""
    gpus = state["nvidia_smi"]["gpus"]
    names: dict[str, int] = {}
    for gpu in gpus:
        names[gpu["name"]] = names.get(gpu["name"], 0) + 1
    evidence = [f"nvidia-smi --query-gpu: {len(gpus)} GPU(s) ("
                + ", ".join(f"{count} x {name}" for name, count in names.items())
                + f"), driver_version {gpus[0]['driver_version']}",
                f"/sys/module/nvidia/version: {state['module_version'] or 'absent'}",
                f"device nodes: {', '.join(state['devices']) or 'none'}"]
    health = state.get("health") or []
    if health:
        evidence.append("nvidia-smi ecc.errors.uncorrected.volatile.total, compute_mode: " + ", ".join(
            f"GPU {row['index']} {row['ecc_uncorrected']} {row['compute_mode']}" for row in health))
    modes = state.get("device_modes") or {}
    if modes:
        evidence.append("device modes: " + ", ".join(f"{path} {mode}" for path, mode in sorted(modes.items())))
    if state["nvswitch_count"]:
        fm = state["fabricmanager"]
        evidence += [f"/proc/driver/nvidia-nvswitch/devices: {state['nvswitch_count']} NVSwitch(es)",
                     f"systemctl is-active nvidia-fabricmanager: {fm['active']}, version {fm['version'] or 'unknown'}",
                     f"nvidia-smi fabric.state, fabric.status: {'; '.join(state['fabric']) or 'not reported'}"]
    return evidence


def nouveau_finding(modules: list[str]) -> Finding:
    return fail("nouveau is bound to the GPUs instead of the NVIDIA driver",
                [f"lsmod: {', '.join(modules)}"],
                "blacklist nouveau ('blacklist nouveau' and 'options nouveau modeset=0' in "
                "/etc/modprobe.d/blacklist-nouveau.conf), update-initramfs -u, reboot")


def healthy_driver_checks(state: dict, settings: NodeSettings) -> list[Finding]:
    findings: list[Finding] = []
    gpus = state["nvidia_smi"]["gpus"]
    driver = gpus[0]["driver_version"]
    if version_key(driver) < version_key(settings.driver_min_version):
        findings.append(fail(f"driver {driver} is older than the configured minimum {settings.driver_min_version}",
                             [f"nvidia-smi driver_version: {driver}"],
                             f"upgrade the driver to {settings.driver_min_version} or later, or lower "
                             "driver_min_version in the inventory"))
    for gpu in gpus:
        family = gpu_family(gpu["name"], gpu["compute_cap"])
        minimum = GENERATION_MINIMUM.get(family or "")
        if minimum and version_key(driver) < version_key(minimum):
            findings.append(fail(f"driver {driver} is too old for {gpu['name']} ({family}: needs >= {minimum})",
                                 [f"GPU {gpu['index']}: {gpu['name']}, driver {driver}"],
                                 f"upgrade the driver to {minimum} or later"))
            break
    module = state["module_version"]
    if module and module != driver:
        findings.append(fail("driver upgraded without reboot: the loaded kernel module and the user-space driver "
                             "differ", [f"/sys/module/nvidia/version: {module}", f"nvidia-smi driver: {driver}"],
                             REBOOT_FIX, REBOOT_REQUIRED))
    if "nvidia_uvm" not in state["modules"] or "/dev/nvidia-uvm" not in state["devices"]:
        findings.append(fail(
            "nvidia_uvm is not loaded or /dev/nvidia-uvm is missing: nvidia-smi works, but CUDA cannot initialise "
            "(cuInit fails in every GPU container)",
            [f"lsmod (nvidia*): {', '.join(state['modules']) or 'none'}",
             f"device nodes: {', '.join(state['devices']) or 'none'}"],
            "modprobe nvidia-uvm, then 'nvidia-modprobe -u -c 0' (creates /dev/nvidia-uvm); to load it at every boot: "
            "echo nvidia-uvm > /etc/modules-load.d/nvidia-uvm.conf", "uvm-missing"))
    expected = ["/dev/nvidiactl"] + [f"/dev/nvidia{gpu['index']}" for gpu in gpus]
    missing = [d for d in expected if d not in state["devices"]]
    if missing:
        findings.append(fail(f"device nodes missing: {', '.join(missing)}",
                             [f"present: {', '.join(state['devices']) or 'none'}"],
                             "run 'nvidia-modprobe -c 0 -u' or 'nvidia-smi' as root once to create them, or "
                             "install the nvidia-persistenced service"))
    findings += device_mode_checks(state)
    findings += memory_and_compute_checks(state)
    findings += persistence_checks(state)
    findings += reset_checks(state)
    findings += mig_checks(state)
    if state["nvswitch_count"]:
        findings += fabric_checks(state, driver)
    return findings


def mig_checks(state: dict) -> list[Finding]:
    """A GPU in MIG mode with no MIG device can run nothing: CUDA sees no device on it and the plugin offers none.
    MIG devices without their capability device nodes (/dev/nvidia-caps/nvidia-cap<N>, the minors in
    /proc/driver/nvidia-caps/mig-minors) cannot be handed to a container: the device plugin and the toolkit's CDI
    spec name those nodes for each MIG device."""
    gpus = state["nvidia_smi"]["gpus"]
    with_devices = [gpu for gpu in gpus if gpu.get("mig_devices")]
    if with_devices and state.get("mig_caps") == []:
        count = sum(len(gpu["mig_devices"]) for gpu in with_devices)
        return [fail(f"{count} MIG device(s) exist but /dev/nvidia-caps has no capability device node: no container "
                     "can be given a MIG device (each needs its GPU and compute instance's nvidia-cap<N> node)",
                     [f"nvidia-smi -L: GPU {g['index']} lists {len(g['mig_devices'])} MIG device(s)"
                      for g in with_devices] + [f"/dev/nvidia-caps/nvidia-cap*: {len(state['mig_caps'])} node(s)"],
                     "create the nodes as the driver's tools do: 'nvidia-modprobe -f "
                     "/proc/driver/nvidia/capabilities/mig/config -f /proc/driver/nvidia/capabilities/mig/monitor' "
                     "and, per instance, '-f /proc/driver/nvidia/capabilities/gpu<N>/mig/gi<G>/access' and "
                     "'.../gi<G>/ci<C>/access' (the minors are in /proc/driver/nvidia-caps/mig-minors)",
                     "mig-caps-missing")]
    empty = [gpu for gpu in gpus
             if str(gpu.get("mig_mode") or "").lower() == "enabled" and gpu.get("mig_devices") == []]
    if not empty:
        return []
    return [fail(f"MIG mode is on but no MIG device exists on GPU(s) {', '.join(str(g['index']) for g in empty)}: "
                 "no CUDA process can use them and the device plugin offers nothing from them",
                 [f"nvidia-smi -L: GPU {g['index']} ({g['uuid']}) lists no MIG device; mig.mode.current Enabled"
                  for g in empty],
                 f"create MIG instances (nvidia-smi mig -i {empty[0]['index']} -cgi <profiles> -C), or turn MIG "
                 f"off (nvidia-smi -i {empty[0]['index']} -mig 0, then reset the GPU)", "mig-no-devices")]


def memory_and_compute_checks(state: dict) -> list[Finding]:
    """Each GPU's memory fit to use (no uncorrectable ECC error waiting for a reset, no page or row repair pending,
    no failed row remap) and able to take a CUDA context (compute mode not Prohibited)."""
    uuids = {gpu["index"]: gpu["uuid"] for gpu in state["nvidia_smi"]["gpus"]}
    findings = []
    for row in state.get("health") or []:
        index = row["index"]
        where = f"GPU {index} ({uuids.get(index, '?')})"
        pending = (state.get("remapped_rows") or {}).get(uuids.get(index, ""), {})
        memory = [f"nvidia-smi ecc.errors.uncorrected.volatile.total: {row['ecc_uncorrected']}"]
        if row["retired_pending"] is not None:
            memory.append(f"nvidia-smi retired_pages.pending: {row['retired_pending']}")
        if pending:
            memory.append(f"nvidia-smi remapped_rows.pending: {pending['pending']}, failure: {pending['failure']}")
        if pending.get("failure", "No") not in ("No", "0"):
            findings.append(fail(f"{where}: a row remap failed: the GPU's memory cannot be repaired", memory,
                                 f"drain the node; the GPU goes back to the vendor (RMA) with 'nvidia-smi -q -i "
                                 f"{index}' and the node's Xid lines", "row-remap-failed"))
        elif (row["ecc_uncorrected"] or 0) > 0 or row["retired_pending"] == "Yes" \
                or pending.get("pending", "No") not in ("No", "0"):
            findings.append(fail(f"{where}: uncorrectable memory errors, repair pending until a GPU reset: jobs on "
                                 "it may fail or read bad data", memory,
                                 f"drain the node, then 'nvidia-smi -r -i {index}' (or reboot) retires the pages / "
                                 "remaps the rows; if it happens again, the GPU goes back to the vendor",
                                 "memory-repair-pending"))
        if row["compute_mode"] == "Prohibited":
            findings.append(fail(f"{where}: compute mode Prohibited: no process can create a CUDA context on it",
                                 [f"nvidia-smi compute_mode: {row['compute_mode']}"],
                                 f"nvidia-smi -i {index} -c DEFAULT (as root; it does not survive a reboot unless "
                                 "set again)", "compute-prohibited"))
    return findings


def persistence_checks(state: dict) -> list[Finding]:
    """GPUs with persistence mode off: the driver tears a GPU's state down whenever no process holds it, so each
    first CUDA call initialises it again (seconds) and its error state is not kept between jobs. NVIDIA recommends
    its persistence daemon on compute nodes; a warning, the link still holds."""
    off = [row for row in state.get("health") or [] if row.get("persistence_mode") == "Disabled"]
    if not off:
        return []
    gpus = ", ".join(str(row["index"]) for row in off)
    return [Finding(STEP, Verdict.FINDING, f"persistence mode is off on GPU(s) {gpus}:"
                    " the driver deinitialises them whenever no process holds them (each first CUDA call pays the "
                    "initialisation again)", [f"nvidia-smi persistence_mode: GPU {r['index']} {r['persistence_mode']}"
                                              for r in off],
                    "systemctl enable --now nvidia-persistenced (NVIDIA's persistence daemon, shipped with the driver)",
                    "persistence-mode-off", breaks=False)]


def reset_checks(state: dict) -> list[Finding]:
    """A GPU the driver says needs a reset (or a drain and reset) after an unrecoverable error: work on it fails or
    is not to be trusted until then. Read from nvidia-smi's reset_status fields; a driver without them is not
    judged here (its Xid lines and the plugin's health still are)."""
    uuids = {gpu["index"]: gpu["uuid"] for gpu in state["nvidia_smi"]["gpus"]}
    findings = []
    for row in state.get("reset_status") or []:
        index = row["index"]
        evidence = [f"nvidia-smi reset_status.reset_required: {row['reset_required']}, "
                    f"reset_status.drain_and_reset_recommended: {row['drain_and_reset_recommended']} (GPU {index})"]
        if row["reset_required"] == "Yes":
            findings.append(fail(f"GPU {index} ({uuids.get(index, '?')}) requires a reset: the driver hit an "
                                 "unrecoverable error on it, and new work on it fails until it is reset", evidence,
                                 f"drain the node (no process may hold the GPU), then 'nvidia-smi -r -i {index}' or "
                                 "reboot the node; read the node's Xid lines first (dmesg | grep -i xid): if the "
                                 "same error comes back, the GPU goes back to the vendor", "gpu-reset-required"))
        elif row["drain_and_reset_recommended"] == "Yes":
            findings.append(fail(f"GPU {index} ({uuids.get(index, '?')}): the driver recommends a drain and reset "
                                 "after an unrecoverable error: running jobs may continue, new ones should not "
                                 "start there", evidence,
                                 f"drain the node, then 'nvidia-smi -r -i {index}' or reboot it",
                                 "gpu-drain-and-reset"))
    return findings


def device_mode_checks(state: dict) -> list[Finding]:
    """The device nodes a container opens must be readable and writable by any user, as the driver creates them
    (0666, NVreg_DeviceFileMode): otherwise a container that does not run as root cannot open them where NVIDIA's
    legacy runtime bind-mounts the node's own device nodes. Containers given their GPUs through CDI are not
    affected (the CDI library has the runtime create their device nodes for the container's user), users on the
    node are."""
    modes = state.get("device_modes") or {}
    closed = {path: mode for path, mode in sorted(modes.items()) if int(mode[-3:], 8) & 0o006 != 0o006}
    if not closed:
        return []
    return [fail(f"GPU device node(s) not open to every user: {', '.join(closed)}; a container that does not run as "
                 "root and gets its GPUs from NVIDIA's legacy runtime fails with 'Failed to initialize NVML: "
                 "Insufficient Permissions', as do users other than root on the node (root, and containers given "
                 "GPUs through CDI, still work)",
                 [f"stat -c %a {path}: {mode}" for path, mode in closed.items()],
                 f"chmod 0666 {' '.join(closed)} (until the module reloads); then find what set the mode: "
                 "'grep -r NVreg_DeviceFileMode /etc/modprobe.d', a udev rule under /etc/udev/rules.d (the driver's "
                 "default is 0666)", "device-mode")]


def fabric_checks(state: dict, driver: str) -> list[Finding]:
    fm = state["fabricmanager"]
    evidence = [f"/proc/driver/nvidia-nvswitch/devices: {state['nvswitch_count']} NVSwitch(es)",
                f"systemctl is-active nvidia-fabricmanager: {fm['active']}"]
    if fm["active"] != "active":
        return [fail("NVSwitch node without a running nvidia-fabricmanager: CUDA fails with error 802 "
                     "'system not yet initialized'", evidence + [f"fabric: {', '.join(state['fabric']) or 'unknown'}"],
                     f"apt-get install nvidia-fabricmanager-{driver.split('.')[0]}={driver}-1 (the driver's exact "
                     "version) and systemctl enable --now nvidia-fabricmanager")]
    if fm["version"] and fm["version"] != driver:
        return [fail(f"nvidia-fabricmanager {fm['version']} does not match driver {driver}",
                     evidence + [f"nv-fabricmanager --version: {fm['version']}"],
                     f"install nvidia-fabricmanager at exactly {driver} and restart it")]
    if state["fabric"] and any(not line.startswith("Completed") for line in state["fabric"]):
        return [fail("NVSwitch fabric is not initialised (state is not Completed)",
                     evidence + [f"nvidia-smi fabric.state, fabric.status: {'; '.join(state['fabric'])}"],
                     "systemctl restart nvidia-fabricmanager and read journalctl -u nvidia-fabricmanager")]
    return []
