"""The node checker's image as the simulated fleet runs it: ``gpunode image build --node-checker`` on this checkout,
its dependencies pinned to the versions installed here, cached by its inputs (gpunode's source and the pins), so a
change to gpunode rebuilds only this image's top layer (seconds; the base layer is the plugin image's).
"""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

from gpunode.image import build as builder
from gpunode.image.build import ARCHIVE, CHECKER, plugin_version
from gpunode_sim.images import prune_builds
from gpunode_sim.images.plugin_image import installed_versions

Say = Callable[[str], None]


def checkout() -> Path:
    """This gpunode checkout (pyproject.toml and src/gpunode, beside sim/)."""
    return Path(__file__).resolve().parents[3]


@functools.cache
def _inputs_digest(source: Path) -> str:
    digest = hashlib.sha256()
    for item in (CHECKER, builder.base_digest(), installed_versions(), sys.version_info[:2]):
        digest.update(repr(item).encode())
    for path in builder.source_files(source, CHECKER):
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def built(cache: Path, source: Path | None = None) -> Path | None:
    """The folder of this checkout's checker image, when it is built."""
    folder = cache / f"checker-image-{_inputs_digest(source or checkout())}"
    return folder if (folder / "image.json").is_file() else None


def ensure_built(cache: Path, say: Say, source: Path | None = None) -> Path:
    """Build the checker image unless this checkout's is cached; return its folder."""
    source = source or checkout()
    folder = cache / f"checker-image-{_inputs_digest(source)}"
    if (folder / "image.json").is_file():
        return folder
    builder.build(source, folder, cache, say, constraints=installed_versions(), recipe=CHECKER)
    prune_builds(cache, "checker-image-", folder)
    say(f"node checker image {builder.image_name(plugin_version(source), CHECKER)} built: {folder / ARCHIVE}")
    return folder
