"""Images and layers: node root filesystems, OCI archives, the device plugin's and the workload's images, the tools
layer."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

KEPT_BUILDS = 3  # a checkout and a CI clone beside it, and the one before: the rest is disk only


def prune_builds(cache: Path, prefix: str, keep: Path, count: int = KEPT_BUILDS) -> list[Path]:
    """Remove the oldest finished ``PREFIX<digest>`` image folders beyond the ``count`` newest (``keep`` always
    stays; a build in progress has no image.json yet and is left alone): each change to gpunode's or the plugin's
    source builds a new one (about 200 MiB); returns what went."""
    pattern = re.compile(re.escape(prefix) + r"[0-9a-f]{12}")
    folders = sorted((p for p in cache.glob(f"{prefix}*") if pattern.fullmatch(p.name) and p != keep
                      and (p / "image.json").is_file()),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    gone = folders[max(count - 1, 0):]
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)
    return gone
