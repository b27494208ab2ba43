"""Facts of the toolkit step: installed versions and holds of the four toolkit packages."""

from __future__ import annotations

from pyinfra.api import FactBase

from gpunode.facts.sections import section, split_sections
from gpunode.settings import TOOLKIT_PACKAGES


class ToolkitPackages(FactBase):
    """Installed version (None if not installed) and hold flag of each toolkit package.

    Both come from dpkg's status database in one read: a hold is dpkg's selection state (``h`` as the first
    letter of ``db:Status-Abbrev``), which is what ``apt-mark hold`` sets. ``apt-mark showhold`` would say the
    same, but it rebuilds ``/var/cache/apt/pkgcache.bin`` when that is stale (a read that writes), and with a
    broken apt source it can fail and print no hold at all.

    .. code:: python

        {"versions": {"nvidia-container-toolkit": "1.17.8-1", ...}, "held": ["nvidia-container-toolkit"]}
    """

    def command(self) -> str:
        packages = " ".join(TOOLKIT_PACKAGES)
        return "; ".join([
            section("versions"),
            f"dpkg-query -W -f='${{Package}} ${{Version}} ${{db:Status-Abbrev}}\\n' {packages} 2>/dev/null",
            "true",
        ])

    def process(self, output: list[str]) -> dict:
        parts = split_sections(output)
        versions: dict[str, str | None] = {name: None for name in TOOLKIT_PACKAGES}
        held = []
        for line in parts.get("versions", []):
            fields = line.split()
            if len(fields) < 3 or fields[0] not in versions:
                continue
            if fields[2][1:2] == "i":
                versions[fields[0]] = fields[1]
            if fields[2][:1] == "h":
                held.append(fields[0])
        return {"versions": versions, "held": sorted(held)}
