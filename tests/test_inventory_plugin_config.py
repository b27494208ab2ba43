"""Data-driven: the plugin's config as inventory data, and the resources a node must then offer."""

from __future__ import annotations

import json

import pytest
import yaml

from gpunode.cluster.manifests import ManifestSettings, documents, render
from gpunode.cluster.plugin_config import CONFIG_FILE, CONFIG_MAP, expected_offer, parse_plugin_config
from gpunode.errors import GpunodeError
from gpunode.operations.device_plugin import foreign_config, foreign_extras, stamped

SLICED = {"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
GPUS = [{"index": i, "mig_mode": "Disabled"} for i in range(4)]


@pytest.mark.parametrize(("config", "mig", "resource", "count"), [
    (None, "none", "nvidia.com/gpu", 4),
    (SLICED, "none", "nvidia.com/gpu", 16),
    ({**SLICED, "sharing": {"timeSlicing": {"renameByDefault": True, **SLICED["sharing"]["timeSlicing"]}}}, "none",
     "nvidia.com/gpu.shared", 16),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 2, "rename": "nvidia.com/gpu-half"}]}}},
     "none", "nvidia.com/gpu-half", 8),
    (None, "single", "nvidia.com/gpu", 4),  # MIG strategy with MIG off on every GPU: whole GPUs
])
def test_expected_offer(config: dict | None, mig: str, resource: str, count: int) -> None:
    offer = expected_offer(GPUS, mig, parse_plugin_config(config))
    assert (offer.resource, offer.count) == (resource, count)
    assert "4 GPU(s)" in offer.basis


def test_mig_enabled_gpus_make_the_count_unknown_not_wrong() -> None:
    gpus = [{**GPUS[0], "mig_mode": "Enabled"}, *GPUS[1:]]
    offer = expected_offer(gpus, "mixed", None)
    assert offer.count is None and "MIG is enabled on 1 of 4 GPU(s)" in offer.basis


@pytest.mark.parametrize(("value", "message"), [
    ({"version": "v2"}, "version must be 'v1'"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 1}]}}},
     r"resources\[0\].replicas must be a whole number >= 2"),
    ({"version": "v1", "sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replicas": 2}]}}},
     "must be an nvidia.com/ resource"),
    ({"version": "v1", "sharing": {"timeSlicng": {}}}, "unknown key"),
    ({"version": "v1", "flags": {"migStrategy": "mixed"}}, "plugin_mig_strategy is 'none'"),
    ("version: v1\nsharing: [", "not valid YAML"),
    (["version", "v1"], "must be a mapping"),
])
def test_bad_plugin_config_names_the_key(value: object, message: str) -> None:
    with pytest.raises(GpunodeError, match=message):
        ManifestSettings.from_data({"plugin_config": value})


def test_the_config_is_rendered_into_a_configmap_the_daemonset_mounts() -> None:
    settings = ManifestSettings.from_data({"plugin_config": yaml.safe_dump(SLICED)})
    docs = {d["kind"]: d for d in documents(render(settings))}
    assert yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"]) == SLICED
    assert docs["ConfigMap"]["metadata"]["name"] == CONFIG_MAP
    pod = docs["DaemonSet"]["spec"]["template"]
    assert f"--config-file={CONFIG_FILE}" in pod["spec"]["containers"][0]["args"]
    assert {"name": "config", "configMap": {"name": CONFIG_MAP}} in pod["spec"]["volumes"]
    digest = pod["metadata"]["annotations"]["gpunode.io/plugin-config"]
    other = ManifestSettings.from_data({"plugin_config": {**SLICED, "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 8}]}}}})
    changed = {d["kind"]: d for d in documents(render(other))}["DaemonSet"]["spec"]["template"]["metadata"]
    assert changed["annotations"]["gpunode.io/plugin-config"] != digest  # a new config rolls the pods


def test_without_plugin_config_there_is_no_configmap() -> None:
    docs = documents(render(ManifestSettings()))
    assert "ConfigMap" not in {d["kind"] for d in docs}
    assert not any(a.startswith("--config-file") for a in next(
        d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["args"])


# -- what the deploy does with a live configuration it did not render -------------------------------------------

def rendered(data: dict | None = None) -> dict[str, dict]:
    return {d["kind"]: stamped(d) for d in documents(render(ManifestSettings.from_data(data or {})))}


def test_a_config_file_flag_someone_added_is_refused_not_dropped() -> None:
    live = json.loads(json.dumps(rendered()["DaemonSet"]))
    live["spec"]["template"]["spec"]["containers"][0]["args"].append("--config-file=/etc/dp/config.yaml")
    assert foreign_config(live, rendered()["DaemonSet"]) == [
        "daemonset gpunode-device-plugin container device-plugin: --config-file=/etc/dp/config.yaml"]


def test_gpunodes_own_config_may_be_dropped_by_the_inventory() -> None:
    live = rendered({"plugin_config": SLICED})["DaemonSet"]
    assert foreign_config(live, rendered()["DaemonSet"]) == []


def test_a_configmap_edited_since_gpunode_applied_it_is_refused() -> None:
    ours = rendered({"plugin_config": SLICED})["ConfigMap"]
    assert foreign_config(ours, ours) == []
    edited = json.loads(json.dumps(ours))
    edited["data"]["config.yaml"] = edited["data"]["config.yaml"].replace("replicas: 4", "replicas: 8")
    wanted = rendered({"plugin_config": {**SLICED, "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 2}]}}}})["ConfigMap"]
    found = foreign_config(edited, wanted)
    assert len(found) == 1 and "was edited since gpunode applied it" in found[0] and "replicas: 8" in found[0]
    assert foreign_config(ours, wanted) == []  # gpunode's own older config: the inventory's new one replaces it


def test_a_selector_key_of_another_manager_is_removed_by_a_merge_patch() -> None:
    wanted = rendered()["DaemonSet"]
    live = json.loads(json.dumps(wanted))
    live["spec"]["template"]["spec"]["nodeSelector"]["pool"] = "batch"
    live["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": {}}
    live["spec"]["template"]["spec"]["containers"][0]["command"] = ["sleep", "infinity"]
    assert foreign_extras(live, wanted) == {"spec": {"template": {"spec": {
        "nodeSelector": {"pool": None}, "affinity": None,
        "containers": [{"name": "device-plugin", "command": None}]}}}}
    assert foreign_extras(wanted, wanted) == {}


def test_only_the_plugins_config_map_is_judged_as_a_foreign_configuration() -> None:
    """The node checker's settings ConfigMap has no config.yaml: a re-run must not call it edited (it did, and
    every deploy after the first failed with 'could not tell')."""
    from gpunode.cluster.manifests import node_settings_document

    wanted = node_settings_document("gpunode-system", {"node01": {"toolkit_version": "1.20.0-1"}})
    live = {**wanted, "metadata": {**wanted["metadata"], "managedFields": []}}
    assert foreign_config(live, wanted) == []
