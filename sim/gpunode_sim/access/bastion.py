"""The fleet's bastion: the one host the operator's SSH reaches; the nodes are reached only through it.

Production GPU nodes sit on a private network behind a jump host, so a simulated fleet does too. The bastion is a
small host of its own: the Debian 12 base and sim layers (sshd and the operator's account; no container runtime,
no GPU, no kubelet), booted by the nodes' init in a network namespace of its own, its sshd on the host at
``127.0.<block>.253:22``. Inside its namespace each node's sshd answers at the node's address (a forwarder to the
node's own SSH socket), so ``ProxyJump bastion`` reaches ``node01`` at its address as a production jump host
reaches its nodes. The nodes have no SSH listener on the host at all.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from gpunode_sim.access.ssh import BASTION, SIM_USER, ensure_key
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.images.layers import DEFAULT_OS, base_rootfs, layer_dir
from gpunode_sim.node.simnode import NodeProcess, spawn, stop_processes, write_upper

NAME = BASTION
HOST_INDEX = 253  # the block's .253 (nodes count up from .1, the API server is .254)
FORWARD_PREFIX = "to-"  # the role of the bastion's forwarder to a node: "to-node01"


class Bastion:
    """The bastion's files on the host (``STATE/bastion``) and its processes."""

    def __init__(self, paths: SimPaths, net_block: int) -> None:
        self.paths = paths
        self.dir = paths.state / NAME
        self.address = f"127.0.{net_block}.{HOST_INDEX}"
        self.netns = f"gpunode{net_block}-{NAME}"

    @property
    def ssh_socket(self) -> Path:
        return self.dir / "sshd.sock"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    def prepare(self, authorized_key: str) -> str:
        """The bastion's folders, its operator account's key and its boot plan; return its SSH host public key."""
        for folder in ("upper", "work", "merged"):
            (self.dir / folder).mkdir(parents=True, exist_ok=True)
        host_pub = ensure_key(self.host_key, f"root@{NAME}")
        upper = self.dir / "upper"
        files = {
            "etc/hostname": f"{NAME}\n",
            "etc/hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{NAME}\n",
            "etc/machine-id": uuid.uuid5(uuid.NAMESPACE_DNS, f"{NAME}.gpunode.sim").hex + "\n",
            f"home/{SIM_USER}/.ssh/authorized_keys": authorized_key + "\n",
            "etc/ssh/ssh_host_ed25519_key": self.host_key.read_text(),
            "etc/ssh/ssh_host_ed25519_key.pub": host_pub + "\n",
            # its own sshd answers on the namespace's 127.0.0.1 only: every other 127.0.<block>.N:22 there is a node's
            "etc/ssh/sshd_config.d/bastion.conf": "# gpunode simulated bastion\nListenAddress 127.0.0.1\n",
            # a jump host: the operator hops through it and runs nothing there as root
            f"etc/sudoers.d/{SIM_USER}": "# the bastion: no sudo for the operator\n",
        }
        write_upper(upper, files)
        (upper / f"etc/sudoers.d/{SIM_USER}").chmod(0o440)
        plan = {
            "hostname": NAME, "merged": str(self.dir / "merged"), "upper": str(upper), "work": str(self.dir / "work"),
            "lowers": [str(layer_dir(self.paths, DEFAULT_OS, "sim")), str(base_rootfs(self.paths, DEFAULT_OS))],
            "data_binds": {}, "code_binds": [], "boot_id": str(uuid.uuid4()), "proc_driver": {}, "sys_module": {},
            "devices": [],
        }
        (self.dir / "boot.json").write_text(json.dumps(plan, indent=2))
        return host_pub

    def start(self, record: Callable[[NodeProcess], None]) -> None:
        """Boot the bastion and expose its sshd on the host."""
        if not Path(f"/run/netns/{self.netns}").exists():
            subprocess.run(["ip", "netns", "add", self.netns], check=True, capture_output=True)
        subprocess.run(["ip", "-n", self.netns, "link", "set", "lo", "up"], check=True, capture_output=True)
        self.ssh_socket.unlink(missing_ok=True)
        self._spawn(record, "init", ["nsenter", f"--net=/run/netns/{self.netns}", "unshare", "--uts", "--ipc",
                                     "--mount", "--pid", "--fork", "--kill-child=SIGTERM", sys.executable, "-m",
                                     "gpunode_sim.guest.init", str(self.dir / "boot.json")])
        self._spawn(record, "ssh-node", ["nsenter", f"--net=/run/netns/{self.netns}", "socat",
                                         f"UNIX-LISTEN:{self.ssh_socket},fork,mode=600", "TCP:127.0.0.1:22"])
        self._spawn(record, "ssh-host", ["socat", f"TCP-LISTEN:22,bind={self.address},reuseaddr,fork",
                                         f"UNIX-CONNECT:{self.ssh_socket}"])

    def forward(self, node: str, address: str, node_socket: Path, record: Callable[[NodeProcess], None]) -> None:
        """Make ``node``'s sshd answer at ``address``:22 inside the bastion's network."""
        self._spawn(record, f"{FORWARD_PREFIX}{node}", [
            "nsenter", f"--net=/run/netns/{self.netns}", "socat", f"TCP-LISTEN:22,bind={address},reuseaddr,fork",
            f"UNIX-CONNECT:{node_socket}"])

    def _spawn(self, record: Callable[[NodeProcess], None], role: str, argv: list[str]) -> None:
        with (self.dir / "console.log").open("ab") as log:
            spawn(role, argv, record, log, {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})

    def wait_ready(self, timeout: float) -> str | None:
        """None once the bastion's sshd answers on the host, else why not."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.address, 22), timeout=2) as conn:
                    conn.settimeout(2)
                    if conn.recv(64).startswith(b"SSH-2.0-"):
                        return None
            except OSError as error:
                last = str(error)
            time.sleep(0.2)
        return f"the bastion's sshd did not answer on {self.address}:22 within {timeout:.0f} s ({last}); " \
               f"see {self.dir / 'console.log'}"

    def stop(self, processes: list[NodeProcess]) -> None:
        stop_processes(processes)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
        self.ssh_socket.unlink(missing_ok=True)
