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
APPLETS = ("sh", "ls", "cat", "echo", "grep", "test", "[", "sleep", "env", "true", "false", "wc", "head")
CUDA_PROBE = """#!/bin/sh
# gpunode simulated CUDA probe: what cuInit/cuDeviceGetCount report inside a container
if [ -e /dev/nvidiactl ] && command -v nvidia-smi >/dev/null 2>&1; then
    count=$(nvidia-smi -L | grep -c '^GPU ')
    if [ "$count" -gt 0 ]; then
        echo "CUDA devices: $count"
        nvidia-smi -L
        exit 0
    fi
fi
echo "cuInit failed: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected" >&2
exit 100
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
