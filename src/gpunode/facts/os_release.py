"""Which packaging a host uses, from its ``/etc/os-release`` (``ID`` and ``ID_LIKE``).

NVIDIA publishes the toolkit for apt (Debian, Ubuntu) and for dnf (RHEL, Rocky,
Alma, Fedora, ...); a host is of the first family its own ID, then its ID_LIKE
names, as the os-release specification orders them.
"""

from __future__ import annotations

import shlex

FAMILIES = {"debian": "deb", "ubuntu": "deb", "rhel": "rpm", "centos": "rpm", "fedora": "rpm", "rocky": "rpm",
            "almalinux": "rpm", "ol": "rpm"}
READ_COMMAND = "grep -sE '^(ID|ID_LIKE)=' /etc/os-release"


def package_family(lines: list[str]) -> tuple[str | None, str]:
    """``("rpm", "ID=rocky ID_LIKE=rhel centos fedora")`` from the grep's lines; None when no ID is known."""
    values: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and key in ("ID", "ID_LIKE"):
            try:
                values[key] = " ".join(shlex.split(value))
            except ValueError:
                values[key] = value.strip("\"'")
    read = " ".join(f"{key}={values[key]}" for key in ("ID", "ID_LIKE") if key in values) or "no ID in /etc/os-release"
    for name in [values.get("ID", "")] + values.get("ID_LIKE", "").split():
        if name.lower() in FAMILIES:
            return FAMILIES[name.lower()], read
    return None, read
