"""Plugin configuration: NVIDIA's names and precedence (flags > environment > file > defaults)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpunode_plugin.config import Config, ConfigError, load
from gpunode_plugin.health import health_policy


def test_defaults_match_nvidias_plugin() -> None:
    config = load([], {})
    assert (config.mig_strategy, config.fail_on_init_error, config.device_list_strategy, config.device_id_strategy,
            config.kubelet_socket) == ("none", True, ("envvar",), "uuid",
                                       "/var/lib/kubelet/device-plugins/kubelet.sock")


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text("version: v1\nflags:\n  migStrategy: single\n  failOnInitError: false\n"
                           "  plugin:\n    deviceListStrategy: [cdi-cri, envvar]\n    passDeviceSpecs: true\n")
    from_file = load(["--config-file", str(config_file)], {})
    assert (from_file.mig_strategy, from_file.fail_on_init_error, from_file.device_list_strategy,
            from_file.pass_device_specs) == ("single", False, ("cdi-cri", "envvar"), True)
    from_env = load([], {"CONFIG_FILE": str(config_file), "MIG_STRATEGY": "mixed"})
    assert from_env.mig_strategy == "mixed" and from_env.fail_on_init_error is False
    from_flag = load(["--mig-strategy", "none"], {"CONFIG_FILE": str(config_file), "MIG_STRATEGY": "mixed"})
    assert from_flag.mig_strategy == "none"


def test_the_socket_prefix_names_the_socket_as_nvidia_s_plugin_would() -> None:
    from gpunode_plugin.resources import socket_name

    assert socket_name("nvidia.com/gpu", load([], {"GPUNODE_PLUGIN_SOCKET_PREFIX": "nvidia"}).socket_prefix) \
        == "nvidia-gpu.sock"
    assert socket_name("nvidia.com/gpu", load([], {}).socket_prefix) == "gpunode-gpu.sock"


def test_json_config_and_list_strategy_from_environment(tmp_path: Path) -> None:
    config_file = tmp_path / "config.json"
    config_file.write_text('{"version": "v1", "flags": {"plugin": {"deviceIDStrategy": "index"}}}')
    config = load(["--config-file", str(config_file)], {"DEVICE_LIST_STRATEGY": "volume-mounts,cdi-annotations"})
    assert config.device_id_strategy == "index"
    assert config.device_list_strategy == ("volume-mounts", "cdi-annotations")


@pytest.mark.parametrize(("args", "env", "message"), [
    ([], {"FAIL_ON_INIT_ERROR": "maybe"}, "FAIL_ON_INIT_ERROR: 'maybe' is not true or false"),
    (["--device-id-strategy", "serial"], {}, "deviceIDStrategy: 'serial' is not one of uuid, index"),
    (["--config-file", "/nonexistent.yaml"], {}, "config file /nonexistent.yaml does not exist"),
    (["--backend", "rocm"], {}, "backend: 'rocm' is not one of nvml, sim"),
    (["--socket-prefix", "../x"], {}, "socket-prefix: '../x' must be a file name part"),
])
def test_bad_values_name_the_key(args: list[str], env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(args, env)


@pytest.mark.parametrize(("env", "enabled", "ignored"), [
    ({}, True, {13, 31, 43, 45, 68, 109}),
    ({"DP_DISABLE_HEALTHCHECKS": "all"}, False, set()),
    ({"DP_DISABLE_HEALTHCHECKS": "xids"}, False, set()),
    ({"DP_DISABLE_HEALTHCHECKS": "48,79"}, True, {13, 31, 43, 45, 48, 68, 79, 109}),
    ({"DP_ENABLE_HEALTHCHECKS": "13,31"}, True, {43, 45, 68, 109}),
    ({"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "79"}, True, {13, 31, 43, 45, 68, 109}),
    ({"DP_DISABLE_HEALTHCHECKS": "x,y"}, True, {13, 31, 43, 45, 68, 109}),
])
def test_health_switches(env: dict, enabled: bool, ignored: set) -> None:
    assert health_policy(env) == (enabled, ignored)


def test_device_root_defaults_to_driver_root() -> None:
    assert Config(driver_root="/run/nvidia/driver").device_root == "/run/nvidia/driver"
    assert Config(driver_root="/run/nvidia/driver", dev_root="/").device_root == "/"


# -- every key of NVIDIA's v1 format works as there, or is refused ----------------------------------------------

def _file_keys() -> set[str]:
    """Every dotted key of NVIDIA's v1 format this plugin knows: sections' own keys, joined to their section."""
    from gpunode_plugin.config_keys import FILE_KEYS

    return {f"{section}.{key}".lstrip(".") for section, keys in FILE_KEYS.items() for key in keys}


def test_no_key_of_nvidias_format_is_accepted_and_dropped() -> None:
    from gpunode_plugin.config import OPTIONS
    from gpunode_plugin.config_keys import FILE_KEYS, NOT_ACTED_ON, NOT_THE_PLUGINS

    read = {file_key for _flag, _env, file_key, _name, _kind in OPTIONS if file_key}
    sections = {section.removesuffix("[]") for section in FILE_KEYS if section}  # read by their own code
    time_slicing = {f"sharing.timeSlicing.{key}" for key in FILE_KEYS["sharing.timeSlicing"]}
    handled = read | sections | time_slicing | set(NOT_ACTED_ON) | set(NOT_THE_PLUGINS) | {"version"}
    left = sorted(key for key in _file_keys() if not key.startswith("sharing.timeSlicing.resources[]")
                  and key not in handled)
    assert left == [], f"keys read by nobody: {left}"
    # and the reference's list of NVIDIA's file keys is all known (../shared/reference/nvidia-device-plugin-behaviour)
    nvidia = {"flags.migStrategy", "flags.failOnInitError", "flags.nvidiaDriverRoot", "flags.nvidiaDevRoot",
              "flags.plugin.passDeviceSpecs", "flags.plugin.deviceListStrategy", "flags.plugin.deviceIDStrategy",
              "flags.plugin.cdiAnnotationPrefix", "flags.plugin.nvidiaCTKPath", "flags.plugin.containerDriverRoot",
              "flags.plugin.sharedDevicesAllocationPolicy", "flags.deviceDiscoveryStrategy", "flags.gdrcopyEnabled",
              "flags.gdsEnabled", "flags.mofedEnabled", "flags.mpsRoot", "flags.gfd", "sharing.timeSlicing",
              "sharing.mps", "resources", "imex"}
    assert nvidia <= _file_keys()


@pytest.mark.parametrize(("document", "says"), [
    ({"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}, "sharing.mps"),
    ({"resources": {"gpus": [{"pattern": "*A100*", "name": "a100"}]}}, "resources"),
    ({"imex": {"channelIDs": [0]}}, "imex"),
    ({"flags": {"gdsEnabled": True}}, "GPUDirect Storage"),
    ({"flags": {"mofedEnabled": True}}, "flags.mofedEnabled"),
    ({"flags": {"gdrcopyEnabled": True}}, "gdrcopy"),
    ({"flags": {"deviceDiscoveryStrategy": "tegra"}}, "NVML only"),
    ({"flags": {"plugin": {"nvidiaCTKPath": "/opt/nvidia-ctk"}}}, "writes no CDI spec"),
    ({"flags": {"plugin": {"sharedDevicesAllocationPolicy": "random"}}}, "not one of distributed, packed"),
])
def test_what_the_plugin_would_not_do_is_refused_with_the_key(tmp_path: Path, document: dict, says: str) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(json.dumps({"version": "v1", **document}))
    with pytest.raises(ConfigError, match=says):
        load(["--config-file", str(config_file)], {})


def test_the_values_at_which_it_acts_as_nvidias_plugin_are_accepted(tmp_path: Path) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(json.dumps({"version": "v1", "resources": {}, "flags": {
        "gdsEnabled": False, "mofedEnabled": False, "gdrcopyEnabled": False, "deviceDiscoveryStrategy": "auto",
        "mpsRoot": "/run/nvidia/mps", "gfd": {"oneshot": False},
        "plugin": {"nvidiaCTKPath": "/usr/bin/nvidia-ctk", "sharedDevicesAllocationPolicy": "packed"}}}))
    assert load(["--config-file", str(config_file)], {}).shared_allocation_policy == "packed"
    assert load([], {"GDS_ENABLED": "false", "MPS_ROOT": "/run/nvidia/mps"}).shared_allocation_policy == "distributed"


@pytest.mark.parametrize(("env", "says"), [
    ({"GDS_ENABLED": "true"}, "GDS_ENABLED='true' \\(flags.gdsEnabled\\) is refused"),
    ({"IMEX_CHANNEL_IDS": "0"}, "IMEX_CHANNEL_IDS"),
    ({"NVIDIA_CTK_PATH": "/opt/bin/nvidia-ctk"}, "NVIDIA_CTK_PATH"),
])
def test_nvidias_environment_for_what_it_would_not_do_is_refused(env: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load([], env)


def test_the_shared_devices_allocation_policies_pick_as_nvidias_do() -> None:
    from gpunode_plugin.allocation import preferred
    from gpunode_plugin.backend import Gpu
    from gpunode_plugin.resources import LogicalDevice, Resource

    gpus = [Gpu(i, f"GPU-{i}", "A100", 40960, i, f"0000:0{i}:00.0") for i in range(2)]
    devices = {f"GPU-{g.index}::{r}": LogicalDevice(f"GPU-{g.index}::{r}", g, None, r) for g in gpus for r in range(4)}
    resource = Resource("nvidia.com/gpu", devices, shared=True)
    # GPU-0 has one replica in use already (not offered), GPU-1 none
    available = [i for i in devices if i != "GPU-0::0"]
    distributed = preferred(resource, available, [], 2, "distributed")
    packed = preferred(resource, available, [], 2, "packed")
    assert {i.split("::")[0] for i in distributed} == {"GPU-1"} or len({i.split("::")[0] for i in distributed}) == 2
    assert distributed[0].startswith("GPU-1")  # the GPU with the most free replicas first
    assert [i.split("::")[0] for i in packed] == ["GPU-0", "GPU-0"]  # the fuller GPU filled first
