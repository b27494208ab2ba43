"""Facts of the runtime step: which container runtime runs, its config files and its effective config.

containerd's effective config comes from ``containerd config dump``, which
merges drop-ins (``imports``), so both toolkit layouts (in-place 1.17, drop-in
1.18+) read the same. File contents travel base64-encoded, byte for byte.
"""

from __future__ import annotations

import base64
import binascii
import re

from pyinfra.api import FactBase

from gpunode.facts.sections import exit_code, section, split_sections

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROPIN_DIR = "/etc/containerd/conf.d"
DOCKER_CONFIG = "/etc/docker/daemon.json"
CTR_TIMEOUT = 5  # ctr waits 10 s for a socket nobody answers on; a stopped containerd is read from systemctl


def containerd_version(lines: list[str]) -> str | None:
    """``1.6.20`` from ``containerd --version`` (``containerd <package> 1.6.20~ds1 <commit>``), None if absent."""
    match = re.search(r"\sv?(\d+\.\d+\.\d+)", " " + " ".join(lines[:1]))
    return match.group(1) if match else None


def _b64(text: str) -> str:
    """A file's content as the command sent it; text that is not base64 is shown as it came, never raised."""
    try:
        return base64.b64decode(text, validate=True).decode(errors="replace")
    except (binascii.Error, ValueError):
        return f"(not base64, as printed by the host: {text[:200]!r})"


def _encoded(path: str) -> str:
    return f"if [ -f {path} ]; then echo present; base64 -w0 {path}; echo; fi"


class RuntimeConfig(FactBase):
    """Installed and active runtimes, containerd's and docker's config files, containerd's effective config.

    .. code:: python

        {
            "installed": ["containerd", "docker", "docker-cli"], "active": {"containerd": "active", "docker": "active"},
            "containerd_config": "version = 2 ...",        # None when the file is absent
            "containerd_dropins": {"/etc/containerd/conf.d/99-nvidia.toml": "..."},
            "containerd_dump": {"rc": 0, "text": "...",    # stdout; None when containerd is not installed
                                "stderr": ""},             # its warnings and errors, apart from the TOML
            "containerd_default": "...",                   # 'containerd config default', only when the
                                                           # config is absent or has no runc runtime
            "containerd_migrated": "...",                  # 'containerd config migrate' (containerd 2.x: the
                                                           # config in the newest schema), same condition;
                                                           # None on 1.x, which has no such command
            "docker_config": "{...}",                      # None when /etc/docker/daemon.json is absent
            "cri_status": "ok",                            # containerd's CRI plugin (ctr plugins ls): ok, error,
                                                           # "absent" (no cri listed), "unanswered (...)";
                                                           # None when containerd is not active or ctr missing
            "containerd_version": "1.6.20",                # from 'containerd --version', None if unknown
        }
    """

    def command(self) -> str:
        return "; ".join([
            section("installed"),
            "command -v containerd >/dev/null 2>&1 && echo containerd;"
            " command -v dockerd >/dev/null 2>&1 && echo docker; command -v crio >/dev/null 2>&1 && echo crio;"
            " command -v docker >/dev/null 2>&1 && echo docker-cli",  # docker's client, packaged apart on newer Debian
            section("active"),
            "gpunode_active=$(systemctl is-active containerd docker crio 2>/dev/null);"
            " printf '%s\\n' \"$gpunode_active\" | paste -d' ' - - - |"
            " awk '{print \"containerd \" $1; print \"docker \" $2; print \"crio \" $3}'",
            section("containerd_config"), _encoded(CONTAINERD_CONFIG),
            section("containerd_dropins"),
            f"for f in {CONTAINERD_DROPIN_DIR}/*.toml; do [ -f \"$f\" ] && echo \"$f $(base64 -w0 \"$f\")\"; done",
            section("containerd_dump"),  # stdout alone (TOML); stderr (warnings, errors) in the next section
            "if command -v containerd >/dev/null 2>&1; then exec 3>&1;"
            " gpunode_dump_err=$(containerd config dump 2>&1 1>&3); echo rc=$?; exec 3>&-; fi",
            section("containerd_dump_stderr"),
            '[ -n "${gpunode_dump_err:-}" ] && printf "%s\\n" "$gpunode_dump_err"',
            section("containerd_default"),
            f"if command -v containerd >/dev/null 2>&1 && ! grep -qs 'runtimes.runc' {CONTAINERD_CONFIG}; then"
            " containerd config default 2>/dev/null; fi",
            section("containerd_migrated"),  # printed only when containerd knows the command (2.x)
            f"if command -v containerd >/dev/null 2>&1 && ! grep -qs 'runtimes.runc' {CONTAINERD_CONFIG}; then"
            " gpunode_migrated=$(containerd config migrate 2>/dev/null) && printf '%s\n' \"$gpunode_migrated\"; fi",
            section("docker_config"), _encoded(DOCKER_CONFIG),
            section("containerd_version"),
            "if command -v containerd >/dev/null 2>&1; then containerd --version 2>/dev/null; fi",
            section("cri"),  # asked only of a running containerd, and never longer than CTR_TIMEOUT seconds
            "set -- ${gpunode_active:-}; if command -v ctr >/dev/null 2>&1 && [ \"${1:-}\" = active ];"
            f" then out=$(timeout {CTR_TIMEOUT} ctr plugins ls 2>/dev/null); rc=$?;"
            " if [ $rc -ne 0 ]; then echo \"unanswered (ctr plugins ls exit $rc)\"; else"
            " printf '%s\\n' \"$out\" | awk '$2==\"cri\"{print $4; n++} END{if(!n) print \"absent\"}'; fi; fi",
            "true",
        ])

    def process(self, output: list[str]) -> dict:
        parts = split_sections(output)

        def decoded(lines: list[str] | None) -> str | None:
            if not lines or lines[0] != "present":
                return None
            return _b64(lines[1] if len(lines) > 1 else "")

        dropins = {}
        for line in parts.get("containerd_dropins", []):
            path, _, encoded = line.partition(" ")
            dropins[path] = _b64(encoded)
        dump = parts.get("containerd_dump")
        rc, dump_lines = exit_code(dump or [])
        default = parts.get("containerd_default") or []
        migrated = parts.get("containerd_migrated") or []
        active = {}
        for line in parts.get("active", []):
            name, _, value = line.partition(" ")
            active[name] = value.strip() or "unknown"
        return {
            "installed": parts.get("installed", []),
            "active": active,
            "containerd_config": decoded(parts.get("containerd_config")),
            "containerd_dropins": dropins,
            "containerd_dump": None if dump is None or rc is None else {
                "rc": rc, "text": "\n".join(dump_lines),
                "stderr": "\n".join(parts.get("containerd_dump_stderr") or [])},
            "containerd_default": "\n".join(default) + "\n" if default else None,
            "containerd_migrated": "\n".join(migrated) + "\n" if migrated else None,
            "docker_config": decoded(parts.get("docker_config")),
            "cri_status": (parts.get("cri") or [None])[0],
            "containerd_version": containerd_version(parts.get("containerd_version") or []),
        }
