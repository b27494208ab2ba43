"""The simulator's node agent runs a daemon pod from its image as the kubelet would: the pod's capabilities, user,
read-only mounts, emptyDir and the ServiceAccount's projected volume (the node checker's pod needs each)."""

from __future__ import annotations

from gpunode_sim.guest.kubelet_agent import Agent, Container

SPEC = {"name": "checker", "args": ["--interval=20"],
        "securityContext": {"runAsUser": 0, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"], "add": ["SYS_CHROOT"]}},
        "volumeMounts": [{"name": "host", "mountPath": "/host", "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"},
                         {"name": "kube-api-access-x1", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                          "readOnly": True}]}
VOLUMES = [{"name": "host", "hostPath": {"path": "/", "type": "Directory"}}, {"name": "tmp", "emptyDir": {}},
           {"name": "kube-api-access-x1", "projected": {"sources": [
               {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
               {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
               {"downwardAPI": {"items": [{"path": "namespace",
                                           "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]


def test_a_daemon_pods_container_gets_its_security_context_and_mounts() -> None:
    container = Container("gpunode-system/checker-1", SPEC, "registry:5000/checker@sha256:ab", "nvidia", VOLUMES,
                          {"kube-api-access-x1": "/var/lib/gpunode-sim/pods/sa"})
    argv = container.argv({"NODE_NAME": "node02"})
    assert argv[-2:] == ["registry:5000/checker@sha256:ab", "--interval=20"]
    text = " ".join(argv)
    for expected in ("--read-only", "--user 0", "--cap-drop ALL", "--cap-add SYS_CHROOT", "--runtime nvidia",
                     "--mount type=bind,source=/,target=/host,readonly,bind-propagation=rslave", "--tmpfs /tmp",
                     "-v /var/lib/gpunode-sim/pods/sa:/var/run/secrets/kubernetes.io/serviceaccount:ro",
                     "-e NODE_NAME=node02"):
        assert expected in text, expected


class FakeApi:
    def __init__(self) -> None:
        self.tokens: list[tuple] = []

    def pod_token(self, namespace: str, account: str, pod: str, uid: str, seconds: int, audiences: list[str]) -> str:
        self.tokens.append((namespace, account, pod, uid, seconds, audiences))
        return "eyJ-token"

    def config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        return {"ca.crt": "-----BEGIN CERTIFICATE-----\n"} if (namespace, name) == ("gpunode-system",
                                                                                      "kube-root-ca.crt") else None


def test_the_projected_service_account_volume_is_a_token_bound_to_the_pod_the_ca_and_the_namespace() -> None:
    agent = Agent.__new__(Agent)  # no node, no sockets: only the projection is under test
    agent.api = FakeApi()
    pod = {"metadata": {"name": "gpunode-node-checker-x", "namespace": "gpunode-system", "uid": "u-1"},
           "spec": {"serviceAccountName": "gpunode-node-checker"}}
    files = agent.projected(pod, VOLUMES[2]["projected"])
    assert files == {"token": "eyJ-token", "ca.crt": "-----BEGIN CERTIFICATE-----\n", "namespace": "gpunode-system"}
    assert agent.api.tokens == [("gpunode-system", "gpunode-node-checker", "gpunode-node-checker-x", "u-1", 3607, [])]
