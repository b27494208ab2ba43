"""Facts of the driver step: what nvidia-smi, the kernel and the device nodes say.

Read in one remote command (each part is cheap), so a re-run costs a single
round trip per host for the whole driver check.
"""

from __future__ import annotations

import re

from pyinfra.api import FactBase

from gpunode.facts.sections import exit_code, section, split_sections

QUERY_FIELDS = "index,name,uuid,memory.total,driver_version,pci.bus_id,compute_cap,mig.mode.current"
QUERY_FIELDS_OLD = "index,name,uuid,memory.total,driver_version,pci.bus_id,mig.mode.current"


GPU_LINE = re.compile(r"^GPU ([0-9]+): .*\(UUID: (GPU-[^)]+)\)\s*$")  # nvidia-smi -L
MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+([0-9]+): \(UUID: (MIG-[^)]+)\)\s*$")  # and its MIG children
NUMBER = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() also takes digits int() refuses
MODE = re.compile(r"[0-7]{3,4}")  # a file mode as stat -c %a prints it

# NVIDIA's documented --query-gpu / --query-remapped-rows field names (nvidia-smi --help-query-gpu)
HEALTH_FIELDS = "index,ecc.errors.uncorrected.volatile.total,retired_pages.pending,compute_mode,persistence_mode"
REMAP_FIELDS = "gpu_uuid,remapped_rows.pending,remapped_rows.failure"
# the reset_status section (in the --help-query-gpu of recent drivers; an older nvidia-smi refuses these fields and
# the section stays empty: not read)
RESET_FIELDS = "index,reset_status.reset_required,reset_status.drain_and_reset_recommended"


