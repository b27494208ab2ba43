"""The session fleet's control plane is real Kubernetes, used as an SRE would use a cluster.

kubectl (built with the control plane) against the fleet's kubeconfig, the three
identities it holds (admin, viewer bound to ``view``, an expired certificate), the
nodes' kubelets as the Node authorizer and NodeRestriction see them, and what
listens on the machine while the fleet runs.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from gpunode_sim.build.kubernetes import KUBERNETES_VERSION, require
from gpunode_sim.host.paths import SimPaths
from lightkube import ApiError, Client, KubeConfig
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node

from .conftest import block

pytestmark = pytest.mark.fleet


def kubectl(fleet: dict, *args: str, context: str = "gpunode-sim") -> subprocess.CompletedProcess[str]:
    binary = require(SimPaths.from_env().cache) / "kubectl"
    kubeconfig = Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "kubeconfig"
    return subprocess.run([str(binary), "--kubeconfig", str(kubeconfig), "--context", context, *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_kubectl_lists_the_fleets_nodes_ready_with_their_runtimes(fleet: dict) -> None:
    result = kubectl(fleet, "get", "nodes", "-o", "json")
    assert result.returncode == 0, result.stderr
    nodes = {n["metadata"]["name"]: n for n in json.loads(result.stdout)["items"]}
    assert sorted(nodes) == ["node01", "node02", "node03"]
    for node in nodes.values():
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
    assert nodes["node01"]["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.6.")
    assert nodes["node02"]["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("docker://20.10.")
    # the real kubelet (containerd nodes) refuses a loopback node IP: the node's own 10.230.B.N; the agent (docker)
    assert nodes["node01"]["status"]["addresses"][0] == {"type": "InternalIP",
                                                            "address": f"10.230.{block(fleet['env'])}.1"}
    assert nodes["node02"]["status"]["addresses"][0] == {"type": "InternalIP",
                                                            "address": f"127.0.{block(fleet['env'])}.2"}
    assert nodes["node01"]["status"]["nodeInfo"]["kubeletVersion"] == "v1.35.4"
    version = json.loads(kubectl(fleet, "version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == f"v{KUBERNETES_VERSION}"
    assert kubectl(fleet, "get", "pods", "-A").returncode == 0


def test_every_node_renews_its_lease(fleet: dict) -> None:
    client = Client(KubeConfig.from_file(Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "kubeconfig").get(),
                    trust_env=False)
    for name in ("node01", "node02", "node03"):
        lease = client.get(Lease, name, namespace="kube-node-lease")
        assert lease.spec.holderIdentity == name
        age = datetime.datetime.now(datetime.UTC) - lease.spec.renewTime
        assert age < datetime.timedelta(seconds=40), age


def test_the_viewer_reads_pods_but_not_nodes_and_the_expired_certificate_is_refused(fleet: dict) -> None:
    assert kubectl(fleet, "get", "pods", "-A", context="gpunode-sim-viewer").returncode == 0
    nodes = kubectl(fleet, "get", "nodes", context="gpunode-sim-viewer")
    assert nodes.returncode == 1
    assert 'User "gpunode-viewer" cannot list resource "nodes" in API group "" at the cluster scope' in nodes.stderr
    expired = kubectl(fleet, "get", "nodes", context="gpunode-sim-expired")
    assert expired.returncode == 1 and "Unauthorized" in expired.stderr


def node_client(fleet: dict, node: str) -> Client:
    """The API as ``node``'s kubelet sees it: its own client certificate from the node's disk."""
    state = Path(fleet["env"]["GPUNODE_SIM_DIR"])
    pki = state / "nodes" / node / "upper" / "etc" / "kubernetes" / "pki"
    admin = yaml.safe_load((state / "kubeconfig").read_text())

    def data(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {**admin, "users": [{"name": "gpunode-sim", "user": {
        "client-certificate-data": data("kubelet-client.crt"), "client-key-data": data("kubelet-client.key")}}],
        "contexts": [{"name": "gpunode-sim", "context": {"cluster": "gpunode-sim", "user": "gpunode-sim"}}]}
    return Client(KubeConfig.from_dict(config).get("gpunode-sim"), trust_env=False)


def test_a_nodes_kubelet_may_change_its_own_node_only(fleet: dict) -> None:
    client = node_client(fleet, "node01")
    assert client.get(Node, "node01").metadata.name == "node01"
    with pytest.raises(ApiError) as refused:
        client.patch(Node, "node02", {"metadata": {"labels": {"stolen": "yes"}}})
    assert refused.value.status.code == 403
    assert 'node "node01" is not allowed to modify node "node02"' in refused.value.status.message


def listening_sockets() -> dict[int, str]:
    """inode -> local address of every listening TCP socket in this network namespace."""
    found = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":
                continue
            address = fields[1].split(":")[0]
            if width == 8:
                text = ".".join(str(b) for b in reversed(bytes.fromhex(address)))
            else:
                text = address
            found[int(fields[9])] = text
    return found


def test_nothing_of_the_fleet_listens_beyond_loopback(fleet: dict) -> None:
    state = fleet["env"]["GPUNODE_SIM_DIR"]
    sockets = listening_sockets()
    ours: list[tuple[str, str]] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if state not in cmdline or os.readlink(proc / "ns" / "net") != os.readlink("/proc/self/ns/net"):
                continue
            inodes = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue
        for inode in inodes:
            if inode.startswith("socket:[") and int(inode[8:-1]) in sockets:
                ours.append((cmdline.split()[0], sockets[int(inode[8:-1])]))
    binaries = {Path(binary).name for binary, _ in ours}
    assert {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "socat"} <= binaries, ours
    assert all(address.startswith("127.") for _, address in ours), ours
