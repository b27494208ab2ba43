"""The fleet's Kubernetes control plane: real etcd, kube-apiserver, kube-controller-manager and kube-scheduler.

Built once per machine (``gpunode_sim.build.kubernetes``) and started per fleet on its
loopback block's last address, ``127.0.<block>.254``: etcd on 2379/2380 (plain
HTTP, loopback only), the API server with TLS on 6443, RBAC and the Node
authorizer with NodeRestriction, an audit log of writes
(``run/kube-apiserver-audit.log``), the controller manager and scheduler on
their secure ports bound to the same address. The data lives in the fleet's
state folder. Nodes reach the API through a socat pair (their network has only
``lo``): the host end listens on ``run/apiserver.sock``.

The kubeconfig next to the inventory has four contexts, backed by client
certificates: ``gpunode-sim`` (``system:masters``, the simulator's own
bootstrap only), ``gpunode`` (user ``gpunode``, bound to exactly the rules
``gpunode render --rbac`` prints: the context the generated inventory gives
gpunode), ``gpunode-sim-viewer`` (bound to the built-in ``view`` ClusterRole)
and ``gpunode-sim-expired`` (a certificate past its validity, which the API
server refuses with 401).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from gpunode.cluster import rbac
from gpunode.cluster.manifests import ManifestSettings
from gpunode.errors import GpunodeError
from gpunode_sim.build.kubernetes import require
from gpunode_sim.cluster.pki import Authority, Pair
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.host.processes import alive, signal_group

if TYPE_CHECKING:
    from lightkube import Client

APISERVER_PORT = 6443
ETCD_CLIENT_PORT, ETCD_PEER_PORT = 2379, 2380
CONTROLLER_MANAGER_PORT, SCHEDULER_PORT = 10257, 10259
SERVICE_RANGE = "10.96.0.0/24"  # ClusterIPs are only recorded: nothing routes them
ROLES = ("egress", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "apiserver-forward")
# the identity the generated inventory gives gpunode: a user bound to exactly what 'gpunode render --rbac' prints
OPERATOR_CONTEXT, OPERATOR_USER = "gpunode", "gpunode"
READY_TIMEOUT = 120.0
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        # the node checker's every request (the tests count its API cost per node and interval)
        {"level": "Metadata", "users": ["system:serviceaccount:gpunode-system:gpunode-node-checker"]},
        {"level": "None", "userGroups": ["system:nodes", "system:serviceaccounts"]},
        {"level": "None", "users": ["system:kube-scheduler", "system:kube-controller-manager", "system:apiserver"]},
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "Metadata"},
    ],
}

Record = Callable[[str, int], None]


def pki_dir(paths: SimPaths) -> Path:
    return paths.state / "pki"


def authority(paths: SimPaths) -> Authority:
    return Authority(pki_dir(paths))


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig_for(server: str, ca: Path, users: dict[str, Pair], current: str) -> dict:
    """A kubeconfig with one context per user (context name -> client certificate)."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": "gpunode-sim", "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
        "contexts": [{"name": context, "context": {"cluster": "gpunode-sim", "user": context}} for context in users],
        "users": [{"name": context, "user": {"client-certificate-data": _b64(pair.cert),
                                             "client-key-data": _b64(pair.key)}}
                  for context, pair in users.items()],
    }


def _write_private(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)


def server_url(paths: SimPaths) -> str:
    return f"https://{paths.apiserver_address}:{APISERVER_PORT}"


