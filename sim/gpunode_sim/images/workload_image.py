"""The one container image of the simulated fleet: busybox and a CUDA-style probe, built locally.

Built from the host's busybox-static (a Debian package) as an OCI image archive
that ``ctr images import`` takes; nothing is pulled from a registry. The probe
prints the GPUs it can reach, or fails with CUDA_ERROR_NO_DEVICE when the
container has no GPU (no nvidia runtime, or no NVIDIA_VISIBLE_DEVICES).
"""

from __future__ import annotations

from pathlib import Path

from gpunode.errors import GpunodeError
from gpunode.image.oci import files_layer, write_archive

IMAGE_NAME = "docker.io/library/gpunode-workload:1"
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ls", "cat", "echo", "grep", "test", "[", "sleep", "env", "true", "false", "wc", "head", "awk",
           "sed", "mkdir", "rm")
CUDA_PROBE = """#!/bin/sh
# gpunode simulated CUDA probe: what cuInit, cuDeviceGetCount and cuCtxCreate report inside a container.
# cuda-probe [SECONDS]: list the GPUs, create a context on each, hold them SECONDS (0), release them at exit.
# A GPU's compute mode is the simulated driver's (its state file, as the runtime mounts it): Prohibited takes no
# context, Exclusive_Process (and the old Exclusive_Thread) one at a time, node-wide (a lock folder per GPU under
# the shared contexts folder, owned by this container's first process: freed once that process is gone).
# (the four locations can be moved for a test on the host: GPUNODE_SIM_DEV, _GPU_STATE, _CONTEXTS, _OWNER)
no_device() { echo "cuInit failed: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected" >&2; exit 100; }
if [ ! -e "${GPUNODE_SIM_DEV:-/dev}/nvidiactl" ] || ! command -v nvidia-smi >/dev/null 2>&1; then
    no_device
fi
listed=$(nvidia-smi -L)
count=$(echo "$listed" | grep -c '^GPU ')
[ "$count" -gt 0 ] || no_device
state=${GPUNODE_SIM_GPU_STATE:-/etc/gpunode-sim/gpu.json}
if [ ! -e "$state" ]; then  # given the driver's files by CDI: the state's link in the driver's firmware folder
    for linked in /lib/firmware/nvidia/*/gsp_gpunode_sim.bin; do [ -e "$linked" ] && state=$linked; done
fi
contexts=${GPUNODE_SIM_CONTEXTS:-/run/gpunode-sim/contexts}
owner=${GPUNODE_SIM_OWNER:-/run/gpunode-sim/container/owner}  # this container's first process, as the cli wrote it
busy="CUDA_ERROR_DEVICE_UNAVAILABLE: CUDA-capable device(s) is/are busy or unavailable"
held=""
release() { for lock in $held; do rm -rf "$lock"; done; }
trap release EXIT
trap 'exit 143' TERM INT
for uuid in $(echo "$listed" | sed -n 's/^GPU .*(UUID: \\(GPU-[^)]*\\))$/\\1/p'); do
    mode=$(awk -F'"' -v want="$uuid" '/^      "uuid":/ {u = $4} /^      "compute_mode":/ && u == want {print $4}' \\
        "$state" 2>/dev/null)
    case "$mode" in
        Prohibited)
            echo "cuCtxCreate failed on $uuid: $busy" >&2
            exit 46 ;;
        Exclusive_Process|Exclusive_Thread)
            if mkdir "$contexts/$uuid" 2>/dev/null; then
                cat "$owner" > "$contexts/$uuid/owner" 2>/dev/null || true
                held="$held $contexts/$uuid"
            else
                echo "cuCtxCreate failed on $uuid: $busy" >&2
                exit 46
            fi ;;
    esac
done
echo "CUDA devices: $count"
echo "$listed"
if [ "${1:-0}" -gt 0 ]; then
    sleep "$1" &
    wait $!
fi
exit 0
"""


def _layer() -> bytes:
    if not BUSYBOX.is_file():
        raise GpunodeError(f"{BUSYBOX} is missing (the workload image is built from it)",
                           "apt-get install busybox-static (scripts/setup-host does)")
    folders = ("bin", "dev", "etc", "proc", "sys", "tmp", "usr", "usr/bin", "usr/local", "usr/local/bin")
    files: dict[str, tuple[bytes | None, int]] = {f: (None, 0o1777 if f == "tmp" else 0o755) for f in folders}
    files["bin/busybox"] = (BUSYBOX.read_bytes(), 0o755)
    files["usr/local/bin/cuda-probe"] = (CUDA_PROBE.encode(), 0o755)
    return files_layer(files, {f"bin/{applet}": "busybox" for applet in APPLETS})


def write_image(target: Path, rootfs_target: Path) -> Path:
    """Write the OCI archive (for ctr) to ``target`` and the bare root filesystem (for ``docker import``)."""
    layer = _layer()
    rootfs_target.parent.mkdir(parents=True, exist_ok=True)
    rootfs_target.write_bytes(layer)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Cmd": ["sh"]}}
    write_archive(target, [layer], config, [IMAGE_NAME])
    return target
