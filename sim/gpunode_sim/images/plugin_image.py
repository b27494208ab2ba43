"""The device plugin's image as the simulated fleet runs it: gpunode's own builder (``gpunode image build``) on
this checkout's ``plugin/``, its dependencies pinned to the versions installed here (the ones the tests ran),
cached by its inputs so ``gpunode sim build`` rebuilds only when ``plugin/`` or the pins change.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from gpunode.errors import GpunodeError
from gpunode.image import build as builder
from gpunode.image.build import (  # noqa: F401 - the image's facts, read by the tests through this module
    ARCHIVE,
    BASE_IMAGE,
    ENTRYPOINT,
    ENV,
    PYTHON_PACKAGES,
    SITE_PACKAGES,
    SLIM_REMOVE,
    SUITE,
    USER,
    describe,
    image_config,
    plugin_version,
)
from gpunode_sim.images import prune_builds

DEPENDENCIES = ("grpcio", "protobuf", "nvidia-ml-py", "pyyaml")  # plugin/pyproject.toml's, pinned when built
Say = Callable[[str], None]


def plugin_dir() -> Path:
    """plugin/ of this checkout (beside sim/)."""
    return Path(__file__).resolve().parents[3] / "plugin"


def image_name(source: Path | None = None) -> str:
    """The reference the DaemonSet names by default, as CRI spells it in full."""
    return builder.image_name(plugin_version(source or plugin_dir()))


def pinned_dependencies() -> list[str]:
    """The plugin's dependencies at the versions installed here, so the image runs what the tests ran."""
    pins = []
    for name in DEPENDENCIES:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError as error:
            raise GpunodeError(f"{name} is not installed in gpunode's environment (the plugin image pins it)",
                               "pip install -e '.[sim]' (scripts/setup-host does)") from error
    return pins


def installed_versions() -> list[str]:
    """``name==version`` of every distribution in gpunode's environment but gpunode's own."""
    pins = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name and name not in ("gpunode", "gpunode-device-plugin"):
            pins[name] = f"{name}=={dist.version}"
    return sorted(pins.values())


@functools.cache  # one per process: 'sim up' asks once for the fleet and once per node
def _inputs_digest(source: Path) -> str:
    digest = hashlib.sha256()
    for item in (SUITE, PYTHON_PACKAGES, SLIM_REMOVE, ENTRYPOINT, ENV, USER, installed_versions(),
                 sys.version_info[:2], "constraints-only"):  # the recipe: no requirement but the plugin
        digest.update(repr(item).encode())
    for path in builder.source_files(source):
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _base_digest() -> str:
    return builder.base_digest()


def plugin_layer(source: Path, work: Path) -> bytes:
    """The plugin layer with this environment's pins (what the fleet's image holds)."""
    pinned_dependencies()  # each installed here, or a clear error
    return builder.plugin_layer(source, work, constraints=installed_versions())


def built(cache: Path, source: Path | None = None) -> Path | None:
    """The folder of the image for this plugin source, when it is built."""
    source = source or plugin_dir()
    folder = cache / f"plugin-image-{_inputs_digest(source)}"
    return folder if (folder / "image.json").is_file() else None


def require(cache: Path) -> Path:
    """The built image of this checkout's plugin, or a clear error saying how to build it."""
    folder = built(cache)
    if folder is None:
        raise GpunodeError(f"the device plugin image of {plugin_dir()} is not built in {cache}",
                           "run 'gpunode sim build' (it builds it in seconds once the base layer is cached)")
    return folder


def ensure_built(cache: Path, say: Say, source: Path | None = None) -> Path:
    """Build the plugin image unless this plugin source's image is cached; return its folder."""
    source = source or plugin_dir()
    if not (source / "pyproject.toml").is_file():
        raise GpunodeError(f"the plugin's source is not at {source}",
                           "run from a gpunode checkout (plugin/ beside sim/)")
    folder = cache / f"plugin-image-{_inputs_digest(source)}"
    if (folder / "image.json").is_file():
        return folder
    pinned_dependencies()  # each installed here, or a clear error
    # constraints only (no requirement of its own): the same bytes 'gpunode image build --constraint' makes
    builder.build(source, folder, cache, say, constraints=installed_versions())
    prune_builds(cache, "plugin-image-", folder)
    say(f"plugin image {image_name(source)} built: {folder / ARCHIVE}")
    return folder
