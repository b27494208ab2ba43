"""The fleet's private image registry: the CNCF distribution server as Debian packages it, TLS and basic auth.

What production has between a cluster and its images: a registry of the team's own, its serving certificate
from the fleet's CA (the nodes trust it through containerd's ``hosts.toml`` and docker's ``certs.d``, as an admin
sets them up), and a user and password (htpasswd, bcrypt) that the nodes pull with, given to them through a
Kubernetes pull Secret. Nothing of gpunode's is side-loaded into a node any more: the device plugin's pods pull
its image from here, by digest.

The server (``docker-registry`` from Debian's ``docker-registry`` package, version 2.8) is fetched once per
machine (``apt-get download``, unpacked with ``dpkg-deb``: installing the package would start a service on every
interface) and cached. It listens on the fleet's ``127.0.<block>.252:5000`` on the host's loopback; nodes know it as
``registry.gpunode.test:5000`` (their ``/etc/hosts``), at an address of their own network where a forwarder
(a unix socket, as for the API server) leads to it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpunode.errors import GpunodeError
from gpunode_sim.cluster.controlplane import authority
from gpunode_sim.cluster.egress import node_address
from gpunode_sim.host.hostcmd import run
from gpunode_sim.host.paths import SimPaths

PACKAGE = "docker-registry"
NAME = "registry.gpunode.test"  # the registry's name in image references (.test: reserved for tests, RFC 2606)
HOST_INDEX = 252  # the block's .252 (nodes count up from .1 to at most .250, the bastion is .253, the API .254)
PORT = 5000
USER = "gpunode-nodes"  # the one registry user: pushes at 'sim up', pulls on the nodes
REPOSITORY = "gpunode/device-plugin"
CHECKER_REPOSITORY = "gpunode/node-checker"
READY_TIMEOUT = 20.0
Record = Callable[[str, int], None]


@dataclass(frozen=True)
class RegistryAccess:
    """How the fleet's registry is reached: by name from the nodes, by address from the host; CA and user."""

    host: str  # NAME:PORT, as image references, hosts.toml and certs.d folders and pull Secrets name it
    push_host: str  # ADDRESS:PORT on the host's loopback (the host cannot resolve the name: its /etc/hosts is not ours)
    ca: Path
    username: str
    password: str

    @property
    def cert_dir(self) -> Path:
        return self.ca.parent


def address(paths: SimPaths) -> str:
    return f"127.0.{paths.net_block}.{HOST_INDEX}"


def node_side_address(paths: SimPaths) -> str:
    """Where ``NAME`` points inside a node: an address of the nodes' own scheme, not a loopback one. containerd
    speaks plain HTTP to a registry at a loopback address (its localhost rule) and docker checks no certificate
    there (127.0.0.0/8 is insecure by default); a production registry is never there, and TLS must be checked as
    it is in production."""
    return node_address(address(paths))


def folder(paths: SimPaths) -> Path:
    return paths.state / "registry"


def binary(cache: Path) -> Path | None:
    found = sorted(cache.glob(f"{PACKAGE}-*/usr/bin/{PACKAGE}"))
    return found[-1] if found else None


