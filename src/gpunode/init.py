"""``gpunode init DIR``: a pyinfra project of the user's own, from the files gpunode ships.

The project is what a pyinfra user expects to own and change: the example
inventory and ``group_data/all.py`` (every key with its default and a comment),
the thin ``deploys/*.py`` entry points and a CI workflow. With ``--sim`` it also
gets ``inventories/sim.py``, the inventory of a running simulated fleet. Files
that exist are never overwritten unless asked (``--force``), so running it
again only adds what is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from gpunode import chain
from gpunode.errors import GpunodeError

# (path inside the packaged scaffold, path in the user's project)
FILES = (
    *((f"inventories/{name}", f"inventories/{name}") for name in ("prod.py", "group_data/all.py",
                                                                     "group_data/h100_nodes.py")),
    *((f"deploys/{step}.py", f"deploys/{step}.py") for step in ("bootstrap", *chain.NAMES)),
    ("examples/ci/gpu-nodes.yml", ".github/workflows/gpu-nodes.yml"),
)
SIM_FILES = (("inventories/sim.py", "inventories/sim.py"),)


@dataclass(frozen=True)
class InitResult:
    written: list[str]
    kept: list[str]


def scaffold() -> Traversable:
    return resources.files("gpunode") / "scaffold"


def init_project(target: Path, sim: bool = False, force: bool = False) -> InitResult:
    """Write the project into ``target`` (made if missing); existing files are kept unless ``force``."""
    if target.exists() and not target.is_dir():
        raise GpunodeError(f"{target} exists and is not a folder", "name a new or existing folder for the project")
    source = scaffold()
    chosen = FILES + (SIM_FILES if sim else ())
    missing = [inner for inner, _ in chosen if not (source / inner).is_file()]
    if missing:
        raise GpunodeError(f"this gpunode installation lacks its project files: {', '.join(missing)}",
                           "reinstall gpunode (the files ship inside the package, gpunode/scaffold)")
    written, kept = [], []
    for inner, outer in chosen:
        path = target / outer
        if path.exists() and not force:
            kept.append(outer)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((source / inner).read_text())
        written.append(outer)
    return InitResult(written, kept)
