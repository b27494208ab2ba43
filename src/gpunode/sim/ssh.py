"""SSH identities of a simulated fleet: one client key, a host key per node, known_hosts, ssh_config.

Host keys are generated on the host before a node first starts, so known_hosts
is complete up front and SSH host-key checking stays on everywhere.
"""

from __future__ import annotations

from pathlib import Path

from gpunode.sim.hostcmd import run


def ensure_key(path: Path, comment: str) -> str:
    """The public half of the ed25519 key at ``path``, creating the pair if needed."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            what=f"creating the SSH key {path}")
    path.chmod(0o600)
    return Path(f"{path}.pub").read_text().strip()


def client_key(ssh_dir: Path) -> Path:
    ssh_dir.mkdir(parents=True, exist_ok=True)
    ssh_dir.chmod(0o700)
    key = ssh_dir / "id_ed25519"
    ensure_key(key, "gpunode-sim-operator")
    return key


def write_client_files(ssh_dir: Path, nodes: dict[str, tuple[str, str]]) -> Path:
    """Write known_hosts and an ssh_config for ``{name: (address, host public key)}``; return the config."""
    key = client_key(ssh_dir)
    known = ssh_dir / "known_hosts"
    known.write_text("".join(
        f"{name},{address} {' '.join(pub.split()[:2])}\n" for name, (address, pub) in sorted(nodes.items())))
    blocks = []
    for name, (address, _pub) in sorted(nodes.items()):
        blocks.append(
            f"Host {name}\n"
            f"  HostName {address}\n"
            "  Port 22\n"
            "  User root\n"
            f"  IdentityFile {key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {known}\n"
            "  StrictHostKeyChecking yes\n"
            "  LogLevel ERROR\n"
        )
    config = ssh_dir / "config"
    config.write_text("# written by 'gpunode sim up'\n" + "\n".join(blocks))
    config.chmod(0o600)
    return config
