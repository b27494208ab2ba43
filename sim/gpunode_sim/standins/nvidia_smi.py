#!/usr/bin/python3
"""Stand-in for ``nvidia-smi`` inside a simulated node.

Reads the node's driver state from /etc/gpunode-sim/gpu.json and prints what the
real tool prints for it: the summary table, ``-L``, ``-q`` and
``--query-gpu=... --format=csv[,noheader][,nounits]``, with the real exit codes
and failure messages (driver not loaded, version mismatch, no devices, GPU
lost). Stdlib only: it runs under the node's own Debian python3.
"""

from __future__ import annotations

import json
import os
import sys
import time

STATE_FILE = os.environ.get("GPUNODE_SIM_GPU_STATE", "/etc/gpunode-sim/gpu.json")
DRIVER_DOWN = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.")
EXIT_BAD_ARG, EXIT_QUERY_FAILED, EXIT_DRIVER, EXIT_LOST, EXIT_MISMATCH = 2, 6, 9, 15, 18
RESERVED_MIB = 635


def load_state() -> dict:
    with open(STATE_FILE) as handle:
        return json.load(handle)


def check_driver(state: dict) -> int:
    """Print the real failure message and return its exit code, or 0 if NVML would work."""
    if not state["loaded"]:
        print(DRIVER_DOWN)
        return EXIT_DRIVER
    if state["module_version"] != state["driver_version"]:
        print("Failed to initialize NVML: Driver/library version mismatch")
        if int(state["driver_version"].split(".")[0]) >= 570:
            print("NVML library version: " + ".".join(state["driver_version"].split(".")[:2]))
        return EXIT_MISMATCH
    if state["no_devices"] or not state["gpus"]:
        print("No devices were found")
        return EXIT_QUERY_FAILED
    return 0


def lost(gpu: dict) -> str:
    bus = gpu["pci_bus_id"][4:]
    return (f"Unable to determine the device handle for GPU{bus}: GPU is lost.  "
            "Reboot the system to recover this GPU")


def fabric(state: dict) -> dict:
    return state.get("fabric") or {"state": "N/A", "status": "N/A"}


def power_draw(gpu: dict) -> float:
    return round(gpu["power_limit_w"] * 0.14, 2)


FIELDS = {
    "index": (lambda s, g: str(g["index"]), ""),
    "count": (lambda s, g: str(len(s["gpus"])), ""),
    "name": (lambda s, g: g["name"], ""),
    "gpu_name": (lambda s, g: g["name"], ""),
    "uuid": (lambda s, g: g["uuid"], ""),
    "gpu_uuid": (lambda s, g: g["uuid"], ""),
    "serial": (lambda s, g: g["serial"], ""),
    "driver_version": (lambda s, g: s["driver_version"], ""),
    "pci.bus_id": (lambda s, g: g["pci_bus_id"], ""),
    "gpu_bus_id": (lambda s, g: g["pci_bus_id"], ""),
    "pci.device_id": (lambda s, g: g["pci_device_id"], ""),
    "memory.total": (lambda s, g: str(g["memory_total_mib"]), "MiB"),
    "memory.reserved": (lambda s, g: str(RESERVED_MIB), "MiB"),
    "memory.used": (lambda s, g: "0", "MiB"),
    "memory.free": (lambda s, g: str(g["memory_total_mib"] - RESERVED_MIB), "MiB"),
    "compute_cap": (lambda s, g: g["compute_cap"], ""),
    "mig.mode.current": (lambda s, g: g["mig_mode"] if g["mig_mode"] != "N/A" else "[N/A]", ""),
    "mig.mode.pending": (lambda s, g: g["mig_mode"] if g["mig_mode"] != "N/A" else "[N/A]", ""),
    "persistence_mode": (lambda s, g: g.get("persistence_mode", "Enabled"), ""),
    "temperature.gpu": (lambda s, g: "32", ""),
    "utilization.gpu": (lambda s, g: "0", "%"),
    "power.draw": (lambda s, g: f"{power_draw(g):.2f}", "W"),
    "power.limit": (lambda s, g: f"{g['power_limit_w']:.2f}", "W"),
    "fabric.state": (lambda s, g: fabric(s)["state"], ""),
    "fabric.status": (lambda s, g: fabric(s)["status"], ""),
    "vbios_version": (lambda s, g: "92.00.45.00.08", ""),
    "ecc.errors.uncorrected.volatile.total": (lambda s, g: str(g.get("ecc_uncorrected", 0)), ""),
    "retired_pages.pending": (lambda s, g: "[N/A]" if g.get("remapping") else (
        "Yes" if g.get("memory_pending") else "No"), ""),
    "compute_mode": (lambda s, g: g.get("compute_mode", "Default"), ""),
    "reset_status.reset_required": (lambda s, g: "Yes" if g.get("reset_required") else "No", ""),
    "reset_status.drain_and_reset_recommended": (lambda s, g: "No", ""),
}
# nvidia-smi --query-remapped-rows: the GPUs with row remapping (Ampere and later) only
REMAP_FIELDS = {
    "gpu_uuid": lambda g: g["uuid"],
    "gpu_bus_id": lambda g: g["pci_bus_id"],
    "remapped_rows.correctable": lambda g: "0",
    "remapped_rows.uncorrectable": lambda g: "1" if g.get("memory_pending") else "0",
    "remapped_rows.pending": lambda g: "Yes" if g.get("memory_pending") else "No",
    "remapped_rows.failure": lambda g: "No",
}


