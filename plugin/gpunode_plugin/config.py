"""Configuration from flags, environment and a config file in NVIDIA's plugin format.

Precedence: command line > environment > config file > defaults, as NVIDIA's
plugin does, with the same flag names, environment variables and file keys
(``version: v1``, ``flags``, ``flags.plugin``, ``sharing.timeSlicing``), so a
user switching plugins keeps their config. Our own additions are marked.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields

import yaml

from gpunode_plugin.config_keys import FILE_KEYS, NOT_ACTED_ON

MIG_STRATEGIES = ("none", "single", "mixed")
LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
ID_STRATEGIES = ("uuid", "index")
BACKENDS = ("nvml", "sim")
SHARED_POLICIES = ("distributed", "packed")  # NVIDIA's v0.20 sharedDevicesAllocationPolicy; distributed is its default
DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"


class ConfigError(Exception):
    """A configuration value that cannot work; the message names the key."""


@dataclass(frozen=True)
class SharedResource:
    name: str
    replicas: int
    rename: str | None = None


@dataclass(frozen=True)
class Config:
    mig_strategy: str = "none"
    fail_on_init_error: bool = True
    driver_root: str = "/"
    dev_root: str | None = None
    pass_device_specs: bool = False
    device_list_strategy: tuple[str, ...] = ("envvar",)
    device_id_strategy: str = "uuid"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    kubelet_socket: str = DEFAULT_KUBELET_SOCKET
    config_file: str | None = None
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    shared: tuple[SharedResource, ...] = ()
    shared_allocation_policy: str = "distributed"
    # gpunode additions
    backend: str = "nvml"
    sim_state_file: str = "/etc/gpunode-sim/gpu.json"
    sim_events_file: str = "/run/gpunode-sim/health-events"
    http_address: str = ":8081"
    health_recovery_seconds: int = 0
    log_format: str = "json"
    socket_prefix: str = "gpunode"  # <prefix>-gpu.sock in the kubelet's folder (NVIDIA's plugin uses "nvidia")
    extra: dict = field(default_factory=dict)

    @property
    def device_root(self) -> str:
        return self.dev_root or self.driver_root


# (flag, env var, config-file path, Config field, kind)
OPTIONS = (
    ("--mig-strategy", "MIG_STRATEGY", "flags.migStrategy", "mig_strategy", "str"),
    ("--fail-on-init-error", "FAIL_ON_INIT_ERROR", "flags.failOnInitError", "fail_on_init_error", "bool"),
    ("--driver-root", "NVIDIA_DRIVER_ROOT", "flags.nvidiaDriverRoot", "driver_root", "str"),
    ("--dev-root", "NVIDIA_DEV_ROOT", "flags.nvidiaDevRoot", "dev_root", "str"),
    ("--pass-device-specs", "PASS_DEVICE_SPECS", "flags.plugin.passDeviceSpecs", "pass_device_specs", "bool"),
    ("--device-list-strategy", "DEVICE_LIST_STRATEGY", "flags.plugin.deviceListStrategy", "device_list_strategy",
     "list"),
    ("--device-id-strategy", "DEVICE_ID_STRATEGY", "flags.plugin.deviceIDStrategy", "device_id_strategy", "str"),
    ("--cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX", "flags.plugin.cdiAnnotationPrefix",
     "cdi_annotation_prefix", "str"),
    ("--shared-devices-allocation-policy", "SHARED_DEVICES_ALLOCATION_POLICY",
     "flags.plugin.sharedDevicesAllocationPolicy", "shared_allocation_policy", "str"),
    ("--kubelet-socket", "KUBELET_SOCKET", None, "kubelet_socket", "str"),
    ("--config-file", "CONFIG_FILE", None, "config_file", "str"),
    ("--backend", "GPUNODE_PLUGIN_BACKEND", "flags.plugin.gpunodeBackend", "backend", "str"),
    ("--sim-state-file", "GPUNODE_SIM_GPU_STATE", None, "sim_state_file", "str"),
    ("--sim-events-file", "GPUNODE_SIM_HEALTH_EVENTS", None, "sim_events_file", "str"),
    ("--http-address", "GPUNODE_PLUGIN_HTTP_ADDRESS", "flags.plugin.gpunodeHttpAddress", "http_address", "str"),
    ("--health-recovery-seconds", "GPUNODE_HEALTH_RECOVERY_SECONDS", "flags.plugin.gpunodeHealthRecoverySeconds",
     "health_recovery_seconds", "int"),
    ("--log-format", "GPUNODE_LOG_FORMAT", None, "log_format", "str"),
    ("--socket-prefix", "GPUNODE_PLUGIN_SOCKET_PREFIX", None, "socket_prefix", "str"),
)


def _convert(key: str, value: object, kind: str) -> object:
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise ConfigError(f"{key}: {value!r} is not true or false")
    if kind == "int":
        try:
            return int(value)  # type: ignore[arg-type]
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{key}: {value!r} is not a whole number") from error
    if kind == "list":
        items = value if isinstance(value, list) else str(value).split(",")
        return tuple(str(item).strip() for item in items if str(item).strip())
    return str(value)


def _check_keys(where: str, data: object, path: str) -> dict:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {path or 'the file'} must be a mapping")
    unknown = sorted(set(data) - FILE_KEYS[path])
    if unknown:
        full = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"{where}: unknown key {full.replace('[]', '')!r} "
                          f"(known here: {', '.join(sorted(FILE_KEYS[path]))})")
    return data


def _dig(data: dict, dotted: str) -> object:
    node: object = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def read_file(path: str) -> tuple[dict[str, object], dict]:
    """Values from the config file by Config field, plus the time-slicing section."""
    try:
        with open(path) as handle:
            data = yaml.safe_load(handle) or {}
    except FileNotFoundError as error:
        raise ConfigError(f"config file {path} does not exist") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML/JSON: {error}") from error
    _check_keys(path, data, "")
    if data.get("version") != "v1":
        raise ConfigError(f"{path}: version must be 'v1' (got {data.get('version')!r})")
    for section in ("flags", "flags.plugin", "sharing", "sharing.timeSlicing"):
        value = _dig(data, section)
        if value is not None:
            _check_keys(path, value, section)
    for key, (accepted, _env, why) in NOT_ACTED_ON.items():
        value = _dig(data, key)
        if value is not None and value not in accepted:
            raise ConfigError(f"{path}: {key} = {value!r} is refused: {why}")
    values = {}
    for _flag, _env, file_key, name, kind in OPTIONS:
        if file_key:
            value = _dig(data, file_key)
            if value is not None:
                values[name] = _convert(file_key, value, kind)
    slicing = _dig(data, "sharing.timeSlicing") or {}
    return values, slicing  # type: ignore[return-value]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpunode-device-plugin",
        description="Kubernetes device plugin for NVIDIA GPUs (kubelet API v1beta1), by gpunode.",
        epilog="""examples:
  gpunode-device-plugin                                   # NVML, nvidia.com/gpu, envvar strategy
  gpunode-device-plugin --mig-strategy mixed              # nvidia.com/mig-<g>g.<gb>gb resources too
  gpunode-device-plugin --config-file /etc/nvidia-device-plugin/config.yaml   # NVIDIA's v1 format
  gpunode-device-plugin --backend sim --kubelet-socket /tmp/dp/kubelet.sock --http-address 127.0.0.1:8081

