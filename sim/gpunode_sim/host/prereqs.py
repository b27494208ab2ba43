"""What the host must have before a simulated fleet can start, checked up front."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpunode.errors import GpunodeError

HOST_PACKAGES = ("debootstrap zstd socat openssh-client apt-utils gnupg iproute2 util-linux dpkg-dev busybox-static"
                 " rpm createrepo-c skopeo")
REQUIRED_TOOLS = {
    "debootstrap": "debootstrap",
    "zstd": "zstd",
    "socat": "socat",
    "ssh-keygen": "openssh-client",
    "ssh": "openssh-client",
    "apt-ftparchive": "apt-utils",
    "gpg": "gnupg",
    "ip": "iproute2",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "dpkg-deb": "dpkg",
    "rpmbuild": "rpm",
    "rpmsign": "rpm",
    "createrepo_c": "createrepo-c",
    "skopeo": "skopeo",  # pushes the plugin image to the fleet's registry (through gpunode image push)
}


def check_host(filesystems_file: Path = Path("/proc/filesystems")) -> None:
    """Raise with the first missing piece and how to get it; return quietly when all is there."""
    if os.geteuid() != 0:
        raise GpunodeError("the simulated fleet needs root (namespaces, overlay mounts, mknod)",
                           "run it as root, e.g. sudo gpunode sim up")
    for tool, package in REQUIRED_TOOLS.items():
        if shutil.which(tool) is None:
            raise GpunodeError(f"{tool} is not installed",
                               f"apt-get install {package}   (all at once: apt-get install {HOST_PACKAGES})")
    filesystems = filesystems_file.read_text() if filesystems_file.exists() else ""
    if "overlay" not in filesystems.split():
        raise GpunodeError("this kernel has no overlayfs (not listed in /proc/filesystems)",
                           "load it with 'modprobe overlay', or use a kernel built with CONFIG_OVERLAY_FS")