def write_access(paths: SimPaths) -> Path:
    """Certificates of the cluster and its users, and the users' kubeconfig; returns its path."""
    ca = authority(paths)
    address = paths.apiserver_address
    ca.issue("apiserver", "kube-apiserver", server=True, ips=(address,),
             dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost"))
    ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",))
    ca.signing_key("sa")
    users = {
        "gpunode-sim": ca.issue("admin", "gpunode-admin", ("system:masters",)),
        "gpunode-sim-viewer": ca.issue("viewer", "gpunode-viewer"),
        OPERATOR_CONTEXT: ca.issue("operator", OPERATOR_USER),
        "gpunode-sim-expired": ca.issue("expired", "gpunode-expired", ("system:masters",), expired=True),
    }
    server = server_url(paths)
    _write_private(paths.kubeconfig, yaml.safe_dump(kubeconfig_for(server, ca.pair.cert, users, "gpunode-sim"),
                                                    sort_keys=False))
    for component, user in (("kube-controller-manager", "system:kube-controller-manager"),
                            ("kube-scheduler", "system:kube-scheduler")):
        pair = ca.issue(component, user)
        _write_private(pki_dir(paths) / f"{component}.kubeconfig",
                       yaml.safe_dump(kubeconfig_for(server, ca.pair.cert, {component: pair}, component)))
    return paths.kubeconfig


def node_credentials(paths: SimPaths, name: str, address: str) -> dict[str, str]:
    """A node's kubelet identity (``system:node:NAME``), its serving certificate and kubeconfig, as file texts."""
    ca = authority(paths)
    client = ca.issue(f"node-{name}", f"system:node:{name}", ("system:nodes",))
    serving = ca.issue(f"node-{name}-serving", name, server=True, ips=(address,), dns=(name,))
    kubeconfig = {  # inside the node: the files, as kubeadm writes kubelet.conf
        "apiVersion": "v1", "kind": "Config", "current-context": "kubelet",
        "clusters": [{"name": "gpunode-sim", "cluster": {"server": server_url(paths),
                                                         "certificate-authority": "/etc/kubernetes/pki/ca.crt"}}],
        "contexts": [{"name": "kubelet", "context": {"cluster": "gpunode-sim", "user": f"system:node:{name}"}}],
        "users": [{"name": f"system:node:{name}", "user": {
            "client-certificate": "/etc/kubernetes/pki/kubelet-client.crt",
            "client-key": "/etc/kubernetes/pki/kubelet-client.key"}}],
    }
    return {
        "etc/kubernetes/kubelet.conf": yaml.safe_dump(kubeconfig, sort_keys=False),
        "etc/kubernetes/pki/ca.crt": ca.pair.cert.read_text(),
        "etc/kubernetes/pki/kubelet-client.crt": client.cert.read_text(),
        "etc/kubernetes/pki/kubelet-client.key": client.key.read_text(),
        "etc/kubernetes/pki/kubelet.crt": serving.cert.read_text(),
        "etc/kubernetes/pki/kubelet.key": serving.key.read_text(),
    }


def egress_selector(paths: SimPaths) -> dict:
    """The API server reaches kubelets (logs, exec) through gpunode_sim.cluster.egress, everything else directly."""
    return {"apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
            "egressSelections": [
                {"name": "cluster", "connection": {"proxyProtocol": "HTTPConnect",
                                                   "transport": {"uds": {"udsName": str(paths.run / "egress.sock")}}}},
                {"name": "controlplane", "connection": {"proxyProtocol": "Direct"}},
                {"name": "etcd", "connection": {"proxyProtocol": "Direct"}}]}


def _argv(paths: SimPaths, bin_dir: Path) -> dict[str, list[str]]:
    address, pki, run = paths.apiserver_address, pki_dir(paths), paths.run
    etcd_url = f"http://{address}:{ETCD_CLIENT_PORT}"
    peer_url = f"http://{address}:{ETCD_PEER_PORT}"
    return {
        "egress": [sys.executable, "-m", "gpunode_sim.cluster.egress", str(run / "egress.sock")],
        "etcd": [str(bin_dir / "etcd"), "--name", "gpunode-sim", "--data-dir", str(paths.state / "etcd"),
                 "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                 "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                 "--initial-cluster", f"gpunode-sim={peer_url}", "--log-level", "warn",
                 "--unsafe-no-fsync"],  # a test cluster: durability is not what it is for
        "kube-apiserver": [
            str(bin_dir / "kube-apiserver"), f"--advertise-address={address}", f"--bind-address={address}",
            f"--secure-port={APISERVER_PORT}", f"--etcd-servers={etcd_url}", f"--cert-dir={run / 'apiserver-certs'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_RANGE}", "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP", "--endpoint-reconciler-type=none",
            f"--egress-selector-config-file={pki / 'egress-selector.yaml'}",
            f"--audit-policy-file={pki / 'audit-policy.yaml'}", f"--audit-log-path={run / 'kube-apiserver-audit.log'}",
            "--audit-log-format=json", "--profiling=false"],
        "kube-controller-manager": [
            str(bin_dir / "kube-controller-manager"), f"--kubeconfig={pki / 'kube-controller-manager.kubeconfig'}",
            f"--bind-address={address}", f"--secure-port={CONTROLLER_MANAGER_PORT}",
            f"--cert-dir={run / 'controller-manager-certs'}", "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true", "--profiling=false"],
        "kube-scheduler": [
            str(bin_dir / "kube-scheduler"), f"--kubeconfig={pki / 'kube-scheduler.kubeconfig'}",
            f"--bind-address={address}", f"--secure-port={SCHEDULER_PORT}",
            f"--cert-dir={run / 'scheduler-certs'}", "--leader-elect=false", "--profiling=false"],
        "apiserver-forward": ["socat", f"UNIX-LISTEN:{run / 'apiserver.sock'},fork,mode=600",
                              f"TCP:{address}:{APISERVER_PORT}"],
    }


def _admin_tls(paths: SimPaths) -> ssl.SSLContext:
    """TLS as the admin user: the cluster's CA and the admin's client certificate."""
    pki = pki_dir(paths)
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return context


def _answers(url: str, context: ssl.SSLContext | None) -> str | None:
    """The body of a 200 answer, else None."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as answer:  # noqa: S310 - our loopback
            return answer.read().decode(errors="replace") if answer.status == 200 else None
    except OSError:
        return None


def _ready_check(paths: SimPaths, role: str) -> Callable[[], bool]:
    address = paths.apiserver_address
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # the components' self-signed serving certificates
    admin = _admin_tls(paths) if role == "kube-apiserver" else None
    checks: dict[str, Callable[[], bool]] = {
        "etcd": lambda: '"health":"true"' in (_answers(f"http://{address}:{ETCD_CLIENT_PORT}/health", None) or ""),
        "kube-apiserver": lambda: _answers(f"https://{address}:{APISERVER_PORT}/readyz",
                                           admin) == "ok",
        "kube-controller-manager": lambda: _answers(f"https://{address}:{CONTROLLER_MANAGER_PORT}/healthz",
                                                    insecure) == "ok",
        "kube-scheduler": lambda: _answers(f"https://{address}:{SCHEDULER_PORT}/healthz", insecure) == "ok",
        "apiserver-forward": lambda: (paths.run / "apiserver.sock").exists(),
        "egress": lambda: (paths.run / "egress.sock").exists(),
    }
    return checks[role]


def start(paths: SimPaths, services: dict[str, int], record: Record, say: Callable[[str], None]) -> Path:
    """Start what is not running yet, in order, each ready before the next; return the kubeconfig."""
    bin_dir = require(paths.cache)  # socat, for the nodes' way in, is among the host checks of 'up'
    kubeconfig = write_access(paths)
    (pki_dir(paths) / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY, sort_keys=False))
    (pki_dir(paths) / "egress-selector.yaml").write_text(yaml.safe_dump(egress_selector(paths), sort_keys=False))
    paths.run.mkdir(parents=True, exist_ok=True)
    commands = _argv(paths, bin_dir)
    started = time.monotonic()
    fresh = []
    for role in ROLES:
        if alive(services.get(role)):
            continue
        for sock in {"apiserver-forward": "apiserver.sock", "egress": "egress.sock"}.get(role, "").split():
            (paths.run / sock).unlink(missing_ok=True)
        log_file = paths.run / f"{role}.log"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with log_file.open("ab") as log:
            proc = subprocess.Popen(commands[role], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
        record(role, proc.pid)
        fresh.append(role)
        ready = _ready_check(paths, role)
        deadline = time.monotonic() + READY_TIMEOUT
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-12:])
                why = f"exited {proc.returncode}" if proc.poll() is not None else f"not ready in {READY_TIMEOUT:.0f} s"
                raise GpunodeError(f"the fleet's {role} {why}:\n{tail}", f"see {log_file}")
            time.sleep(0.2)
    if "kube-apiserver" in fresh:
        _bootstrap_objects(kubeconfig)
    if fresh:
        say(f"control plane ({', '.join(fresh)}) ready in {time.monotonic() - started:.1f} s at "
            f"{server_url(paths)}")
    return kubeconfig


def admin_client(kubeconfig: Path, field_manager: str | None = None) -> Client:
    """A client of the fleet's API as its admin (the kubeconfig's ``gpunode-sim`` context)."""
    from lightkube import Client, KubeConfig

    return Client(KubeConfig.from_file(kubeconfig).get("gpunode-sim"), field_manager=field_manager,
                  trust_env=False, timeout=10)


def _bootstrap_objects(kubeconfig: Path) -> None:
    """What a cluster admin would add: gpunode's least-privilege rules for the operator's user and the node
    checker's rights and own-node policy (``gpunode render --rbac``, for the default plugin namespace) and the
    viewer user's binding to the built-in ``view`` ClusterRole.

    Returns once the controller manager has aggregated ``view``'s rules (until then it grants nothing).
    """
    from lightkube.codecs import from_dict
    from lightkube.resources.rbac_authorization_v1 import ClusterRole

    client = admin_client(kubeconfig, field_manager="gpunode-sim")
    for document in [*rbac.documents(ManifestSettings.namespace, f"User:{OPERATOR_USER}"),
                     *rbac.own_pods_documents(ManifestSettings.namespace)]:  # all that 'gpunode render --rbac' prints
        client.apply(from_dict(document), force=True)
    binding = from_dict({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpunode-sim-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "gpunode-viewer"}]})
    client.apply(binding, force=True)
    deadline = time.monotonic() + READY_TIMEOUT
    while not client.get(ClusterRole, "view").rules:
        if time.monotonic() > deadline:
            raise GpunodeError("the controller manager did not aggregate the view ClusterRole's rules",
                               "see run/kube-controller-manager.log")
        time.sleep(0.2)


def stop(services: dict[str, int], timeout: float = 20) -> None:
    """Stop the control plane's processes, the API server's clients first, etcd last."""
    for role in reversed(ROLES):
        pid = services.get(role)
        if not alive(pid):
            continue
        signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if alive(pid):
            signal_group(pid, signal.SIGKILL)


def reset_data(paths: SimPaths) -> None:
    """Forget the cluster's objects (etcd's data): the next start is a new cluster with the same certificates."""
    shutil.rmtree(paths.state / "etcd", ignore_errors=True)

