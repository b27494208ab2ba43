"""SSH identities of a simulated fleet: one client key, a host key per node and the bastion, known_hosts, ssh_config.

Host keys are generated on the host before a node first starts, so known_hosts
is complete up front and SSH host-key checking stays on everywhere.
"""

from __future__ import annotations

from pathlib import Path

from gpunode_sim.host.hostcmd import run

BASTION = "bastion"  # the jump host's name in the ssh_config (gpunode_sim.access.bastion)
SIM_USER = "sre"  # the operator's account on every node and the bastion (made in the images, gpunode_sim.images.layers)


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


def write_client_files(ssh_dir: Path, nodes: dict[str, tuple[str, str]], bastion: tuple[str, str]) -> Path:
    """Write known_hosts and an ssh_config for ``{name: (address, host public key)}`` behind ``bastion`` (its
    address and host public key); return the config.

    The operator logs in as the nodes' non-root user; every node is reached through the bastion (``ProxyJump``),
    with host keys checked on both hops.
    """
    key = client_key(ssh_dir)
    known = ssh_dir / "known_hosts"
    hosts = {BASTION: bastion, **nodes}
    known.write_text("".join(
        f"{name},{address} {' '.join(pub.split()[:2])}\n" for name, (address, pub) in sorted(hosts.items())))
    blocks = []
    for name, (address, _pub) in [(BASTION, bastion), *sorted(nodes.items())]:
        # no "Port 22" on the jump host: pyinfra 3.10 hands a ProxyJump hop the config's port as text, and paramiko
        # then looks its host key up as "[address]:22", which known_hosts does not hold (the default port is an int)
        blocks.append(
            f"Host {name}\n"
            f"  HostName {address}\n"
            + ("" if name == BASTION else "  Port 22\n")
            + f"  User {SIM_USER}\n"
            f"  IdentityFile {key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {known}\n"
            "  StrictHostKeyChecking yes\n"
            "  ConnectTimeout 10\n"
            + ("" if name == BASTION else f"  ProxyJump {BASTION}\n")
            + "  LogLevel ERROR\n"
        )
    config = ssh_dir / "config"
    config.write_text("# written by 'gpunode sim up'\n" + "\n".join(blocks))
    config.chmod(0o600)
    return config