Flags override environment variables (same names as NVIDIA's plugin: MIG_STRATEGY, FAIL_ON_INIT_ERROR,
DEVICE_LIST_STRATEGY, ...), which override the config file. DP_DISABLE_HEALTHCHECKS and
DP_ENABLE_HEALTHCHECKS tune Xid health checks as in NVIDIA's plugin.""",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, env, file_key, name, kind in OPTIONS:
        help_text = f"env {env}" + (f", file {file_key}" if file_key else "")
        p.add_argument(flag, dest=name, default=None, help=help_text, metavar=kind.upper())
    p.add_argument("--version", action="store_true", help="print the version and exit")
    return p


def load(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> Config:
    """The effective configuration; raises ConfigError naming the key that is wrong."""
    args = parser().parse_args(argv)
    env = os.environ if environ is None else environ
    kinds = {name: kind for _f, _e, _k, name, kind in OPTIONS}
    from_env = {name: _convert(var, env[var], kind) for _f, var, _k, name, kind in OPTIONS
                if env.get(var) not in (None, "")}
    from_args = {name: _convert(flag, getattr(args, name), kinds[name])
                 for flag, _e, _k, name, _kind in OPTIONS if getattr(args, name) is not None}
    refuse_unacted_env(env)
    config_file = from_args.get("config_file") or from_env.get("config_file")
    file_values: dict[str, object] = {}
    slicing: dict = {}
    if config_file:
        file_values, slicing = read_file(str(config_file))
    values: dict[str, object] = {**file_values, **from_env, **from_args}
    values.update(_sharing(str(config_file), slicing))
    known = {f.name for f in fields(Config)}
    config = Config(**{k: v for k, v in values.items() if k in known})
    validate(config)
    return config


def _env_accepted(value: str, accepted: tuple) -> bool:
    """An environment value asks for what NVIDIA's plugin does at ``accepted`` (off for a switch or a section)."""
    said = value.strip()
    if said.lower() in ("false", "0", "no") and any(a is False for a in accepted):
        return True  # a switch left off
    if said.lower() in ("false", "no") and {} in accepted:
        return True  # a section's switch left off (IMEX_REQUIRED=false); a channel id such as 0 is not
    return any(isinstance(a, str) and a == said for a in accepted)


def refuse_unacted_env(env: dict[str, str] | os._Environ[str]) -> None:
    """NVIDIA's environment variables for what this plugin does not do, refused where they ask for it."""
    for key, (accepted, names, why) in NOT_ACTED_ON.items():
        for name in names:
            value = env.get(name)
            if value not in (None, "") and not _env_accepted(value, accepted):
                raise ConfigError(f"{name}={value!r} ({key}) is refused: {why}")


def _sharing(path: str, slicing: dict) -> dict[str, object]:
    if not slicing:
        return {}
    resources = []
    for position, item in enumerate(slicing.get("resources") or []):
        where = f"sharing.timeSlicing.resources[{position}]"
        _check_keys(path, item, "sharing.timeSlicing.resources[]")
        replicas = item.get("replicas")
        if not isinstance(replicas, int) or replicas < 2:
            raise ConfigError(f"{path}: {where}.replicas must be a whole number >= 2 (got {replicas!r})")
        if "devices" in item and item["devices"] not in ("all", None):
            raise ConfigError(f"{path}: {where}.devices: only 'all' is supported by gpunode's plugin")
        resources.append(SharedResource(str(item.get("name", "")), replicas, item.get("rename")))
    return {"shared": tuple(resources),
            "rename_by_default": bool(slicing.get("renameByDefault", False)),
            "fail_requests_greater_than_one": bool(slicing.get("failRequestsGreaterThanOne", False))}


def validate(config: Config) -> None:
    if config.mig_strategy not in MIG_STRATEGIES:
        raise ConfigError(f"migStrategy: {config.mig_strategy!r} is not one of {', '.join(MIG_STRATEGIES)}")
    bad = [s for s in config.device_list_strategy if s not in LIST_STRATEGIES]
    if bad or not config.device_list_strategy:
        raise ConfigError(f"deviceListStrategy: {bad[0] if bad else 'empty'!r} is not one of "
                          f"{', '.join(LIST_STRATEGIES)}")
    if config.device_id_strategy not in ID_STRATEGIES:
        raise ConfigError(f"deviceIDStrategy: {config.device_id_strategy!r} is not one of "
                          f"{', '.join(ID_STRATEGIES)}")
    if config.shared_allocation_policy not in SHARED_POLICIES:
        raise ConfigError(f"sharedDevicesAllocationPolicy: {config.shared_allocation_policy!r} is not one of "
                          f"{', '.join(SHARED_POLICIES)}")
    if config.backend not in BACKENDS:
        raise ConfigError(f"backend: {config.backend!r} is not one of {', '.join(BACKENDS)}")
    for shared in config.shared:
        if not shared.name.startswith("nvidia.com/"):
            raise ConfigError(f"sharing.timeSlicing.resources: name {shared.name!r} must be an nvidia.com/ resource")
    if config.health_recovery_seconds < 0:
        raise ConfigError("healthRecoverySeconds must be 0 (never recover, as NVIDIA's plugin) or more")
    if not config.socket_prefix or not all(c.isalnum() or c in "-_." for c in config.socket_prefix):
        raise ConfigError(f"socket-prefix: {config.socket_prefix!r} must be a file name part (letters, digits, "
                          "'-', '_', '.')")
