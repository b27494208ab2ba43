"""The thin top layer every node shares: the simulated driver tools and node-wide settings.

Rewritten at every ``gpunode sim up`` (it is only file copies), so a change to a
stand-in reaches running fleets on their next start without rebuilding images.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gpunode.sim.aptrepo import render_standin
from gpunode.sim.workload_image import write_image

WORKLOAD_IMAGE = "usr/lib/gpunode-sim/workload-image.tar"
WORKLOAD_ROOTFS = "usr/lib/gpunode-sim/workload-rootfs.tar"

FABRICMANAGER_UNIT = """[Unit]
Description=NVIDIA fabric manager service (gpunode simulated)
After=network-online.target

[Service]
Type=simple
ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg
Restart=no

[Install]
WantedBy=multi-user.target
"""
SOURCES_LIST = """# gpunode simulated node: Debian's mirror is not reachable from inside the node (air-gapped).
# Packages come from repositories the deploy configures (the local NVIDIA toolkit repository).
"""

FILES: dict[str, tuple[str, int]] = {
    "usr/lib/gpunode-sim/nvidia-smi": ("nvidia_smi.py", 0o755),
    "usr/lib/gpunode-sim/nv-fabricmanager": ("nv_fabricmanager.py", 0o755),
    "usr/local/sbin/lsmod": ("lsmod.py", 0o755),
    "usr/local/sbin/modprobe": ("modprobe.sh", 0o755),
    "usr/local/sbin/reboot": ("reboot.sh", 0o755),
}


def write_tools_layer(target: Path) -> None:
    """Write the layer, unless it is already exactly so.

    Running nodes have it as an overlay lower layer: replacing it under them breaks
    their view of the folders it shares with other layers, so an unchanged layer is
    never touched (adding or rebooting nodes leaves the running ones alone).
    """
    fresh = target.with_name(f"{target.name}.new")
    if fresh.exists():
        shutil.rmtree(fresh)
    _write(fresh)
    if target.exists() and _same_tree(fresh, target):
        shutil.rmtree(fresh)
        return
    if target.exists():
        shutil.rmtree(target)
    fresh.rename(target)


def _same_tree(left: Path, right: Path) -> bool:
    def listing(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"") for p in root.rglob("*")}

    return listing(left) == listing(right)


def _write(target: Path) -> None:
    for relative, (standin, mode) in FILES.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_standin(standin))
        path.chmod(mode)
    unit = target / "usr/lib/systemd/system/nvidia-fabricmanager.service"
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(FABRICMANAGER_UNIT)
    sources = target / "etc/apt/sources.list"
    sources.parent.mkdir(parents=True, exist_ok=True)
    sources.write_text(SOURCES_LIST)
    write_image(target / WORKLOAD_IMAGE, target / WORKLOAD_ROOTFS)