def remapped_rows(state: dict, fields: list[str], ids: list[int] | None) -> int:
    for field in fields:
        if field not in REMAP_FIELDS:
            print(f'Field "{field}" is not a valid field to query.', file=sys.stderr)
            return EXIT_BAD_ARG
    code = check_driver(state)
    if code:
        return code
    for gpu in selected(state, ids):
        if gpu.get("remapping"):
            print(", ".join(REMAP_FIELDS[field](gpu) for field in fields))
    return 0


def query(state: dict, fields: list[str], fmt: str, ids: list[int] | None) -> int:
    options = {part.strip() for part in fmt.split(",")}
    if "csv" not in options:
        print(f'"{fmt}" is not a valid format. Please use "csv" format.', file=sys.stderr)
        return EXIT_BAD_ARG
    for field in fields:
        if field not in FIELDS:
            print(f'Field "{field}" is not a valid field to query.', file=sys.stderr)
            return EXIT_BAD_ARG
    code = check_driver(state)
    if code:
        return code
    if "noheader" not in options:
        header = []
        for field in fields:
            unit = FIELDS[field][1]
            header.append(f"{field} [{unit}]" if unit else field)
        print(", ".join(header))
    for gpu in selected(state, ids):
        if gpu["fallen_off_bus"]:
            print(lost(gpu), file=sys.stderr)
            return EXIT_LOST
        values = []
        for field in fields:
            getter, unit = FIELDS[field]
            value = getter(state, gpu)
            if unit and "nounits" not in options and not value.startswith("["):
                value = f"{value} {unit}" if unit != "%" else f"{value} %"
            values.append(value)
        print(", ".join(values))
    return 0


def selected(state: dict, ids: list[int] | None) -> list[dict]:
    if ids is None:
        return state["gpus"]
    return [g for g in state["gpus"] if g["index"] in ids]


