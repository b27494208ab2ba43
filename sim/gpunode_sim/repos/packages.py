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
    postinst: str = ""  # a shell script run after the files are in place (dpkg's postinst, rpm's %post)

    def deb_depends(self) -> str:
        return ", ".join(f"{name} ({op} {version})" for name, op, version in self.depends)
