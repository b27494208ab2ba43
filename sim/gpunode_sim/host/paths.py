"""Where the simulated fleet keeps its state (per machine) and its caches (shared by clones)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpunode.errors import GpunodeError

DEFAULT_STATE_DIR = "/var/lib/gpunode/sim"
DEFAULT_CACHE_DIR = "/var/cache/gpunode"


@dataclass(frozen=True)
class SimPaths:
    """The simulator's folders and address block.

    ``GPUNODE_SIM_DIR`` and ``GPUNODE_CACHE_DIR`` move the folders; ``GPUNODE_SIM_NET``
    picks the loopback block (127.0.<block>.N), so two fleets can run side by side.
    """

    state: Path
    cache: Path
    net_block: int = 10

    @classmethod
    def from_env(cls) -> SimPaths:
        block = os.environ.get("GPUNODE_SIM_NET", "10")
        if not block.isdigit() or not 1 <= int(block) <= 254:
            raise GpunodeError(f"GPUNODE_SIM_NET={block!r} is not a number from 1 to 254",
                               "nodes get the loopback addresses 127.0.<GPUNODE_SIM_NET>.N; unset it for 127.0.10.N")
        return cls(Path(os.environ.get("GPUNODE_SIM_DIR", DEFAULT_STATE_DIR)),
                   Path(os.environ.get("GPUNODE_CACHE_DIR", DEFAULT_CACHE_DIR)), int(block))

    @property
    def base_rootfs(self) -> Path:
        return self.state / "base" / "rootfs"

    def layer(self, name: str) -> Path:
        return self.state / "layers" / name

    def node(self, name: str) -> Path:
        return self.state / "nodes" / name

    @property
    def repo(self) -> Path:
        return self.state / "repo"

    @property
    def run(self) -> Path:
        return self.state / "run"

    @property
    def ssh(self) -> Path:
        return self.state / "ssh"

    @property
    def fleet_file(self) -> Path:
        return self.state / "fleet.json"

    @property
    def inventory_file(self) -> Path:
        return self.state / "inventory.json"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def apiserver_address(self) -> str:
        """The simulated control plane's loopback address (the block's last one; nodes count up from .1)."""
        return f"127.0.{self.net_block}.254"

    @property
    def ssh_config(self) -> Path:
        return self.ssh / "config"