class DriverState(FactBase):
    """The NVIDIA driver as the node sees it.

    .. code:: python

        {
            "nvidia_smi": {"rc": 0, "output": [...], "gpus": [{"index": 0, "name": "NVIDIA A100-SXM4-40GB",
                           "uuid": "GPU-...", "memory_mib": 40960, "driver_version": "550.54.15",
                           "pci_bus_id": "00000000:07:00.0", "compute_cap": "8.0", "mig_mode": "Disabled"}]},
            "module_version": "550.54.15",   # /sys/module/nvidia/version (None: module not loaded)
            "proc_version": "NVRM version: ...",
            "devices": ["/dev/nvidiactl", "/dev/nvidia0", ...],
            "device_modes": {"/dev/nvidiactl": "666", ...},   # as stat -c %a printed them
            "health": [{"index": 0, "ecc_uncorrected": 0, "retired_pending": "No", "compute_mode": "Default",
                        "persistence_mode": "Enabled"}],   # persistence_mode None: not read (older output)
            "remapped_rows": {"GPU-...": {"pending": "No", "failure": "No"}},   # Ampere and later
            "reset_status": [{"index": 0, "reset_required": "No", "drain_and_reset_recommended": "No"}],
            "mig_caps": ["/dev/nvidia-caps/nvidia-cap1", ...],   # MIG capability nodes (None: not read)
            "modules": ["nvidia", "nvidia_uvm", ...],   # nvidia* and nouveau from lsmod
            "nvswitch_count": 0,
            "fabricmanager": {"active": "active", "version": "550.54.15"},
            "fabric": ["Completed, Success"],
        }
    """

    def command(self) -> str:
        return "; ".join([
            section("smi"),
            "if command -v nvidia-smi >/dev/null 2>&1; then"
            f" out=$(nvidia-smi --query-gpu={QUERY_FIELDS} --format=csv,noheader,nounits 2>&1); rc=$?;"
            " if [ $rc -eq 2 ] && echo \"$out\" | grep -q 'is not a valid field'; then"
            f" out=$(nvidia-smi --query-gpu={QUERY_FIELDS_OLD} --format=csv,noheader,nounits 2>&1); rc=$?; fi;"
            " printf '%s\\n' \"$out\"; echo \"rc=$rc\"; else echo rc=127; fi",
            section("health"),  # only where nvidia-smi answered: its memory and compute state per GPU
            f"if [ \"${{rc:-1}}\" = 0 ]; then nvidia-smi --query-gpu={HEALTH_FIELDS} --format=csv,noheader,nounits"
            " 2>/dev/null; fi",
            section("mig"),  # only where a GPU has MIG mode on: nvidia-smi -L lists its MIG devices under it
            "if [ \"${rc:-1}\" = 0 ] && printf '%s\\n' \"$out\" | grep -q ', Enabled$'; then nvidia-smi -L"
            " 2>/dev/null; fi",
            section("caps"),  # only where a GPU has MIG mode on: the capability device nodes a MIG device needs
            "if [ \"${rc:-1}\" = 0 ] && printf '%s\\n' \"$out\" | grep -q ', Enabled$'; then"
            " for d in /dev/nvidia-caps/nvidia-cap*; do [ -c \"$d\" ] && echo \"$d\"; done; fi",
            section("remap"),
            f"if [ \"${{rc:-1}}\" = 0 ]; then nvidia-smi --query-remapped-rows={REMAP_FIELDS} --format=csv,noheader"
            " 2>/dev/null; fi",
            section("reset"),
            f"if [ \"${{rc:-1}}\" = 0 ]; then nvidia-smi --query-gpu={RESET_FIELDS} --format=csv,noheader"
            " 2>/dev/null; fi",
            section("module"), "cat /sys/module/nvidia/version 2>/dev/null",
            section("proc"), "head -n 1 /proc/driver/nvidia/version 2>/dev/null",
            section("devices"),
            "for d in /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia[0-9]*; do [ -c \"$d\" ] && "
            "{ stat -c '%a %n' \"$d\" 2>/dev/null || echo \"$d\"; }; done",
            section("modules"),
            "lsmod 2>/dev/null | awk 'NR>1 && ($1 ~ /^nvidia/ || $1 == \"nouveau\") {print $1}'",
            section("nvswitch"),
            "if [ -d /proc/driver/nvidia-nvswitch ]; then grep -c . /proc/driver/nvidia-nvswitch/devices"
            " 2>/dev/null || echo 0; else echo 0; fi",
            section("fabricmanager"),
            "if [ -s /proc/driver/nvidia-nvswitch/devices ]; then systemctl is-active nvidia-fabricmanager"
            " 2>/dev/null || true; nv-fabricmanager --version 2>/dev/null | sed -n 's/.*version is : *//p'; fi",
            section("fabric"),
            "if [ -s /proc/driver/nvidia-nvswitch/devices ]; then nvidia-smi"
            " --query-gpu=fabric.state,fabric.status --format=csv,noheader 2>/dev/null | sort -u; fi",
            "true",
        ])

    def process(self, output: list[str]) -> dict:
        parts = split_sections(output)
        health = []
        for line in parts.get("health", []):
            values = [v.strip() for v in line.split(",")]
            if len(values) in (4, 5) and NUMBER.fullmatch(values[0]):
                index, ecc, retired, compute = values[:4]
                persistence = values[4] if len(values) == 5 and "N/A" not in values[4] else None
                health.append({"index": int(index), "ecc_uncorrected": int(ecc) if NUMBER.fullmatch(ecc) else None,
                               "retired_pending": None if "N/A" in retired else retired, "compute_mode": compute,
                               "persistence_mode": persistence})
        remapped = {}
        for line in parts.get("remap", []):
            values = [v.strip() for v in line.split(",")]
            if len(values) == 3 and values[0].startswith("GPU-"):
                remapped[values[0]] = {"pending": values[1], "failure": values[2]}
        resets = []
        for line in parts.get("reset", []):
            values = [v.strip() for v in line.split(",")]
            if len(values) == 3 and NUMBER.fullmatch(values[0]) and "N/A" not in values[1]:
                resets.append({"index": int(values[0]), "reset_required": values[1],
                               "drain_and_reset_recommended": values[2]})
        rc, smi_lines = exit_code(parts.get("smi", []))
        gpus = []
        if rc == 0:
            for line in smi_lines:
                values = [v.strip() for v in line.split(",")]
                if len(values) == 8:
                    index, name, uuid, memory, driver, bus, cap, mig = values
                elif len(values) == 7:
                    index, name, uuid, memory, driver, bus, mig = values
                    cap = None
                else:
                    continue
                if not NUMBER.fullmatch(index):  # not a row of the query: the diagnosis quotes the output as it came
                    continue
                gpus.append({
                    "index": int(index), "name": name, "uuid": uuid,
                    "memory_mib": int(memory) if NUMBER.fullmatch(memory) else None,
                    "driver_version": driver, "pci_bus_id": bus, "compute_cap": cap,
                    "mig_mode": None if mig in ("[N/A]", "N/A") else mig,
                })
        if "mig" in parts and parts["mig"]:  # MIG devices per GPU, where nvidia-smi -L was asked (MIG mode on)
            migs: dict[int, list[str]] = {}
            current = None
            for line in parts["mig"]:
                gpu_match, mig_match = GPU_LINE.match(line), MIG_LINE.match(line)
                if gpu_match:
                    current = int(gpu_match.group(1))
                    migs[current] = []
                elif mig_match and current is not None:
                    migs[current].append(mig_match.group(1))
            for gpu in gpus:
                if gpu["index"] in migs:
                    gpu["mig_devices"] = migs[gpu["index"]]
        fm = parts.get("fabricmanager", [])
        module = parts.get("module", [])
        proc = parts.get("proc", [])
        switches = parts.get("nvswitch", ["0"])
        devices, modes = [], {}
        for line in parts.get("devices", []):  # "MODE PATH" as stat prints it, or the path alone
            mode, _, path = line.strip().rpartition(" ")
            devices.append(path)
            if MODE.fullmatch(mode):
                modes[path] = mode
        return {
            "nvidia_smi": {"rc": rc, "output": smi_lines, "gpus": gpus},
            "module_version": module[0].strip() if module else None,
            "proc_version": proc[0].strip() if proc else None,
            "devices": devices,
            "device_modes": modes,
            "health": health,
            "remapped_rows": remapped,
            "reset_status": resets,
            "mig_caps": parts["caps"] if "caps" in parts else None,
            "modules": parts.get("modules", []),
            "nvswitch_count": int(switches[0]) if switches and NUMBER.fullmatch(switches[0].strip()) else 0,
            "fabricmanager": {"active": fm[0] if fm else "unknown", "version": fm[1] if len(fm) > 1 else None},
            "fabric": parts.get("fabric", []),
        }
