"""Splitting the output of a fact command that prints several marked sections."""

from __future__ import annotations

import re

MARK = "##gpunode:"


def section(name: str) -> str:
    """Shell that prints the marker line opening section ``name``."""
    return f"echo '{MARK}{name}'"


def split_sections(lines: list[str]) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith(MARK):
            current = sections.setdefault(line[len(MARK):].strip(), [])
        elif current is not None:
            current.append(line)
    return sections


def exit_code(lines: list[str]) -> tuple[int | None, list[str]]:
    """Split a trailing ``rc=N`` line from the output it closes."""
    if lines and re.fullmatch(r"rc=[0-9]+", lines[-1].strip()):
        return int(lines[-1][3:]), lines[:-1]
    return None, lines
