"""The device plugin's own configuration as inventory data, and the resources a node then offers.

``plugin_config`` in the inventory holds NVIDIA's device-plugin config file
(``version: v1``, ``flags``, ``sharing.timeSlicing``), as a mapping or as YAML
text. gpunode renders it into a ConfigMap that the DaemonSet mounts and passes
with ``--config-file``, so a time-slicing or rename setting is carried by every
deploy instead of being overwritten by it. The same data tells verify and
doctor what each GPU node must offer: ``nvidia.com/gpu`` times the replicas,
under the renamed resource where there is one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import yaml

from gpunode.cluster.plugin_config_keys import FILE_KEYS, NOT_ACTED_ON
from gpunode.errors import GpunodeError

GPU_RESOURCE = "nvidia.com/gpu"
CONFIG_MAP = "gpunode-device-plugin-config"
MOUNT_DIR = "/etc/gpunode-device-plugin"
CONFIG_FILE = f"{MOUNT_DIR}/config.yaml"
DIGEST_ANNOTATION = "gpunode.io/plugin-config"  # on the ConfigMap and the pod template: the digest gpunode applied
# the keys NVIDIA's v1 config file has where gpunode's plugin reads them: the plugin's own table, carried verbatim
KEYS = FILE_KEYS
# inventory keys that are flags of the plugin: the flag wins over the file, so the file must not disagree
FLAG_KEYS = {"migStrategy": ("plugin_mig_strategy", "mig_strategy"),
             "plugin.deviceListStrategy": ("plugin_device_list_strategy", "device_list_strategy")}
FIX = "write plugin_config in NVIDIA's device-plugin config format (version: v1), as a mapping or YAML text"


@dataclass(frozen=True)
class SharingRule:
    """One ``sharing.timeSlicing.resources`` entry: a resource shared ``replicas`` ways, maybe renamed."""

    name: str
    replicas: int
    rename: str | None = None


@dataclass(frozen=True)
class PluginConfig:
    """The validated config document and what it changes about the resources a node offers."""

    document: dict
    shared: tuple[SharingRule, ...] = ()
    rename_by_default: bool = False

    def text(self) -> str:
        return yaml.safe_dump(self.document, sort_keys=True)

    def digest(self) -> str:
        """Changes whenever the document does: the pod template carries it, so a new config rolls the pods."""
        return config_digest(self.document)


def config_digest(document: object) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]


def text_digest(text: str) -> str | None:
    """The digest of a config file's text as a ConfigMap holds it; None when it does not parse."""
    try:
        return config_digest(yaml.safe_load(text))
    except yaml.YAMLError:
        return None


@dataclass(frozen=True)
class Offer:
    """What a GPU node must offer the scheduler: the resource name and count (None: not computable) and why."""

    resource: str
    count: int | None
    basis: str
    gpus: int = 0  # the GPUs the driver sees

    @property
    def plain(self) -> bool:
        """One nvidia.com/gpu per GPU (no sharing, no rename, no MIG)."""
        return self.resource == GPU_RESOURCE and self.count == self.gpus


def _check_keys(value: object, section: str) -> None:
    where = section.replace("[]", "[n]") or "the top level"
    if not isinstance(value, dict):
        raise GpunodeError(f"plugin_config: {where} must be a mapping (got {type(value).__name__})", FIX)
    unknown = sorted(set(value) - KEYS[section]) if section in KEYS else []
    if unknown:
        raise GpunodeError(f"plugin_config: unknown key(s) {', '.join(unknown)} in {where}",
                           f"the keys there are {', '.join(sorted(KEYS[section]))} (NVIDIA's v1 format)")


