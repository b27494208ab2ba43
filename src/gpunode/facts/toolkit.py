"""Facts of the toolkit step: installed versions and holds of the four toolkit packages."""

from __future__ import annotations

from pyinfra.api import FactBase

from gpunode.facts.sections import section, split_sections
from gpunode.settings import TOOLKIT_PACKAGES


class ToolkitPackages(FactBase):
    """Installed version (None if not installed) and hold flag of each toolkit package.

    .. code:: python

        {"versions": {"nvidia-container-toolkit": "1.17.8-1", ...}, "held": ["nvidia-container-toolkit"]}
    """

    def command(self) -> str:
        packages = " ".join(TOOLKIT_PACKAGES)
        return "; ".join([
            section("versions"),
            f"dpkg-query -W -f='${{Package}} ${{Version}} ${{db:Status-Abbrev}}\\n' {packages} 2>/dev/null",
            section("held"),
            f"apt-mark showhold {packages} 2>/dev/null",
            "true",
        ])

    def process(self, output: list[str]) -> dict:
        parts = split_sections(output)
        versions: dict[str, str | None] = {name: None for name in TOOLKIT_PACKAGES}
        for line in parts.get("versions", []):
            fields = line.split()
            if len(fields) >= 3 and fields[0] in versions and fields[2][1:2] == "i":
                versions[fields[0]] = fields[1]
        return {"versions": versions, "held": sorted(p for p in parts.get("held", []) if p in versions)}
