"""Host processes of the simulated fleet: is one alive, and signalling it with its process group."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # it may end between the signal and the read (seen taking a 100-node fleet down)
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group ``pid`` leads (our services start sessions of their own), else ``pid`` alone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        signal_pid(pid, sig)