def _dig(document: dict, path: str) -> object:
    node: object = document
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def parse_plugin_config(value: object, settings_flags: dict[str, str] | None = None) -> PluginConfig | None:
    """The inventory's ``plugin_config`` validated; None when it is not set.

    ``settings_flags`` are the inventory's own flag values (mig_strategy, device_list_strategy): the plugin's
    flags beat its file, so a file value that disagrees would be ignored silently; it is refused instead.
    """
    if value in (None, "", {}):
        return None
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError as error:
            raise GpunodeError(f"plugin_config is not valid YAML: {error}", FIX) from error
    _check_keys(value, "")
    document = json.loads(json.dumps(value))  # plain data, as the ConfigMap will carry it
    if document.get("version") != "v1":
        raise GpunodeError(f"plugin_config: version must be 'v1' (got {document.get('version')!r})", FIX)
    for file_key, (inventory_key, field) in FLAG_KEYS.items():
        given = _dig(document, f"flags.{file_key}")
        wanted = (settings_flags or {}).get(field)
        said = ",".join(map(str, given)) if isinstance(given, list) else given
        if given is not None and wanted is not None and said != wanted:
            raise GpunodeError(f"plugin_config sets flags.{file_key} = {given!r}, but {inventory_key} is {wanted!r} "
                               "and gpunode passes it as a flag, which wins over the file",
                               f"set {inventory_key} in the inventory and drop flags.{file_key} from plugin_config")
    sharing = document.get("sharing")
    if sharing is not None:
        _check_keys(sharing, "sharing")
    for key, (accepted, _env, why) in NOT_ACTED_ON.items():  # never accepted and dropped: refused, with why
        given = _dig(document, key)
        if given is not None and given not in accepted:
            raise GpunodeError(f"plugin_config: {key} = {json.dumps(given)} is refused by gpunode's device plugin",
                               f"{why}; or remove {key} from plugin_config")
    slicing = _dig(document, "sharing.timeSlicing")
    if slicing is None:
        return PluginConfig(document)
    _check_keys(slicing, "sharing.timeSlicing")
    rules = []
    for position, item in enumerate(slicing.get("resources") or []):
        _check_keys(item, "sharing.timeSlicing.resources[]")
        where = f"plugin_config: sharing.timeSlicing.resources[{position}]"
        replicas = item.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 2:
            raise GpunodeError(f"{where}.replicas must be a whole number >= 2 (got {replicas!r})", FIX)
        name = str(item.get("name", ""))
        if not name.startswith("nvidia.com/"):
            raise GpunodeError(f"{where}.name {name!r} must be an nvidia.com/ resource", "name: nvidia.com/gpu")
        if item.get("devices") not in (None, "all"):
            raise GpunodeError(f"{where}.devices: only 'all' is supported by gpunode's device plugin",
                               "drop devices (all GPUs are shared)")
        rename = item.get("rename")
        rules.append(SharingRule(name, replicas, str(rename) if rename else None))
    return PluginConfig(document, tuple(rules), bool(slicing.get("renameByDefault", False)))


def gpu_sharing(config: PluginConfig | None) -> SharingRule | None:
    """The time-slicing rule for nvidia.com/gpu in ``config``, if any."""
    return next((r for r in (config.shared if config else ()) if r.name == GPU_RESOURCE), None)


def expected_offer(gpus: list[dict], mig_strategy: str, config: PluginConfig | None) -> Offer:
    """What a node with ``gpus`` (the driver facts' rows) offers under the plugin's effective configuration."""
    count = len(gpus)
    migged = [g for g in gpus if str(g.get("mig_mode") or "").lower() == "enabled"]
    if mig_strategy != "none" and migged:
        listed = all("mig_devices" in g for g in migged)
        if mig_strategy == "single" and listed and len(migged) == count:
            devices = sum(len(g["mig_devices"]) for g in migged)
            return Offer(GPU_RESOURCE, devices, f"nvidia-smi -L: {devices} MIG device(s) on {count} GPU(s) in MIG "
                         "mode, plugin_mig_strategy single", count)
        return Offer(GPU_RESOURCE if mig_strategy == "single" else "nvidia.com/mig-*", None,
                     f"MIG is enabled on {len(migged)} of {count} GPU(s) with plugin_mig_strategy {mig_strategy}: the "
                     "count is that of MIG devices per profile, which one resource count does not hold" if listed
                     else f"MIG is enabled on {len(migged)} of {count} GPU(s) with plugin_mig_strategy {mig_strategy}:"
                     " the count is that of MIG devices, which the driver facts do not list", count)
    rule = gpu_sharing(config)
    if rule is None:
        return Offer(GPU_RESOURCE, count, f"driver (nvidia-smi): {count} GPU(s), no time-slicing in plugin_config",
                     count)
    renamed = rule.rename or (f"{GPU_RESOURCE}.shared" if config and config.rename_by_default else GPU_RESOURCE)
    return Offer(renamed, count * rule.replicas,
                 f"driver (nvidia-smi): {count} GPU(s) x {rule.replicas} replicas (plugin_config "
                 f"sharing.timeSlicing{', renamed ' + renamed if renamed != GPU_RESOURCE else ''})", count)
