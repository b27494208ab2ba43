#!/usr/bin/python3
"""Stand-in for ``lsmod`` in a simulated node: the simulated NVIDIA (or nouveau) modules.

The host kernel may have no loadable modules at all (no /proc/modules), so the
node's module list comes from its driver state; real entries are added when
the kernel has them.
"""

import json
import os

STATE_FILE = os.environ.get("GPUNODE_SIM_GPU_STATE", "/etc/gpunode-sim/gpu.json")
NVIDIA = [("nvidia_uvm", 1347584, "0", ""), ("nvidia_drm", 73728, "0", ""),
          ("nvidia_modeset", 1294336, "1", "nvidia_drm"), ("nvidia", 56713216, "2", "nvidia_uvm,nvidia_modeset")]


def main() -> None:
    with open(STATE_FILE) as handle:
        state = json.load(handle)
    rows = []
    if os.path.exists("/proc/modules"):
        with open("/proc/modules") as handle:
            for line in handle:
                name, size, used, users = line.split()[:4]
                rows.append((name, int(size), used, users.strip(",-").rstrip(",")))
    if state["loaded"]:
        rows += NVIDIA
    if state["nouveau"]:
        rows.append(("nouveau", 2269184, "0", ""))
    print("Module                  Size  Used by")
    for name, size, used, users in rows:
        print(f"{name:<19} {size:>8}  {used} {users}".rstrip())


main()
