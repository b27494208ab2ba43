"""The Kubernetes manifests gpunode applies, rendered from Jinja2 templates with inventory data.

The templates ship inside the package (``gpunode/templates``; ``templates/`` at
the top of the repository points there). A user's own copy in the folder the
inventory key ``templates_dir`` names overrides them, file by file.
"""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import jinja2
import yaml

from gpunode.cluster.plugin_config import CONFIG_FILE, CONFIG_MAP, MOUNT_DIR, PluginConfig, parse_plugin_config
from gpunode.errors import GpunodeError
from gpunode.inventory_data import BY_NAME, read

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
PULL_SECRET = "gpunode-registry"  # the pull Secret the deploy writes from plugin_registry_username/_password
RUNTIME_CLASS = "nvidia"  # the RuntimeClass the templates render (and its handler, the runtime gpunode configures)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where PyYAML has it: same documents


@dataclass(frozen=True)
class ManifestSettings:
    """Inventory data for the cluster objects (keys: plugin_image, plugin_namespace, ...)."""

    image: str = BY_NAME["plugin_image"].default
    namespace: str = BY_NAME["plugin_namespace"].default
    mig_strategy: str = BY_NAME["plugin_mig_strategy"].default
    device_list_strategy: str = BY_NAME["plugin_device_list_strategy"].default
    nvidia_runtime_default: bool = BY_NAME["nvidia_runtime_default"].default
    templates_dir: str = BY_NAME["templates_dir"].default
    plugin_config: PluginConfig | None = None  # the plugin's own config file (time-slicing, renames), if any
    checker_image: str = BY_NAME["checker_image"].default  # '' : no node checker DaemonSet
    checker_interval: int = BY_NAME["checker_interval"].default
    checker_heartbeat: int = BY_NAME["checker_heartbeat"].default
    checker_api_server: str = BY_NAME["checker_api_server"].default
    dra_driver: bool = False  # the DRA driver's objects too: some host of the run has gpu_allocation = dra
    pull_secret: str = ""  # the Secret the DaemonSet's pods pull the image with ('': none)
    pull_auth: str = field(default="", repr=False)  # .dockerconfigjson (base64) of the Secret the deploy writes

    @classmethod
    def from_data(cls, data: dict) -> ManifestSettings:
        """Settings from host data, each value checked by its schema (``gpunode.inventory_data``)."""
        settings = cls(
            image=read(data, "plugin_image"),
            namespace=read(data, "plugin_namespace"),
            mig_strategy=read(data, "plugin_mig_strategy"),
            device_list_strategy=read(data, "plugin_device_list_strategy"),
            nvidia_runtime_default=read(data, "nvidia_runtime_default"),
            templates_dir=read(data, "templates_dir"),
            checker_image=read(data, "checker_image"),
            checker_interval=read(data, "checker_interval"),
            checker_heartbeat=read(data, "checker_heartbeat"),
            checker_api_server=read(data, "checker_api_server"),
        )
        settings = replace(settings, **pull_settings(data, settings.image))
        flags = {"mig_strategy": settings.mig_strategy, "device_list_strategy": settings.device_list_strategy}
        config = parse_plugin_config(data.get("plugin_config"), flags)
        return replace(settings, plugin_config=config) if config else settings


def registry_host(image: str) -> str | None:
    """The registry host[:port] an image reference names, or None for Docker Hub's short names."""
    first, slash, _ = image.partition("/")
    return first if slash and ("." in first or ":" in first or first == "localhost") else None


