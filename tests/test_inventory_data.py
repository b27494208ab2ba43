"""The one schema of inventory data: the data check, the typed settings and the documented group_data agree."""

from __future__ import annotations

import ast
import re
from dataclasses import fields
from pathlib import Path

import pytest

from gpunode.cluster.client import ClusterSettings
from gpunode.cluster.labels import LabelSettings
from gpunode.cluster.manifests import ManifestSettings
from gpunode.errors import GpunodeError
from gpunode.inventory_data import BY_NAME, KEYS, check_data, read
from gpunode.settings import NodeSettings

ALL_PY = Path(__file__).resolve().parents[1] / "src/gpunode/scaffold/inventories/group_data/all.py"


def documented() -> dict[str, str | None]:
    """Each key group_data/all.py documents, with its value's source text (None for the commented examples)."""
    keys: dict[str, str | None] = {}
    for line in ALL_PY.read_text().splitlines():
        if match := re.match(r"^([a-z_0-9]+) = (.+?)\s*(?:#.*)?$", line):
            keys[match[1]] = match[2]
        elif match := re.match(r"^# ([a-z_0-9]+) = ", line):
            keys[match[1]] = None
    return keys


def test_group_data_all_documents_every_key_at_its_default() -> None:
    keys = documented()
    assert set(keys) == set(BY_NAME), set(keys) ^ set(BY_NAME)
    for name, source in keys.items():
        if source is not None:
            assert ast.literal_eval(source) == BY_NAME[name].default, name


def test_every_typed_setting_is_a_schema_key_with_its_default() -> None:
    names = {"image": "plugin_image", "namespace": "plugin_namespace", "mig_strategy": "plugin_mig_strategy",
             "device_list_strategy": "plugin_device_list_strategy", "model_key": "label_model_key",
             "model_prefix": "label_model_prefix", "pull_secret": "plugin_pull_secret",
             "pull_auth": "plugin_registry_password",  # pull_auth: made from the registry user and password
             "allocation": "gpu_allocation"}
    derived = {"dra_driver"}  # set by the deploy from every host's gpu_allocation, not a key of one host
    for cls in (NodeSettings, ClusterSettings, ManifestSettings, LabelSettings):
        for field in fields(cls):
            if field.name in derived:
                continue
            key = names.get(field.name, field.name)
            assert key in BY_NAME, (cls.__name__, field.name)
            assert field.default == BY_NAME[key].default, (cls.__name__, field.name)


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("cluster_steps", "nope", "cluster_steps = 'nope' is not accepted: expected true or false"),
    ("rollout_timeout", "abc", "rollout_timeout = 'abc' is not accepted: expected a whole number"),
    ("container_runtime", "podman", "expected one of auto, containerd, docker"),
    ("kube_timeout", "0", "kube_timeout = '0' is not accepted: expected at least 1"),
    ("plugin_namespace", "GPU System", "expected a Kubernetes namespace name"),
])
def test_a_bad_value_names_the_key_the_value_and_what_is_allowed(key: str, value: str, expected: str) -> None:
    with pytest.raises(GpunodeError, match=re.escape(expected)):
        read({key: value}, key)


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("cluster_steps", "no", False), ("cluster_steps", "True", True), ("rollout_timeout", "45", 45),
    ("kube_timeout", "2.5", 2.5), ("toolkit_hold", None, True), ("max_unavailable", "", 0),
])
def test_a_good_value_is_read_as_its_type(key: str, value: object, expected: object) -> None:
    assert read({key: value}, key) == expected


def test_typos_get_a_did_you_mean_and_each_problem_is_reported_once_for_all_hosts() -> None:
    hosts = {name: {"toolkit_verison": "1", "containter_runtime": "docker", "ssh_usr": "ubuntu",
                    "sim_profile": "a100", "my_team_owner": "ml-infra", "_sudo": True, "ssh_user": "ubuntu"}
             for name in ("gpu-1", "gpu-2", "gpu-3")}
    hosts["gpu-2"]["rollout_timeout"] = "abc"
    found = {p.key: p for p in check_data(hosts)}
    assert set(found) == {"toolkit_verison", "containter_runtime", "ssh_usr", "rollout_timeout"}, found
    assert found["toolkit_verison"].fix == "did you mean 'toolkit_version'?"
    assert found["containter_runtime"].fix == "did you mean 'container_runtime'?"
    assert found["ssh_usr"].fix == "did you mean 'ssh_user'?"  # pyinfra's own keys count as known
    assert found["toolkit_verison"].hosts == ()  # all hosts: once, not per host
    assert found["toolkit_verison"].line().startswith("inventory data key 'toolkit_verison' is not one gpunode or "
                                                      "pyinfra reads (every host); did you mean")
    assert found["rollout_timeout"].hosts == ("gpu-2",)


def test_clean_data_has_no_problem() -> None:
    assert check_data({"h": {key.name: key.default for key in KEYS if key.default is not None}}) == []
