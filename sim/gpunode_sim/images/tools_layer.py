"""The thin top layer every node shares: the simulated driver tools and node-wide settings.

Rewritten at every ``gpunode sim up`` (it is only file copies), so a change to a
stand-in reaches running fleets on their next start without rebuilding images.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gpunode.image.oci import files_layer, write_archive
from gpunode_sim.images.workload_image import write_image
from gpunode_sim.repos.aptrepo import render_standin

WORKLOAD_IMAGE = "usr/lib/gpunode-sim/workload-image.tar"
WORKLOAD_ROOTFS = "usr/lib/gpunode-sim/workload-rootfs.tar"
PAUSE_IMAGE = "usr/lib/gpunode-sim/pause-image.tar"
PAUSE_NAME = "registry.k8s.io/pause:3.10.1"  # images.CRI_SETTINGS' sandbox_image

KUBELET_UNIT = """[Unit]
Description=kubelet: The Kubernetes Node Agent (gpunode simulated node)
After=containerd.service
Wants=containerd.service

[Service]
EnvironmentFile=-/etc/default/kubelet
ExecStartPre=/usr/lib/gpunode-sim/kubelet-prepare
ExecStart=/usr/local/bin/kubelet --config=/etc/kubernetes/kubelet-config.yaml \
--kubeconfig=/etc/kubernetes/kubelet.conf $KUBELET_EXTRA_ARGS
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
"""
# What a node image would hold and a registry would serve: the images the kubelet's pods use, imported into
# containerd's k8s.io namespace once, and the cgroup root the kubelet is told to use (it must exist).
KUBELET_PREPARE = """#!/bin/sh
# gpunode simulated node: before the kubelet starts
set -e
. /etc/default/kubelet
for controller in /sys/fs/cgroup/*/; do
  [ -e "${controller}cgroup.procs" ] && mkdir -p "${controller}${GPUNODE_CGROUP_ROOT#/}"
done
tries=0
until ctr version >/dev/null 2>&1; do
  tries=$((tries + 1)); [ "$tries" -gt 300 ] && { echo "containerd did not answer in 60 s" >&2; exit 1; }
  sleep 0.2
done
present=$(ctr -n k8s.io images ls | awk 'NR > 1 {print $1 "@" $3}')
for entry in $GPUNODE_IMAGES; do  # name@digest=archive: imported when absent or another build
  echo "$present" | grep -qxF "${entry%%=*}" || ctr -n k8s.io images import "${entry#*=}" >/dev/null
done
"""

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
    # where the real ones are (kmod's, systemd's): sudo's secure_path on Debian unstable has no /usr/local
    "usr/sbin/lsmod": ("lsmod.sh", 0o755),
    "usr/sbin/modprobe": ("modprobe.sh", 0o755),
    "usr/sbin/reboot": ("reboot.sh", 0o755),
    # ahead of /usr/bin/systemctl on root's PATH: answers is-active itself, hands everything else to it (under
    # sudo on Debian unstable, whose secure_path has no /usr/local, the full stand-in answers: slower, the same)
    "usr/local/sbin/systemctl": ("systemctl_fast.sh", 0o755),
}


def write_tools_layer(target: Path, pause: Path) -> None:
    """Write the layer, unless it is already exactly so.

    Running nodes have it as an overlay lower layer: replacing it under them breaks
    their view of the folders it shares with other layers, so an unchanged layer is
    never touched (adding or rebooting nodes leaves the running ones alone).
    """
    fresh = target.with_name(f"{target.name}.new")
    if fresh.exists():
        shutil.rmtree(fresh)
    _write(fresh, pause)
    if target.exists() and _same_tree(fresh, target):
        shutil.rmtree(fresh)
        return
    if target.exists():
        shutil.rmtree(target)
    fresh.rename(target)


def _same_tree(left: Path, right: Path) -> bool:
    def listing(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): (str(p.readlink()).encode() if p.is_symlink() else
                                           p.read_bytes() if p.is_file() else b"") for p in root.rglob("*")}

    return listing(left) == listing(right)


def _write(target: Path, pause: Path) -> None:
    for relative, (standin, mode) in FILES.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_standin(standin))
        path.chmod(mode)
    kmod = target / "usr/lib/gpunode-sim/kmod/modprobe"  # the real modprobe under its own name, for the stand-in
    kmod.parent.mkdir(parents=True, exist_ok=True)
    kmod.symlink_to("/usr/bin/kmod")
    unit = target / "usr/lib/systemd/system/nvidia-fabricmanager.service"
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(FABRICMANAGER_UNIT)
    sources = target / "etc/apt/sources.list"
    sources.parent.mkdir(parents=True, exist_ok=True)
    sources.write_text(SOURCES_LIST)
    write_image(target / WORKLOAD_IMAGE, target / WORKLOAD_ROOTFS)
    kubelet_unit = target / "usr/lib/systemd/system/kubelet.service"
    kubelet_unit.write_text(KUBELET_UNIT)
    prepare = target / "usr/lib/gpunode-sim/kubelet-prepare"
    prepare.write_text(KUBELET_PREPARE)
    prepare.chmod(0o755)
    write_pause_image(target / PAUSE_IMAGE, pause)


def write_pause_image(target: Path, pause: Path) -> str:
    """The pod sandbox image: upstream's pause, built here, as registry.k8s.io/pause runs it."""
    layer = files_layer({"pause": (pause.read_bytes(), 0o755)})
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": ["/pause"], "User": "65535:65535", "WorkingDir": "/"}}
    return write_archive(target, [layer], config, [PAUSE_NAME])
