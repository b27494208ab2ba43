"""NVIDIA's device plugin and GFD recognised in their usual forms; the affinity migrate adds keeps theirs."""

from __future__ import annotations

import pytest
from lightkube.resources.apps_v1 import DaemonSet

from gpunode.facts.coexistence import DEVICE_PLUGIN, FEATURE_DISCOVERY, component_of, parse_daemonset, registrar_on
from gpunode.migrate import affinity_terms


def daemonset(name: str, labels: dict, image: str, node_selector: dict | None = None,
              affinity: dict | None = None) -> DaemonSet:
    spec: dict = {"containers": [{"name": "c", "image": image}], "nodeSelector": node_selector or {}}
    if affinity:
        spec["affinity"] = affinity
    return DaemonSet.from_dict({"apiVersion": "apps/v1", "kind": "DaemonSet",
                                "metadata": {"name": name, "namespace": "kube-system"},
                                "spec": {"selector": {"matchLabels": labels},
                                         "template": {"metadata": {"labels": labels}, "spec": spec}}})


@pytest.mark.parametrize(("name", "labels", "image", "component"), [
    # NVIDIA's static manifest
    ("nvidia-device-plugin-daemonset", {"name": "nvidia-device-plugin-ds"}, "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
     DEVICE_PLUGIN),
    # the Helm chart (release "nvdp")
    ("nvdp-nvidia-device-plugin", {"app.kubernetes.io/name": "nvidia-device-plugin"},
     "nvcr.io/nvidia/k8s-device-plugin:v0.20.0", DEVICE_PLUGIN),
    # a mirrored image under another name, recognised by its labels
    ("gpu-plugin", {"name": "nvidia-device-plugin-ds"}, "registry.local/dp:v0.20.0", DEVICE_PLUGIN),
    ("gpu-feature-discovery", {"app.kubernetes.io/name": "gpu-feature-discovery"},
     "nvcr.io/nvidia/k8s-device-plugin:v0.20.0", FEATURE_DISCOVERY),
    ("gpunode-device-plugin", {"app.kubernetes.io/name": "gpunode-device-plugin"}, "gpunode-device-plugin:0.1.0", None),
    ("kube-proxy", {"k8s-app": "kube-proxy"}, "registry.k8s.io/kube-proxy:v1.35.4", None),
])
def test_nvidia_components_are_recognised_in_their_usual_forms(name: str, labels: dict, image: str,
                                                                component: str | None) -> None:
    assert component_of(name, labels, [image]) == component


def test_the_operator_s_plugin_is_switched_by_its_node_label() -> None:
    found = parse_daemonset(daemonset("nvidia-device-plugin-daemonset", {"app": "nvidia-device-plugin-daemonset"},
                                      "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
                                      {"nvidia.com/gpu.deploy.device-plugin": "true"}))
    assert found is not None and found.operator_managed and not found.excludes_plugin_label


def test_the_affinity_is_anded_into_every_existing_term_once() -> None:
    helm_like = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In",
                               "values": ["true"]}]},
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}}
    terms = affinity_terms(daemonset("nvdp", {"a": "b"}, "x", affinity=helm_like))
    keep_off = {"key": "gpunode.io/device-plugin", "operator": "DoesNotExist"}
    assert [term["matchExpressions"][-1] for term in terms] == [keep_off, keep_off]
    assert terms[0]["matchExpressions"][0]["key"] == "feature.node.kubernetes.io/pci-10de.present"
    assert affinity_terms(daemonset("static", {"a": "b"}, "x")) == [{"matchExpressions": [keep_off]}]
    patched = daemonset("static", {"a": "b"}, "x", affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [keep_off]}]}}})
    assert parse_daemonset(daemonset("nvidia-device-plugin-daemonset", {"a": "b"}, "x", affinity=patched.spec.template
                                     .spec.affinity.to_dict())).excludes_plugin_label
    assert affinity_terms(patched) == [{"matchExpressions": [keep_off]}]  # not added twice


def test_the_registrar_of_a_node_is_the_device_plugin_not_gfd() -> None:
    from gpunode.facts.coexistence import ForeignDaemonSet

    gfd = ForeignDaemonSet("kube-system", "gpu-feature-discovery", FEATURE_DISCOVERY, pods={"n1": "gfd-1"})
    plugin = ForeignDaemonSet("kube-system", "nvidia-device-plugin-daemonset", DEVICE_PLUGIN, pods={"n2": "dp-2"})
    assert registrar_on([gfd, plugin], "n1") is None
    assert registrar_on([gfd, plugin], "n2") is plugin
