"""Facts of the toolkit step: installed versions and holds of the four toolkit packages, from dpkg or rpm, and
what the installed toolkit needs from the host: its config.toml (the ldconfig it runs, its mode), the modes of
the programs containerd and docker execute, and the CDI specs its cdi mode reads."""

from __future__ import annotations

import re
import tomllib

import yaml
from pyinfra.api import FactBase

from gpunode.facts import os_release
from gpunode.facts.sections import section, split_sections
from gpunode.settings import TOOLKIT_CONFIG, TOOLKIT_PACKAGES, VERSIONLOCK_LIST

# where an ldconfig may be: the distributions' own, and the path config.toml names (read by the same command)
LDCONFIG_CANDIDATES = ("/sbin/ldconfig", "/sbin/ldconfig.real", "/usr/sbin/ldconfig", "/usr/sbin/ldconfig.real")
# the programs of the toolkit that a container runtime or the hook executes
TOOLKIT_PROGRAMS = ("/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-container-runtime-hook",
                    "/usr/bin/nvidia-ctk", "/usr/bin/nvidia-container-cli")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
VOLUME_MOUNTS_KEY = "accept-nvidia-visible-devices-as-volume-mounts"
CDI_MARK = "== cdi spec "  # starts each spec's text in the cdi section
CDI_MAX_BYTES = 262144  # nvidia-ctk's spec for 8 GPUs with their libraries is about 20 KB
# the configured ldconfig's host path: the value of `ldconfig = "@/path"` without its "@"
CONFIGURED_LDCONFIG = (f"sed -n 's/^[[:space:]]*ldconfig[[:space:]]*=[[:space:]]*//p' {TOOLKIT_CONFIG} 2>/dev/null"
                       " | head -n 1 | tr -d \"\\\"'@\" | awk '{print $1}'")


def parse_config(lines: list[str]) -> dict | None:
    """The settings of config.toml that the host must be able to honour; None when there is no file."""
    if not lines or lines[0] != "present":
        return None
    text = "\n".join(lines[1:])
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        return {"error": str(error), "ldconfig": None, "mode": None, "volume_mounts": False}
    cli = config.get("nvidia-container-cli") or {}
    runtime = config.get("nvidia-container-runtime") or {}
    ldconfig = cli.get("ldconfig") if isinstance(cli, dict) else None
    mode = runtime.get("mode") if isinstance(runtime, dict) else None
    return {"error": None, "ldconfig": str(ldconfig) if ldconfig is not None else None,
            "mode": str(mode) if mode is not None else None,
            # whether the hook takes devices from /dev/null mounts (the volume-mounts list strategy); off by default
            "volume_mounts": config.get(VOLUME_MOUNTS_KEY) is True}

def cdi_specs(lines: list[str]) -> dict[str, dict]:
    """Each CDI spec's device names for kind nvidia.com/gpu (``0``, ``GPU-<uuid>``, ``all``, MIG ones), or the
    reason it does not parse (the container runtime refuses such a spec as a whole)."""
    texts: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(CDI_MARK) and line[len(CDI_MARK):].startswith("/"):
            current = texts.setdefault(line[len(CDI_MARK):].strip(), [])
        elif current is not None:
            current.append(line)
    specs = {}
    for path, text in texts.items():
        try:
            spec = yaml.safe_load("\n".join(text))
        except yaml.YAMLError as error:
            specs[path] = {"devices": [], "error": " ".join(str(error).split())}
            continue
        if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
            specs[path] = {"devices": [], "error": "not a CDI spec (no devices list)"}
            continue
        kind = spec.get("kind")
        names = [str(device["name"]) for device in spec["devices"] if isinstance(device, dict) and "name" in device]
        specs[path] = {"devices": names if kind == "nvidia.com/gpu" else [],
                       "error": None if kind == "nvidia.com/gpu" else f"kind {kind!r}, not nvidia.com/gpu"}
    return specs


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
            section("config"), f"if [ -f {TOOLKIT_CONFIG} ]; then echo present; cat {TOOLKIT_CONFIG}; fi",
            section("paths"),
            f"for p in {' '.join(LDCONFIG_CANDIDATES)} $({CONFIGURED_LDCONFIG}); do "
            "if [ -e \"$p\" ]; then echo \"yes $p\"; else echo \"no $p\"; fi; done",
            section("programs"), f"stat -c '%a %n' {' '.join(TOOLKIT_PROGRAMS)} 2>/dev/null",
            section("cdi"),  # each spec naming nvidia.com/gpu, with its text; then the GPUs it must match
            f"specs=$(grep -l -s 'nvidia.com/gpu' {' '.join(d + '/*' for d in CDI_DIRS)}); for f in $specs; do"
            f" echo \"{CDI_MARK}$f\"; head -c {CDI_MAX_BYTES} \"$f\"; echo; done",
            section("cdi_gpus"),
            "if [ -n \"$specs\" ] && command -v nvidia-smi >/dev/null 2>&1; then"
            " nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null; fi",
            "true",
        ])

    def process(self, output: list[str]) -> dict:
        parts = split_sections(output)
        family, _ = os_release.package_family(parts.get("os_release", []))
        return {**self.packages(family, parts), **self.host_side(parts)}

    @staticmethod
    def host_side(parts: dict[str, list[str]]) -> dict:
        paths = {}
        for line in parts.get("paths", []):
            answer, _, path = line.partition(" ")
            if answer in ("yes", "no") and path.startswith("/"):
                paths[path] = answer == "yes"
        modes = {}
        for line in parts.get("programs", []):
            mode, _, path = line.partition(" ")
            if path in TOOLKIT_PROGRAMS and re.fullmatch(r"[0-7]{3,4}", mode):
                modes[path] = mode
        specs = cdi_specs(parts.get("cdi", []))
        gpus = []
        for line in parts.get("cdi_gpus", []):
            index, _, uuid = (value.strip() for value in line.partition(","))
            if index.isascii() and index.isdigit() and uuid.startswith("GPU-"):
                gpus.append({"index": int(index), "uuid": uuid})
        return {"config": parse_config(parts.get("config", [])), "paths": paths, "modes": modes,
                "cdi_specs": sorted(specs), "cdi_devices": {path: spec["devices"] for path, spec in specs.items()},
                "cdi_errors": {path: spec["error"] for path, spec in specs.items() if spec["error"]},
                "cdi_gpus": gpus}

    @staticmethod
    def packages(family: str | None, parts: dict[str, list[str]]) -> dict:
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
