"""Plugin configuration: NVIDIA's names and precedence (flags > environment > file > defaults)."""

from __future__ import annotations

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
