"""The simulated toolkit packages as data, shared by the apt and the rpm repository builders (one package model,
two formats; the apt builder calls the rpm builder, never the other way round)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


def write_file(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    """Write ``content`` (text or bytes) at ``path`` with ``mode``, making its folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    path.chmod(mode)


@dataclass(frozen=True)
class SimPackage:
    """One simulated toolkit package: its files and dependencies, written as a .deb and as an .rpm."""

    name: str
    version: str
    depends: tuple[tuple[str, str, str], ...]  # (package, operator as Debian writes it: >=, <<, =, version)
    files: dict[str, tuple[str | bytes, int]]
    conffiles: tuple[str, ...] = ()
    post_install: tuple[str, ...] = ()  # a command run after the files are in place (dpkg's postinst, rpm's %post)

    def postinst_script(self) -> str:
        """The command as dpkg's postinst runs it (on configure, as NVIDIA's packages do)."""
        if not self.post_install:
            return ""
        return ('#!/bin/sh\nset -e\nif [ "$1" = configure ]; then\n  ' + " ".join(self.post_install)
                + "\nfi\nexit 0\n")

    def rpm_post_lua(self) -> str:
        """The command as an rpm %post in rpm's embedded Lua: a /bin/sh scriptlet would make rpmbuild add
        ``Requires(post): /bin/sh``, which the rpm stand-in's database has no package to provide (on a real RHEL
        host bash does)."""
        return "rpm.execute(" + ", ".join(f'"{arg}"' for arg in self.post_install) + ")"

    def deb_depends(self) -> str:
        return ", ".join(f"{name} ({op} {version})" for name, op, version in self.depends)
