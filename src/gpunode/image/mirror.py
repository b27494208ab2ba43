"""The Debian mirror the host's own apt uses: images (the plugin's, the simulated nodes') come from the same place."""

from __future__ import annotations

import re
from pathlib import Path

from gpunode.errors import GpunodeError


def debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The first Debian archive URI found in the host's apt sources (deb822 or one-line)."""
    files = sorted((apt_dir / "sources.list.d").glob("*.sources")) + [apt_dir / "sources.list"]
    files += sorted((apt_dir / "sources.list.d").glob("*.list"))
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text()
        if path.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
                uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
                if uris and suites and "bookworm" in suites.group(1).split():
                    return uris.group(1)
        else:
            for line in text.splitlines():
                match = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+bookworm\s", line)
                if match:
                    return match.group(1)
    raise GpunodeError(f"no Debian bookworm mirror found in the host's apt sources under {apt_dir}",
                       "add a 'deb <mirror> bookworm main' source, or set GPUNODE_DEBIAN_MIRROR")
