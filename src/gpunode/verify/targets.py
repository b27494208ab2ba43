"""The hosts of a pyinfra inventory, as verification targets with their settings (reached by gpunode.connection)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpunode.errors import GpunodeError
from gpunode.host_settings import settings_of
from gpunode.settings import NodeSettings


def parse_data(pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings (as given to ``--data``) as a mapping."""
    data = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise GpunodeError(f"--data {pair!r} is not KEY=VALUE", "for example: --data toolkit_version=1.20.0-1")
        data[key] = value
    return data


@dataclass
class Target:
    """One inventory host: its name, its data, and how to reach it."""

    name: str
    data: dict[str, Any]
    groups: list[str]

    @property
    def settings(self) -> NodeSettings:
        """The node's settings, from the host's data parsed once (``gpunode.host_settings``)."""
        return settings_of(self).node


def inventory_error(path: str, error: Exception) -> GpunodeError:
    """Why an inventory (or its group_data) did not load, as pyinfra names it: file, line, the exception's words."""
    import traceback

    cause: BaseException = getattr(error, "exception", None) or error  # pyinfra wraps the user's exception
    filename = str(getattr(error, "filename", None) or path)
    line: int | None = None
    if isinstance(cause, SyntaxError):
        filename, line = cause.filename or filename, cause.lineno
        words = f"SyntaxError: {cause.msg}"
    else:
        frames = traceback.extract_tb(getattr(cause, "_traceback", None) or cause.__traceback__)
        user = [frame for frame in frames if "site-packages" not in frame.filename and "/pyinfra" not in frame.filename]
        if user:
            filename, line = user[-1].filename, user[-1].lineno
        words = f"{type(cause).__name__}: {cause}"
    where = f"{filename}, line {line}" if line else filename
    return GpunodeError(f"inventory {path} does not load: {where}: {words}",
                        "fix that line; 'pyinfra INVENTORY exec -- true' loads the inventory the same way")


def load_inventory(path: str, limit: list[str] | None = None, data: dict[str, str] | None = None) -> list[Target]:
    """Targets of the pyinfra inventory file ``path`` (group_data/ included), filtered by ``limit``.

    ``limit`` holds host names, group names or glob patterns, like pyinfra's ``--limit``;
    ``data`` overrides host data for every host, like pyinfra's ``--data``.
    """
    from fnmatch import fnmatch

    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    inventory_path = Path(path)
    if not inventory_path.is_file():
        raise GpunodeError(f"inventory {path} does not exist",
                           "give the path of a pyinfra inventory file, e.g. inventories/prod.py")
    try:
        with ctx_state.use(State()):
            inventory = make_inventory(str(inventory_path), override_data=data or None, cwd=str(Path.cwd()))
    except GpunodeError:
        raise
    except Exception as error:  # noqa: BLE001 - the user's Python, whatever it raised: one line, no traceback
        raise inventory_error(path, error) from None
    targets = []
    for host in inventory:
        groups = sorted(host.groups)
        if limit and not any(fnmatch(host.name, pattern) or pattern in groups for pattern in limit):
            continue
        targets.append(Target(host.name, dict(host.data.dict()), groups))
    if not targets:
        raise GpunodeError(f"no host of {path} matches --limit {' '.join(limit or [])}" if limit
                           else f"inventory {path} has no hosts",
                           "check the host and group names in the inventory")
    return targets
