"""Facts of the toolkit step: installed versions and holds of the four toolkit packages, from dpkg or rpm."""

from __future__ import annotations

import re

from pyinfra.api import FactBase

from gpunode.facts import os_release
from gpunode.facts.sections import section, split_sections
from gpunode.settings import TOOLKIT_PACKAGES, VERSIONLOCK_LIST

# an entry of dnf's versionlock list: NAME-[EPOCH:]VERSION-RELEASE[.ARCH or .*]; "!" starts an exclude
LOCK_ENTRY = re.compile(r"^(?P<name>[^\s!#].*?)-(?:\d+:)?(?P<version>[^-:\s]+-[^-\s]+?)"
                        r"(?:\.(?:\*|x86_64|aarch64|noarch|i686|ppc64le|s390x))?$")


class ToolkitPackages(FactBase):
    """Installed version (None if not installed) and hold of each toolkit package.

    On apt hosts both come from dpkg's status database in one read: a hold is dpkg's selection state (``h`` as
    the first letter of ``db:Status-Abbrev``), which is what ``apt-mark hold`` sets. ``apt-mark showhold`` would
    say the same, but it rebuilds ``/var/cache/apt/pkgcache.bin`` when that is stale (a read that writes), and
    with a broken apt source it can fail and print no hold at all.

    On dnf hosts the versions come from rpm's database and a hold is an entry of dnf's versionlock list (what
    ``dnf versionlock add`` writes), read from the file: ``dnf versionlock list`` loads every repository first.

    .. code:: python

        {"family": "deb", "versions": {"nvidia-container-toolkit": "1.17.8-1", ...},
         "held": ["nvidia-container-toolkit"],
         "locks": {"nvidia-container-toolkit": "1.17.8-1"}}    # dnf only: the version each lock holds
    """

    def command(self) -> str:
        packages = " ".join(TOOLKIT_PACKAGES)
        return "; ".join([
            section("os_release"), os_release.READ_COMMAND,
            section("versions"),
            f"command -v dpkg-query >/dev/null 2>&1 && dpkg-query -W -f='${{Package}} ${{Version}}"
            f" ${{db:Status-Abbrev}}\\n' {packages} 2>/dev/null",
            section("rpm"),
            f"command -v rpm >/dev/null 2>&1 && rpm -q --qf '%{{NAME}} %{{VERSION}}-%{{RELEASE}}\\n' {packages}"
            " 2>/dev/null | grep -v 'is not installed'",
            section("locks"), f"cat {VERSIONLOCK_LIST} 2>/dev/null",
            "true",
        ])

    def process(self, output: list[str]) -> dict:
        parts = split_sections(output)
        family, _ = os_release.package_family(parts.get("os_release", []))
        versions: dict[str, str | None] = {name: None for name in TOOLKIT_PACKAGES}
        if family == "rpm":
            for line in parts.get("rpm", []):
                fields = line.split()
                if len(fields) == 2 and fields[0] in versions:
                    versions[fields[0]] = fields[1]
            locks = {}
            for line in parts.get("locks", []):
                match = LOCK_ENTRY.match(line.strip())
                if match and match.group("name") in versions:
                    locks[match.group("name")] = match.group("version")
            return {"family": family, "versions": versions, "held": sorted(locks), "locks": locks}
        held = []
        for line in parts.get("versions", []):
            fields = line.split()
            if len(fields) < 3 or fields[0] not in versions:
                continue
            if fields[2][1:2] == "i":
                versions[fields[0]] = fields[1]
            if fields[2][:1] == "h":
                held.append(fields[0])
        return {"family": family, "versions": versions, "held": sorted(held), "locks": {}}
