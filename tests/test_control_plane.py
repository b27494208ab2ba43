"""The simulated control plane's API semantics, through lightkube as gpunode uses it (no fleet needed)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx2
import pytest
from lightkube import ApiError, Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Namespace, Node, ServiceAccount

from gpunode.cluster.client import ClusterSettings, connect, explain
from gpunode.facts.labels import read_node
from gpunode.sim.apiserver import ControlPlane, Handler
from gpunode.sim.apistore import KINDS

TOKENS = {"admin-token": {"user": "gpunode-admin", "role": "admin"},
          "view-token": {"user": "gpunode-viewer", "role": "view"},
          "old-token": {"user": "gpunode-expired", "role": "admin", "expired": True}}


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[tuple[ControlPlane, str]]:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "apiserver-tokens.json").write_text(json.dumps(TOKENS))
    (tmp_path / "fleet.json").write_text(json.dumps({"nodes": {"node01": {"address": "127.0.0.1"},
                                                              "node02": {"address": "127.0.0.2"}}}))
    control = ControlPlane(tmp_path)
    control.sync_nodes()

    class BoundHandler(Handler):
        pass

    BoundHandler.plane = control
    server = ThreadingHTTPServer(("127.0.0.1", 0), BoundHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield control, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    control.audit.close()


def client(url: str, token: str = "admin-token") -> Client:
    config = KubeConfig.from_dict({"clusters": [{"name": "c", "cluster": {"server": url}}],
                                   "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                                   "users": [{"name": "u", "user": {"token": token}}], "current-context": "c"})
    return Client(config, field_manager="gpunode", trust_env=False)


def label(api: Client, node: str, labels: dict, manager: str = "gpunode", force: bool = False) -> Node:
    return api.apply(Node(apiVersion="v1", kind="Node", metadata=ObjectMeta(name=node, labels=labels)),
                     field_manager=manager, force=force)


def test_fleet_nodes_are_node_objects_with_kubelet_labels(plane: tuple[ControlPlane, str]) -> None:
    nodes = {n.metadata.name: n for n in client(plane[1]).list(Node)}
    assert set(nodes) == {"node01", "node02"}
    assert nodes["node01"].metadata.labels["kubernetes.io/hostname"] == "node01"
    assert nodes["node01"].status.addresses[0].address == "127.0.0.1"


def test_apply_owns_labels_removes_dropped_ones_and_keeps_other_managers_labels(
        plane: tuple[ControlPlane, str]) -> None:
    api = client(plane[1])
    api.patch(Node, "node01", {"metadata": {"labels": {"team": "ml"}}}, field_manager="kubectl-label")
    label(api, "node01", {"a": "1", "b": "2"})
    state = read_node(settings_for(plane), "node01")
    assert state.ours == {"a", "b"} and state.others["team"] == "kubectl-label"
    label(api, "node01", {"a": "1"})
    labels = api.get(Node, "node01").metadata.labels
    assert "b" not in labels and labels["a"] == "1" and labels["team"] == "ml"


def test_unchanged_apply_writes_nothing(plane: tuple[ControlPlane, str]) -> None:
    api = client(plane[1])
    first = label(api, "node01", {"a": "1"}).metadata.resourceVersion
    assert label(api, "node01", {"a": "1"}).metadata.resourceVersion == first
    assert label(api, "node01", {"a": "2"}).metadata.resourceVersion != first


def test_apply_over_another_managers_value_is_a_conflict_unless_forced(plane: tuple[ControlPlane, str]) -> None:
    api = client(plane[1])
    api.patch(Node, "node02", {"metadata": {"labels": {"accelerator": "custom"}}}, field_manager="kubectl-label")
    with pytest.raises(ApiError) as caught:
        label(api, "node02", {"accelerator": "nvidia-v100"})
    assert caught.value.status.code == 409
    assert caught.value.status.message == ('Apply failed with 1 conflict: conflict with "kubectl-label" using v1: '
                                           ".metadata.labels.accelerator")
    label(api, "node02", {"accelerator": "custom"})  # the same value is shared ownership, no conflict
    label(api, "node02", {"accelerator": "nvidia-v100"}, force=True)
    assert api.get(Node, "node02").metadata.labels["accelerator"] == "nvidia-v100"


def test_errors_are_kubernetes_status_objects(plane: tuple[ControlPlane, str]) -> None:
    control, url = plane
    with pytest.raises(ApiError) as missing:
        client(url).get(Node, "ghost")
    assert (missing.value.status.code, missing.value.status.message) == (404, 'nodes "ghost" not found')
    with pytest.raises(ApiError) as denied:
        label(client(url, "view-token"), "node01", {"a": "1"})
    assert denied.value.status.code == 403
    assert denied.value.status.message == ('nodes "node01" is forbidden: User "gpunode-viewer" cannot patch resource '
                                           '"nodes" in API group "" at the cluster scope')
    with pytest.raises(ApiError) as expired:
        client(url, "old-token").get(Node, "node01")
    assert (expired.value.status.code, expired.value.status.reason) == (401, "Unauthorized")
    with pytest.raises(ApiError) as no_namespace:
        client(url).apply(ServiceAccount(apiVersion="v1", kind="ServiceAccount",
                                         metadata=ObjectMeta(name="x", namespace="nowhere")))
    assert no_namespace.value.status.message == 'namespaces "nowhere" not found'


def test_anything_not_implemented_answers_501_with_the_path(plane: tuple[ControlPlane, str]) -> None:
    url = plane[1]
    headers = {"Authorization": "Bearer admin-token"}
    for method, path in (("GET", "/apis/batch/v1/jobs"), ("POST", "/api/v1/nodes"),
                         ("GET", "/api/v1/nodes?watch=true"), ("GET", "/api/v1/nodes/node01/status"),
                         ("POST", "/api/v1/namespaces/x/pods/p/exec")):
        answer = httpx2.request(method, url + path, headers=headers)
        assert answer.status_code == 501, (method, path)
        assert path.split("?")[0] in answer.json()["message"]


def test_daemonset_pods_follow_the_node_selector(plane: tuple[ControlPlane, str]) -> None:
    control, url = plane
    api = client(url)
    api.apply(Namespace(apiVersion="v1", kind="Namespace", metadata=ObjectMeta(name="gpu")))
    api.apply(DaemonSet.from_dict({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "plugin", "namespace": "gpu"},
        "spec": {"selector": {"matchLabels": {"app": "p"}}, "template": {
            "metadata": {"labels": {"app": "p"}},
            "spec": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                     "containers": [{"name": "c", "image": "i"}]}}}}))
    control.reconcile()  # fleet.json records no running node process, so no agent starts
    assert api.get(DaemonSet, "plugin", namespace="gpu").status.desiredNumberScheduled == 0
    label(api, "node02", {"nvidia.com/gpu.present": "true"})
    status = api.get(DaemonSet, "plugin", namespace="gpu").status
    assert (status.desiredNumberScheduled, status.numberReady) == (1, 0)
    pods = control.store.items(next(k for k in KINDS if k.kind == "Pod"))
    assert [p.obj["spec"]["nodeName"] for p in pods] == ["node02"]


def settings_for(plane: tuple[ControlPlane, str], token: str = "admin-token") -> ClusterSettings:
    path = Path(plane[0].state_dir) / f"kubeconfig-{token}"
    path.write_text(json.dumps({"clusters": [{"name": "c", "cluster": {"server": plane[1]}}],
                                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                                "users": [{"name": "u", "user": {"token": token}}], "current-context": "c"}))
    return ClusterSettings(kubeconfig=str(path))


def test_api_failures_are_explained_in_one_line(plane: tuple[ControlPlane, str], tmp_path: Path) -> None:
    expired = settings_for(plane, "old-token")
    client_, server = connect(expired)
    with pytest.raises(ApiError) as caught:
        client_.get(Node, "node01")
    assert "refused the credentials" in str(explain(caught.value, expired, server, "read node node01"))
    unreachable = tmp_path / "far"
    unreachable.write_text(json.dumps({"clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                                       "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                                       "users": [{"name": "u", "user": {"token": "t"}}], "current-context": "c"}))
    with pytest.raises(Exception) as down:
        read_node(ClusterSettings(kubeconfig=str(unreachable)), "node01")
    assert "cannot reach the Kubernetes API at http://127.0.0.1:9" in str(down.value)
    with pytest.raises(Exception) as nofile:
        read_node(ClusterSettings(kubeconfig=str(tmp_path / "none")), "node01")
    assert "no kubeconfig at" in str(nofile.value) and "cluster_steps = False" in str(nofile.value)
    with pytest.raises(Exception) as context:
        read_node(ClusterSettings(kubeconfig=str(unreachable), kube_context="prod"), "node01")
    assert "Context 'prod' not found" in str(context.value) and "kube_context to one of: c" in str(context.value)
