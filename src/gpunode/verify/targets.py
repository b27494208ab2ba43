"""The hosts of a pyinfra inventory, as verification targets with their settings and a testinfra host."""

from __future__ import annotations

import functools
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
import testinfra

from gpunode.errors import GpunodeError
from gpunode.settings import NodeSettings


def parse_data(pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings (as given to ``--data``) as a mapping."""
    data = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise GpunodeError(f"--data {pair!r} is not KEY=VALUE", "for example: --data toolkit_version=1.20.0-1")
        data[key] = value
    return data


@dataclass
class Target:
    """One inventory host: its name, its data, and how to reach it."""

    name: str
    data: dict[str, Any]
    groups: list[str]

    @property
    def settings(self) -> NodeSettings:
        return NodeSettings.from_data(self.data)

    @property
    def is_local(self) -> bool:
        return self.name == "@local" or self.data.get("_connector") == "local"


def load_inventory(path: str, limit: list[str] | None = None, data: dict[str, str] | None = None) -> list[Target]:
    """Targets of the pyinfra inventory file ``path`` (group_data/ included), filtered by ``limit``.

    ``limit`` holds host names, group names or glob patterns, like pyinfra's ``--limit``;
    ``data`` overrides host data for every host, like pyinfra's ``--data``.
    """
    from fnmatch import fnmatch

    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    inventory_path = Path(path)
    if not inventory_path.is_file():
        raise GpunodeError(f"inventory {path} does not exist",
                           "give the path of a pyinfra inventory file, e.g. inventories/prod.py")
    with ctx_state.use(State()):
        inventory = make_inventory(str(inventory_path), override_data=data or None, cwd=str(Path.cwd()))
    targets = []
    for host in inventory:
        groups = sorted(host.groups)
        if limit and not any(fnmatch(host.name, pattern) or pattern in groups for pattern in limit):
            continue
        targets.append(Target(host.name, dict(host.data.dict()), groups))
    if not targets:
        raise GpunodeError(f"no host of {path} matches --limit {' '.join(limit or [])}" if limit
                           else f"inventory {path} has no hosts",
                           "check the host and group names in the inventory")
    return targets


@functools.cache
def deploy_kex() -> str | None:
    """The key exchanges pyinfra's SSH library (paramiko) offers, in its order, that this OpenSSH also knows.

    The verification reaches hosts with the key exchange the deploy itself negotiates. OpenSSH's default first
    choice (the post-quantum sntrup761x25519 hybrid, which paramiko does not offer) cost about 90 ms of the
    controller's CPU per connection here, against 10 ms for curve25519: most of a verification's own CPU at 100
    hosts. SHA-1 exchanges, which OpenSSH's defaults leave out, stay out. None: OpenSSH's defaults.
    """
    offered = getattr(paramiko.Transport, "_preferred_kex", ())
    try:
        known = subprocess.run(["ssh", "-Q", "kex"], capture_output=True, text=True, timeout=10,
                               check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    chosen = [name for name in offered if name in known and "sha1" not in name]
    return ",".join(chosen) or None


def ssh_config_for(targets: list[Target]) -> str:
    """An ssh_config reaching each target as pyinfra would (host, port, user, key, known hosts, key exchange)."""
    blocks = []
    kex = deploy_kex()
    for target in targets:
        if target.is_local:
            continue
        data = target.data
        lines = [f"Host {target.name}", f"  HostName {data.get('ssh_hostname') or target.name}"]
        if data.get("ssh_port"):
            lines.append(f"  Port {data['ssh_port']}")
        if data.get("ssh_user"):
            lines.append(f"  User {data['ssh_user']}")
        if data.get("ssh_key"):
            lines.append(f"  IdentityFile {data['ssh_key']}")
            lines.append("  IdentitiesOnly yes")
        if data.get("ssh_known_hosts_file"):
            lines.append(f"  UserKnownHostsFile {data['ssh_known_hosts_file']}")
        checking = data.get("ssh_strict_host_key_checking")
        if checking:
            lines.append(f"  StrictHostKeyChecking {checking}")
        if kex:
            lines.append(f"  KexAlgorithms {kex}")
        lines += ["  BatchMode yes", "  ConnectTimeout 10", "  LogLevel ERROR"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


class Connections:
    """testinfra hosts for the targets, sharing one generated ssh_config."""

    def __init__(self, targets: list[Target]) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="gpunode-verify-")
        self.ssh_config = Path(self._dir.name) / "ssh_config"
        self.ssh_config.write_text(ssh_config_for(targets))
        self.targets = {t.name: t for t in targets}

    def host(self, name: str) -> testinfra.host.Host:
        if self.targets[name].is_local:
            return testinfra.get_host("local://")
        return testinfra.get_host(f"ssh://{shlex.quote(name)}", ssh_config=str(self.ssh_config),
                                  controlpersist=0)

    def close(self) -> None:
        self._dir.cleanup()