def pull_settings(data: dict, image: str) -> dict[str, str]:
    """``pull_secret`` and ``pull_auth`` from the inventory's registry keys, each combination checked."""
    username, password = read(data, "plugin_registry_username"), read(data, "plugin_registry_password")
    own = read(data, "plugin_pull_secret")
    if own and (username or password):
        raise GpunodeError("plugin_pull_secret and plugin_registry_username/_password are both set",
                           "either name a pull Secret you keep (plugin_pull_secret) or give the credentials the "
                           f"deploy writes into its own Secret {PULL_SECRET}, not both")
    if own:
        return {"pull_secret": own}
    if not username and not password:
        return {}
    if not username or not password:
        missing = "plugin_registry_password" if username else "plugin_registry_username"
        raise GpunodeError(f"{missing} is not set but its partner is", f"set {missing} too, or neither")
    host = registry_host(image)
    if host is None:
        raise GpunodeError(f"plugin_registry_username is set but plugin_image {image!r} names no registry",
                           "write plugin_image as REGISTRY[:PORT]/REPOSITORY:TAG (or @sha256:...)")
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    config = json.dumps({"auths": {host: {"auth": token}}}, sort_keys=True)
    return {"pull_secret": PULL_SECRET, "pull_auth": base64.b64encode(config.encode()).decode()}


def template_dirs(settings: ManifestSettings, templates: Path = TEMPLATES) -> list[str]:
    """Where templates are looked up, first match wins: the user's ``templates_dir``, then gpunode's own."""
    dirs = []
    if settings.templates_dir:
        own = Path(settings.templates_dir).expanduser()
        if not own.is_dir():
            raise GpunodeError(f"templates_dir {own} is not a folder",
                               f"point templates_dir at a folder with your device-plugin.yaml.j2 (copy gpunode's own "
                               f"from {templates} to start from), or remove the key to use gpunode's templates")
        dirs.append(str(own))
    dirs.append(str(templates))
    return dirs


CHECKER = "gpunode-node-checker"  # the node checker's DaemonSet, ServiceAccount, field manager and Events' source
NODE_SETTINGS = "gpunode-node-settings"  # the node checker's settings: one NODE.yaml of inventory data per node


def node_settings_document(namespace: str, per_node: dict[str, dict]) -> dict:
    """The ConfigMap the node checker's pods mount: each node's inventory data (what its diagnosis expects)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": NODE_SETTINGS, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": CHECKER,
                                    "app.kubernetes.io/managed-by": "gpunode"}},
            "data": {f"{node}.yaml": yaml.safe_dump(values, sort_keys=True)
                     for node, values in sorted(per_node.items())}}


PLUGIN_TEMPLATE = "device-plugin.yaml.j2"
CHECKER_TEMPLATE = "node-checker.yaml.j2"  # the node checker's ServiceAccount, rights and own-node policy
DRA_TEMPLATE = "dra-driver.yaml.j2"  # the DRA driver's rights


def render(settings: ManifestSettings, templates: Path = TEMPLATES, name: str = PLUGIN_TEMPLATE) -> str:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(template_dirs(settings, templates)),
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    try:
        template = environment.get_template(name)
    except jinja2.TemplateNotFound as error:
        raise GpunodeError(f"template {error.name} not found in {', '.join(template_dirs(settings, templates))}",
                           "reinstall gpunode (its templates ship in the package), or put the file in "
                           "templates_dir") from error
    try:
        return template.render(**vars(settings), config_map=CONFIG_MAP, config_file=CONFIG_FILE, mount_dir=MOUNT_DIR)
    except jinja2.TemplateError as error:
        raise GpunodeError(f"template {template.filename} cannot be rendered: {error}",
                           "fix the template (Jinja2), or remove templates_dir to use gpunode's own") from error


def documents(text: str) -> list[dict]:
    return [doc for doc in yaml.load_all(text, Loader=SAFE_LOADER) if doc]


_rendered: dict[tuple[str, str], list[dict]] = {}


def manifest_documents(settings: ManifestSettings, templates: Path = TEMPLATES) -> list[dict]:
    """The rendered objects for these settings, rendered and parsed once per process (a copy each call).

    pyinfra runs the device-plugin step once per host; rendering and parsing the same manifests for each of 100
    hosts was a fifth of a no-op's controller time (cProfile: yaml 17 %, jinja2 5 %).
    """
    key = (repr(settings), settings.pull_auth, str(templates))
    if key not in _rendered:
        _rendered[key] = documents(render(settings, templates))
    return copy.deepcopy(_rendered[key])
