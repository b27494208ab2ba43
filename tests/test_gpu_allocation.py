"""One allocation method per node (gpu_allocation): the labels that place gpunode's device plugin or its DRA driver,
the DRA driver's objects and rights as rendered, the proof a DRA node gives (its ResourceSlice), and the settings a
DRA node needs."""

from __future__ import annotations

import pytest
from gpunode_plugin.dra_devices import DRIVER, device_classes, slice_name

from gpunode.cluster import rbac
from gpunode.cluster.labels import DRA_LABEL, PLUGIN_LABEL, LabelSettings, gpu_labels
from gpunode.cluster.manifests import ManifestSettings, documents, render
from gpunode.diagnosis import Verdict
from gpunode.diagnosis.device_plugin import DRA_DRIVER, dra_offer, dra_slice_name
from gpunode.errors import GpunodeError
from gpunode.facts import claims
from gpunode.facts.labels import NodeLabelsState
from gpunode.host_settings import HostSettings
from gpunode.operations.allocation import switching_from
from gpunode.steps.device_plugin import checker_settings
from gpunode.verify.checks import ClusterView
from gpunode.verify.targets import Target

GPU = {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "driver_version": "550.54.15", "memory_mib": 81920,
       "compute_cap": "8.0", "mig_mode": "Disabled"}
GPUS = [GPU, {**GPU, "index": 1}]
DRA_NODE = {"gpu_allocation": "dra", "cdi_enabled": True, "plugin_device_list_strategy": "volume-mounts"}


@pytest.mark.parametrize(("method", "present", "absent"), [
    ("device-plugin", PLUGIN_LABEL, DRA_LABEL),
    ("dra", DRA_LABEL, PLUGIN_LABEL),
])
def test_the_node_is_labelled_for_exactly_one_method(method: str, present: str, absent: str) -> None:
    labels = gpu_labels(GPUS, LabelSettings(allocation=method)).labels
    assert labels[present] == "true" and absent not in labels


@pytest.mark.parametrize(("live", "method", "expected"), [
    ({PLUGIN_LABEL: "true"}, "dra", "device-plugin"),
    ({DRA_LABEL: "true"}, "device-plugin", "dra"),
    ({DRA_LABEL: "true"}, "dra", None),
    ({}, "dra", None),  # a node new to gpunode: nothing to drain
])
def test_a_switch_is_read_from_the_nodes_live_labels(live: dict, method: str, expected: str | None) -> None:
    assert switching_from(live, method) == expected


@pytest.mark.parametrize(("data", "missing"), [
    ({"gpu_allocation": "dra"}, "cdi_enabled = True and plugin_device_list_strategy"),
    ({**DRA_NODE, "cdi_enabled": False}, "cdi_enabled = True"),
    ({**DRA_NODE, "plugin_device_list_strategy": "envvar"}, 'plugin_device_list_strategy = "volume-mounts"'),
])
def test_a_dra_node_without_what_the_driver_needs_is_refused_by_name(data: dict, missing: str) -> None:
    with pytest.raises(GpunodeError) as raised:
        HostSettings.from_data(data)
    assert f"gpu_allocation = dra needs {missing}" in raised.value.problem


def test_a_wrong_method_names_the_allowed_ones() -> None:
    with pytest.raises(GpunodeError) as raised:
        HostSettings.from_data({"gpu_allocation": "both"})
    assert "gpu_allocation" in str(raised.value) and "device-plugin" in str(raised.value)


def test_the_dra_objects_are_rendered_only_where_a_node_uses_dra() -> None:
    plain = documents(render(ManifestSettings()))
    assert not [d for d in plain if d["metadata"]["name"] == "gpunode-dra-driver"]
    rendered = documents(render(ManifestSettings(dra_driver=True, checker_api_server="10.0.0.1:6443")))
    daemonset = next(d for d in rendered if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "gpunode-dra-driver")
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", DRA_LABEL: "true"}
    assert spec["serviceAccountName"] == "gpunode-dra-driver" and spec["hostNetwork"] is True
    container = spec["containers"][0]
    assert container["command"][-1] == "gpunode_plugin.dra_driver"
    assert {"name": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"} in container["env"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # the device plugin's DaemonSet never lands on a DRA node: it selects the other label
    plugin = next(d for d in rendered if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "gpunode-device-plugin")
    assert plugin["spec"]["template"]["spec"]["nodeSelector"][PLUGIN_LABEL] == "true"


def test_the_rendered_device_classes_are_the_drivers_own() -> None:
    rendered = {d["metadata"]["name"]: d["spec"] for d in documents(render(ManifestSettings(dra_driver=True)))
                if d["kind"] == "DeviceClass"}
    assert rendered == {c["metadata"]["name"]: c["spec"] for c in device_classes()}
    assert tuple(sorted(rendered)) == tuple(sorted(rbac.DRA_CLASSES))
    assert DRA_DRIVER == DRIVER


def test_the_drivers_rights_are_printed_with_gpunodes() -> None:
    printed = documents(rbac.render("gpunode-system"))
    role = next(d for d in printed if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpunode-dra-driver")
    assert {tuple(r["resources"]): r["verbs"] for r in role["rules"]} == {
        ("resourceslices",): ["get", "create", "patch"], ("resourceclaims",): ["get"]}
    binding = next(d for d in printed if d["kind"] == "ClusterRoleBinding"
                   and d["metadata"]["name"] == "gpunode-dra-driver")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpunode-dra-driver",
                                    "namespace": "gpunode-system"}]