def list_gpus(state: dict) -> int:
    code = check_driver(state)
    if code:
        return code
    for gpu in state["gpus"]:
        if gpu["fallen_off_bus"]:
            print(lost(gpu), file=sys.stderr)
            return EXIT_LOST
        print(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
        for number, mig in enumerate(gpu.get("mig_devices") or []):  # nvidia-smi -L's MIG children
            print(f"  MIG {mig['profile']:<12} Device {number:>2}: (UUID: {mig['uuid']})")
    return 0


def full_query(state: dict, ids: list[int] | None) -> int:
    code = check_driver(state)
    if code:
        return code
    stamp = time.strftime("%a %b %d %H:%M:%S %Y")
    width = 42

    def row(indent: int, key: str, value: object = None) -> None:
        label = " " * indent + key
        print(label if value is None else f"{label.ljust(width)}: {value}")

    print()
    print("==============NVSMI LOG==============")
    print()
    row(0, "Timestamp", stamp)
    row(0, "Driver Version", state["driver_version"])
    row(0, "CUDA Version", state["cuda_version"])
    print()
    row(0, "Attached GPUs", len(state["gpus"]))
    for gpu in selected(state, ids):
        if gpu["fallen_off_bus"]:
            print(lost(gpu), file=sys.stderr)
            return EXIT_LOST
        bus = gpu["pci_bus_id"]
        print(f"GPU {bus}")
        row(4, "Product Name", gpu["name"])
        row(4, "Product Brand", "Tesla" if gpu["name"].startswith("Tesla") else "NVIDIA")
        row(4, "Product Architecture", gpu["architecture"])
        row(4, "Persistence Mode", "Enabled")
        row(4, "MIG Mode")
        row(8, "Current", gpu["mig_mode"])
        row(8, "Pending", gpu["mig_mode"])
        row(4, "Serial Number", gpu["serial"])
        row(4, "GPU UUID", gpu["uuid"])
        row(4, "Minor Number", gpu["minor"])
        row(4, "VBIOS Version", "92.00.45.00.08")
        row(4, "PCI")
        row(8, "Bus", f"0x{bus[9:11]}")
        row(8, "Device", "0x00")
        row(8, "Domain", "0x0000")
        row(8, "Device Id", gpu["pci_device_id"])
        row(8, "Bus Id", bus)
        row(4, "Fabric")
        row(8, "State", fabric(state)["state"])
        row(8, "Status", fabric(state)["status"])
        row(4, "FB Memory Usage")
        row(8, "Total", f"{gpu['memory_total_mib']} MiB")
        row(8, "Reserved", f"{RESERVED_MIB} MiB")
        row(8, "Used", "0 MiB")
        row(8, "Free", f"{gpu['memory_total_mib'] - RESERVED_MIB} MiB")
        row(4, "Compute Mode", "Default")
        row(4, "Temperature")
        row(8, "GPU Current Temp", "32 C")
        row(4, "GPU Power Readings")
        row(8, "Power Draw", f"{power_draw(gpu):.2f} W")
        row(8, "Current Power Limit", f"{gpu['power_limit_w']:.2f} W")
        print()
    return 0


def summary(state: dict) -> int:
    code = check_driver(state)
    if code:
        return code
    line = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    top = "+" + "-" * 89 + "+"
    print(time.strftime("%a %b %d %H:%M:%S %Y") + "       ")
    print(top)
    head = (f"NVIDIA-SMI {state['driver_version']:<22}Driver Version: {state['driver_version']:<14}"
            f"CUDA Version: {state['cuda_version']:<9}")
    print(f"| {head:<87} |")
    print("|" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+")
    print("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |")
    print("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |")
    print("|                                         |                        |               MIG M. |")
    print("|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|")
    for gpu in state["gpus"]:
        if gpu["fallen_off_bus"]:
            print(lost(gpu), file=sys.stderr)
            return EXIT_LOST
        mem = f"0MiB / {gpu['memory_total_mib']:>6}MiB"
        power = f"{int(power_draw(gpu)):>3}W / {gpu['power_limit_w']:>4}W"
        print(f"| {gpu['index']:>3}  {gpu['name'][:29]:<31}On  | {gpu['pci_bus_id']:>18} Off | {'0':>20} |")
        print(f"| N/A   32C    P0 {power:>23} | {mem:>22} | {'0%':>7}{'Default':>13} |")
        mig = gpu["mig_mode"] if gpu["mig_mode"] != "N/A" else "N/A"
        print(f"| {'':>39} | {'':>22} | {mig:>20} |")
        print(line)
    print(" " * 91)
    print(top)
    print("| Processes:" + " " * 78 + "|")
    print("|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |")
    print("|        ID   ID                                                               Usage      |")
    print("|" + "=" * 89 + "|")
    print("|  No running processes found" + " " * 61 + "|")
    print(top)
    return 0


def usage_error(message: str) -> int:
    print(message, file=sys.stderr)
    print("Please run 'nvidia-smi -h' for help.", file=sys.stderr)
    return EXIT_BAD_ARG


def main(argv: list[str]) -> int:
    fields: list[str] | None = None
    fmt = ""
    ids: list[int] | None = None
    mode = "summary"
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-L", "--list-gpus"):
            mode = "list"
        elif arg in ("-q", "--query"):
            mode = "full"
        elif arg.startswith("--query-gpu="):
            mode, fields = "query", [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
        elif arg.startswith("--query-remapped-rows="):
            mode, fields = "remap", [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        elif arg in ("-i", "--id") and args:
            ids = [int(i) for i in args.pop(0).split(",")]
        elif arg.startswith("--id="):
            ids = [int(i) for i in arg.split("=", 1)[1].split(",")]
        elif arg in ("-h", "--help"):
            print("NVIDIA System Management Interface (simulated by gpunode)")
            return 0
        else:
            return usage_error(f'Invalid combination of input arguments. "{arg}" is not supported here.')
    state = load_state()
    if mode == "list":
        return list_gpus(state)
    if mode == "full":
        return full_query(state, ids)
    if mode == "remap":
        return remapped_rows(state, fields or [], ids)
    if mode == "query":
        if not fmt:
            return usage_error("--format must be given with --query-gpu")
        return query(state, fields or [], fmt, ids)
    return summary(state)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
