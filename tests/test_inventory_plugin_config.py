"""Data-driven: the plugin's config as inventory data, and the resources a node must then offer."""

from __future__ import annotations

import pytest
import yaml

from gpunode.cluster.manifests import ManifestSettings, documents, render
from gpunode.cluster.plugin_config import CONFIG_FILE, CONFIG_MAP, expected_offer, parse_plugin_config
from gpunode.errors import GpunodeError

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