NODE = NodeLabelsState("node01", True, {DRA_LABEL: "true"}, allocatable={})


@pytest.mark.parametrize(("gpus", "devices", "code"), [
    (GPUS, ["gpu-0", "gpu-1"], None),
    (GPUS, ["gpu-0"], "dra-slice-missing"),
    (GPUS, [], "dra-slice-missing"),
    ([{**GPU, "mig_mode": "Enabled"}], ["gpu-0-mig-1-0", "gpu-0-mig-5-0"], None),
    ([{**GPU, "mig_mode": "Enabled"}], ["gpu-0"], "dra-slice-missing"),
])
def test_a_dra_node_is_proven_by_its_resource_slice(gpus: list[dict], devices: list[str], code: str | None) -> None:
    found = dra_offer(NODE, gpus, devices, "gpunode-system")
    assert len(found) == 1
    if code is None:
        assert found[0].state is Verdict.OK
        assert f"spec.driver={DRA_DRIVER}: {len(devices)} device(s)" in found[0].evidence[0]
    else:
        assert (found[0].state, found[0].code) == (Verdict.FINDING, code)
        assert "gpunode-dra-driver" in found[0].fix and f"{len(devices)} device(s)" in found[0].evidence[0]


class FakeCluster(ClusterView):
    """The cluster as verify reads it, from fixed data: one Node, no NVIDIA DaemonSets, the given slices."""

    def __init__(self, node: NodeLabelsState, offered: dict) -> None:
        super().__init__()
        self.the_node, self.the_offer = node, offered

    def node(self, settings: object, name: str) -> NodeLabelsState:
        return self.the_node

    def foreign(self, settings: object) -> list:
        return []

    def slice_list(self, settings: object) -> dict | GpunodeError:
        return self.the_offer


def dra_node(**changes: object) -> NodeLabelsState:
    labels = {**gpu_labels(GPUS, LabelSettings(allocation="dra")).labels}
    return NodeLabelsState("node01", True, labels, frozenset(labels), **changes)


@pytest.mark.parametrize(("node", "offered", "state", "code"), [
    (dra_node(), {"node01": {DRA_DRIVER: ["node01/gpu-0", "node01/gpu-1"]}}, Verdict.OK, None),
    (dra_node(), {}, Verdict.FINDING, "dra-slice-missing"),
    (dra_node(allocatable={"nvidia.com/gpu": "2"}), {"node01": {DRA_DRIVER: ["node01/gpu-0", "node01/gpu-1"]}},
     Verdict.FINDING, "offered-twice"),
    # the slices could not be listed (RBAC): the API's refusal, never "no devices"
    (dra_node(), GpunodeError("cannot list the ResourceSlices: forbidden", "re-apply gpunode render --rbac"),
     Verdict.FINDING, "cluster-unreadable"),
])
def test_verify_judges_a_dra_nodes_link_by_its_slice(node: NodeLabelsState, offered: dict, state: Verdict,
                                                     code: str | None) -> None:
    parsed = HostSettings.from_data(DRA_NODE)
    facts = {"driver": {"nvidia_smi": {"gpus": GPUS}}, "hostname": "node01"}
    results = FakeCluster(node, offered).judge("node01", parsed, facts, True)
    assert results["labels"].state is Verdict.OK, results["labels"]
    link = results["device_plugin"]
    assert link.state is state, link
    assert [f.code for f in link.findings if f.state is not Verdict.OK][:1] == ([code] if code else [])


def test_the_node_checker_knows_a_dra_node_and_reads_its_slice_by_name() -> None:
    per_node = checker_settings([Target("node01", dict(DRA_NODE), []), Target("node02", {}, [])])
    assert per_node["node01"]["gpu_allocation"] == "dra" and "gpu_allocation" not in per_node["node02"]
    assert HostSettings.from_data(per_node["node01"]).labels.allocation == "dra"  # as the checker parses it
    assert dra_slice_name("node01") == slice_name("node01")
    rules = next(d for d in documents(rbac.render("gpunode-system"))
                 if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpunode-node-checker")["rules"]
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get"]} in rules


def test_the_node_checker_reads_its_own_slices_device_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """OwnNodeView's one GET by name, through the same helper verify's list uses."""

    class Slice:
        def to_dict(self) -> dict:
            return {"spec": {"nodeName": "node01", "devices": [{"name": "gpu-1"}, {"name": "gpu-0"}]}}

    class Client:
        def get(self, resource: object, name: str, namespace: str | None = None) -> Slice:
            asked.append(name)
            return Slice()

    asked: list[str] = []
    monkeypatch.setattr(claims, "api_call", lambda settings, action, call: call(Client()))
    assert claims.read_slice_devices(HostSettings.from_data(DRA_NODE).cluster, dra_slice_name("node01")) == [
        "gpu-0", "gpu-1"]
    assert asked == [dra_slice_name("node01")]
    assert claims.device_names([{"spec": {}}, {"spec": {"devices": [{"name": "b"}, {"name": "a"}]}}]) == ["a", "b"]
