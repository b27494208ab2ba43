"""The one container image of the simulated fleet: busybox and a CUDA-style probe, built locally.

Built from the host's busybox-static (a Debian package) as an OCI image archive
that ``ctr images import`` takes; nothing is pulled from a registry. The probe
prints the GPUs it can reach, or fails with CUDA_ERROR_NO_DEVICE when the
container has no GPU (no nvidia runtime, or no NVIDIA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from gpunode.errors import GpunodeError

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
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes | None = None, mode: int = 0o755, link: str | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.mode = mode
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        for folder in ("bin", "dev", "etc", "proc", "sys", "tmp", "usr", "usr/bin", "usr/local", "usr/local/bin"):
            add(folder, mode=0o1777 if folder == "tmp" else 0o755)
        add("bin/busybox", BUSYBOX.read_bytes())
        for applet in APPLETS:
            add(f"bin/{applet}", link="busybox")
        add("usr/local/bin/cuda-probe", CUDA_PROBE.encode())
    return buffer.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_image(target: Path, rootfs_target: Path) -> Path:
    """Write the OCI archive (for ctr) to ``target`` and the bare root filesystem (for ``docker import``)."""
    layer = _layer()
    rootfs_target.parent.mkdir(parents=True, exist_ok=True)
    rootfs_target.write_bytes(layer)
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Cmd": ["sh"]},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]}},
                        sort_keys=True).encode()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
        config_desc = {"mediaType": "application/vnd.oci.image.config.v1+json", **_blob(tar, config)}
        layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(tar, layer)}
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": config_desc, "layers": [layer_desc]}, sort_keys=True).encode()
        manifest_desc = {"mediaType": "application/vnd.oci.image.manifest.v1+json", **_blob(tar, manifest),
                         "annotations": {"io.containerd.image.name": IMAGE_NAME,
                                         "org.opencontainers.image.ref.name": IMAGE_NAME.rsplit(":", 1)[1]}}
        for name, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                           ("index.json", json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}).encode())):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return target
