"""End to end on the session fleet and its control plane: labels, the device-plugin rollout, allocatable GPUs.

Runs after tests/test_provisioning.py (file order), which leaves every node
bootstrapped, cluster steps included. The plugin pods run the real plugin inside
the nodes; allocatable comes from its registration with each node's kubelet
stand-in. The control plane is real Kubernetes; writes are counted in its audit log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpunode_sim.cluster.controlplane import OPERATOR_CONTEXT, OPERATOR_USER
from lightkube import Client, KubeConfig
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod

from .conftest import block
from .test_provisioning import deploy, failing, verify

pytestmark = pytest.mark.fleet
NAMESPACE = "gpunode-system"


def api(fleet: dict, context: str = "gpunode-sim") -> Client:
    kubeconfig = Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "kubeconfig"
    return Client(KubeConfig.from_file(kubeconfig).get(context), trust_env=False)


def writes(fleet: dict) -> list[dict]:
    """The API server's audit log: requests by the deploy's user (gpunode, least privilege) that were not reads."""
    audit = Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "run" / "kube-apiserver-audit.log"
    entries = map(json.loads, audit.read_text().splitlines())
    return [e for e in entries if e["stage"] == "ResponseComplete" and e["user"]["username"] == OPERATOR_USER
            and e["verb"] not in ("get", "list", "watch")]


def gpunode_labels(node: Node) -> dict[str, str]:
    return {k: v for k, v in node.metadata.labels.items() if k.startswith("nvidia.com/") or k == "accelerator"}


def test_gpu_nodes_carry_their_gpu_labels_and_the_cpu_node_none(fleet: dict) -> None:
    client = api(fleet)
    a100 = gpunode_labels(client.get(Node, "node01"))
    assert a100["accelerator"] == "nvidia-a100"
    assert a100["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert a100["nvidia.com/gpu.count"] == "4" and a100["nvidia.com/gpu.present"] == "true"
    assert a100["nvidia.com/gpu.family"] == "ampere" and a100["nvidia.com/gpu.memory"] == "40960"
    assert gpunode_labels(client.get(Node, "node02"))["accelerator"] == "nvidia-v100"
    assert gpunode_labels(client.get(Node, "node03")) == {}
    owners = {e.manager for e in client.get(Node, "node01").metadata.managedFields if e.operation == "Apply"}
    assert owners == {"gpunode"}


def test_plugin_runs_on_exactly_the_gpu_nodes_and_they_offer_every_gpu(fleet: dict) -> None:
    client = api(fleet)
    ds = client.get(DaemonSet, "gpunode-device-plugin", namespace=NAMESPACE)
    assert (ds.status.desiredNumberScheduled, ds.status.updatedNumberScheduled, ds.status.numberReady) == (2, 2, 2)
    pods = list(client.list(Pod, namespace=NAMESPACE))
    assert sorted(p.spec.nodeName for p in pods) == ["node01", "node02"]
    assert all(p.status.containerStatuses[0].ready for p in pods)
    allocatable = {n: client.get(Node, n).status.allocatable.get("nvidia.com/gpu") for n in ("node01", "node02",
                                                                                             "node03")}
    assert allocatable == {"node01": "4", "node02": "2", "node03": None}


def test_a_rerun_sends_no_write_to_the_api(fleet: dict, tmp_path: Path) -> None:
    before = len(writes(fleet))
    result, report = deploy(fleet, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert all(not r["changed"] for r in report.values()), report
    assert len(writes(fleet)) == before


def test_a_label_someone_else_set_survives_every_run(fleet: dict, tmp_path: Path) -> None:
    client = api(fleet)
    client.patch(Node, "node02", {"metadata": {"labels": {"team": "vision", "accelerator": "v100-custom"}}},
                 field_manager="kubectl-label")
    result, _ = deploy(fleet, tmp_path, "labels")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "label accelerator is owned by kubectl-label" in result.stdout + result.stderr
    labels = client.get(Node, "node02").metadata.labels
    assert (labels["team"], labels["accelerator"], labels["nvidia.com/gpu.count"]) == ("vision", "v100-custom", "2")
    client.patch(Node, "node02", {"metadata": {"labels": {"accelerator": None}}}, field_manager="kubectl-label")
    assert deploy(fleet, tmp_path, "labels")[0].returncode == 0
    labels = client.get(Node, "node02").metadata.labels
    assert (labels["team"], labels["accelerator"]) == ("vision", "nvidia-v100")


def test_labels_gpunode_no_longer_sets_are_removed(fleet: dict, tmp_path: Path) -> None:
    client = api(fleet)
    result, _ = deploy(fleet, tmp_path, "labels", "--data", "label_model_key=gpu-model")
    assert result.returncode == 0, result.stdout[-3000:]
    labels = client.get(Node, "node01").metadata.labels
    assert labels["gpu-model"] == "nvidia-a100" and "accelerator" not in labels
    assert deploy(fleet, tmp_path, "labels")[0].returncode == 0
    labels = client.get(Node, "node01").metadata.labels
    assert labels["accelerator"] == "nvidia-a100" and "gpu-model" not in labels


@pytest.mark.parametrize(("data", "message"), [
    ("kube_context=gpunode-sim-expired", "refused the credentials"),
    ("kube_context=gpunode-sim-viewer",  # bound to the built-in view ClusterRole, which has no nodes at all;
     # the labels step lists the Nodes once per run
     'RBAC denied: nodes is forbidden: User "gpunode-viewer" cannot list resource "nodes" in API group "" '
     "at the cluster scope"),
    ("kube_context=no-such-context", "Context 'no-such-context' not found"),
])
def test_api_access_problems_fail_with_one_clear_line_and_label_nothing(
        fleet: dict, tmp_path: Path, data: str, message: str) -> None:
    before = api(fleet).get(Node, "node01").metadata.labels
    result, report = deploy(fleet, tmp_path, "labels", "--limit", "node01", "--data", data,
                            "--data", "label_model_prefix=gpu-")
    assert result.returncode == 1
    assert message in result.stdout + result.stderr, result.stdout[-3000:] + result.stderr[-2000:]
    assert report["node01"]["failed"]
    assert api(fleet).get(Node, "node01").metadata.labels == before


def test_unreachable_api_server_is_named(fleet: dict, tmp_path: Path) -> None:
    far = f"http://127.0.{block(fleet['env'])}.252:6443"  # nothing listens there
    kubeconfig = tmp_path / "far.yaml"
    kubeconfig.write_text(json.dumps({
        "clusters": [{"name": "c", "cluster": {"server": far}}],
        "contexts": [{"name": OPERATOR_CONTEXT, "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}], "current-context": OPERATOR_CONTEXT}))
    result, report = deploy(fleet, tmp_path, "labels", "--data", f"kubeconfig={kubeconfig}")
    assert result.returncode == 1
    assert f"cannot reach the Kubernetes API at {far}" in result.stdout + result.stderr
    assert report["node01"]["failed"] and report["node02"]["failed"]


def test_a_host_without_a_node_object_fails_alone(fleet: dict, tmp_path: Path) -> None:
    result, report = deploy(fleet, tmp_path, "labels", "--limit", "node01", "--data", "k8s_node_name=ghost")
    assert result.returncode == 1
    assert "the cluster has no Node named ghost" in result.stdout + result.stderr
    result, report = deploy(fleet, tmp_path, "labels")
    assert result.returncode == 0 and not report["node01"]["failed"]


def test_verify_names_a_node_whose_plugin_is_not_running(fleet: dict, tmp_path: Path) -> None:
    client = api(fleet)
    client.patch(Node, "node02", {"spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}},
                 field_manager="kubectl")
    try:
        result, results = verify(fleet, tmp_path)
        assert result.returncode == 1
        reason = failing(results)[("node02", "device_plugin")]
        assert "no device-plugin pod runs there" in reason, reason
        assert list(failing(results)) == [("node02", "device_plugin")]
    finally:
        client.patch(Node, "node02", {"spec": {"taints": None}}, field_manager="kubectl")
    result, report = deploy(fleet, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert verify(fleet, tmp_path)[0].returncode == 0