def ensure_binary(cache: Path, say: Callable[[str], None]) -> Path:
    """The registry server, unpacked from Debian's package once per machine."""
    found = binary(cache)
    if found is not None:
        return found
    say(f"fetching the registry server ({PACKAGE}, Debian's package; once per machine)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="registry-fetch-") as work:
        os.chmod(work, 0o755)  # apt's _apt user downloads into it
        try:
            run(["apt-get", "download", PACKAGE], what=f"downloading Debian's {PACKAGE} package", cwd=work,
                timeout=300)
        except GpunodeError as error:
            raise GpunodeError(error.problem, "run 'apt-get update' (the package lists may be missing), then "
                               "'gpunode sim build' again") from error
        deb = next(Path(work).glob(f"{PACKAGE}_*.deb"))
        version = deb.name.split("_")[1].replace("+", "-").replace(":", "-")
        unpacked = Path(work) / "unpacked"
        run(["dpkg-deb", "-x", str(deb), str(unpacked)], what=f"unpacking {deb.name}")
        target = cache / f"{PACKAGE}-{version}"
        shutil.rmtree(target, ignore_errors=True)
        unpacked.rename(target)
    found = binary(cache)
    if found is None:
        raise GpunodeError(f"Debian's {PACKAGE} package holds no usr/bin/{PACKAGE}", f"see {cache}")
    return found


def access(paths: SimPaths) -> RegistryAccess:
    """The registry's address, CA and credentials, made on first use and kept with the fleet's state."""
    own = folder(paths)
    own.mkdir(parents=True, exist_ok=True)
    ca = authority(paths).pair.cert
    certs = own / "certs"
    certs.mkdir(exist_ok=True)
    if not (certs / "ca.crt").is_file():
        shutil.copyfile(ca, certs / "ca.crt")
    password_file = own / "password"
    if not password_file.is_file():
        password_file.touch(mode=0o600)
        password_file.write_text(secrets.token_urlsafe(18))
    return RegistryAccess(f"{NAME}:{PORT}", f"{address(paths)}:{PORT}", certs / "ca.crt", USER,
                          password_file.read_text().strip())


def _htpasswd(username: str, password: str) -> str:
    import bcrypt  # paramiko's own dependency: already in gpunode's environment

    return f"{username}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()}\n"


def write_config(paths: SimPaths, reach: RegistryAccess) -> Path:
    """The server's config.yml: storage in the fleet's state, TLS from the fleet's CA, htpasswd auth."""
    own = folder(paths)
    pair = authority(paths).issue("registry-tls", NAME, server=True, ips=(address(paths),), dns=(NAME,))
    htpasswd = own / "htpasswd"
    htpasswd.write_text(_htpasswd(reach.username, reach.password))
    config = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(own / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"{address(paths)}:{PORT}", "tls": {"certificate": str(pair.cert), "key": str(pair.key)}},
        "auth": {"htpasswd": {"realm": "gpunode-sim-registry", "path": str(htpasswd)}},
    }
    target = own / "config.yml"
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def _answers(paths: SimPaths, reach: RegistryAccess) -> bool:
    """True once the registry answers TLS on its address (any HTTP answer: /v2/ says 401 without credentials)."""
    context = ssl.create_default_context(cafile=str(reach.ca))
    try:
        with socket.create_connection((address(paths), PORT), timeout=1) as raw, \
                context.wrap_socket(raw, server_hostname=address(paths)) as tls:
            tls.sendall(f"GET /v2/ HTTP/1.0\r\nHost: {reach.push_host}\r\n\r\n".encode())
            return tls.recv(16).startswith(b"HTTP/")
    except OSError:
        return False


def start(paths: SimPaths, services: dict[str, int], record: Record, alive: Callable[[int | None], bool]) \
        -> RegistryAccess:
    """Start the registry and its forwarder for the nodes unless they run; return how to reach it."""
    reach = access(paths)
    server = ensure_binary(paths.cache, lambda _: None)
    config = write_config(paths, reach)
    paths.run.mkdir(parents=True, exist_ok=True)
    sock = paths.run / "registry.sock"
    commands = {
        "registry": [str(server), "serve", str(config)],
        "registry-forward": ["socat", f"UNIX-LISTEN:{sock},fork,mode=600", f"TCP:{address(paths)}:{PORT}"],
    }
    for role, argv in commands.items():
        if alive(services.get(role)):
            continue
        if role == "registry-forward":
            sock.unlink(missing_ok=True)
        log_file = paths.run / f"{role}.log"
        with log_file.open("ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        record(role, proc.pid)
        ready: Callable[[], bool] = ((lambda: _answers(paths, reach)) if role == "registry" else sock.exists)
        deadline = time.monotonic() + READY_TIMEOUT
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-8:])
                raise GpunodeError(f"the fleet's {role} did not start:\n{tail}", f"see {log_file}")
            time.sleep(0.1)
    return reach


ROLES = ("registry-forward", "registry")  # stopped in this order
