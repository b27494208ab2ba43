"""The Kubernetes manifests gpunode applies, rendered from templates/ with inventory data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2
import yaml

from gpunode.errors import GpunodeError

TEMPLATES = Path(__file__).resolve().parents[3] / "templates"
MIG_STRATEGIES = ("none", "single", "mixed")
LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")


@dataclass(frozen=True)
class ManifestSettings:
    """Inventory data for the cluster objects (keys: plugin_image, plugin_namespace, ...)."""

    image: str = "gpunode-device-plugin:0.1.0"
    namespace: str = "gpunode-system"
    mig_strategy: str = "none"
    device_list_strategy: str = "envvar"
    nvidia_runtime_default: bool = False

    @classmethod
    def from_data(cls, data: dict) -> ManifestSettings:
        settings = cls(
            image=str(data.get("plugin_image", cls.image)),
            namespace=str(data.get("plugin_namespace", cls.namespace)),
            mig_strategy=str(data.get("plugin_mig_strategy", cls.mig_strategy)),
            device_list_strategy=str(data.get("plugin_device_list_strategy", cls.device_list_strategy)),
            nvidia_runtime_default=str(data.get("nvidia_runtime_default", False)).lower() in ("true", "1", "yes"),
        )
        if settings.mig_strategy not in MIG_STRATEGIES:
            raise GpunodeError(f"plugin_mig_strategy {settings.mig_strategy!r} is not one of "
                               f"{', '.join(MIG_STRATEGIES)}")
        if settings.device_list_strategy not in LIST_STRATEGIES:
            raise GpunodeError(f"plugin_device_list_strategy {settings.device_list_strategy!r} is not one of "
                               f"{', '.join(LIST_STRATEGIES)}")
        return settings


def render(settings: ManifestSettings, templates: Path = TEMPLATES) -> str:
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)),
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return environment.get_template("device-plugin.yaml.j2").render(**vars(settings))


def documents(text: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(text) if doc]
