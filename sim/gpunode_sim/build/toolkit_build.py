"""NVIDIA's Container Toolkit programs for the simulated packages, built once per machine from NVIDIA's Go module.

``github.com/NVIDIA/nvidia-container-toolkit`` at each simulated version, built as
upstream's Makefile does: with cgo (go-nvml loads libnvidia-ml at run time; built
so, they link only glibc and run in the Debian 12 nodes), ``-s -w`` and the
version and commit stamped in. Every Go program the packages ship is NVIDIA's:
``nvidia-ctk`` (``runtime configure`` reads and writes the runtime's config files;
``cdi generate`` reads the GPUs through the node's NVML), ``nvidia-container-runtime``
(the OCI runtime containerd and docker call), ``nvidia-container-runtime-hook`` (its
legacy-mode prestart hook) and ``nvidia-cdi-hook`` (the hooks a CDI spec names).
Only libnvidia-container (C, the driver's side of the legacy mode) stays a stand-in.
The binaries land in the machine's cache (``/var/cache/gpunode/nvidia-ctk-vX.Y.Z/``).
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from gpunode.errors import GpunodeError
from gpunode_sim.build.gobuild import build_into, finished, run_go, write_build_module

MODULE = "github.com/NVIDIA/nvidia-container-toolkit"
COMMITS = {"1.17.8": "f202b80a9b9d0db00d9b1d73c0128c8962c55f4d", "1.20.0": "5505e2f94d9aaa08561490db974ba3cd676af209"}

PROGRAMS = ("nvidia-ctk", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-cdi-hook")

Say = Callable[[str], None]


def binary_dir(cache: Path, version: str) -> Path:
    return cache / f"nvidia-ctk-v{version}"


def built(cache: Path, version: str) -> Path | None:
    """The cached ``nvidia-ctk`` of ``version`` (its folder holds the other programs) when a finished build of
    every program is there, else None."""
    folder = binary_dir(cache, version)
    return folder / "nvidia-ctk" if finished(folder, PROGRAMS) else None


def program(nvidia_ctk: Path, name: str) -> Path:
    """Another of the toolkit's programs, built beside ``nvidia_ctk``."""
    return nvidia_ctk.with_name(name)


def require(cache: Path) -> dict[str, Path]:
    """Every version's cached binary, or a clear error saying how to build them."""
    found = {version: built(cache, version) for version in COMMITS}
    missing = [v for v, path in found.items() if path is None]
    if missing:
        raise GpunodeError(f"the real nvidia-ctk {', '.join(missing)} is not built in {cache}",
                           "run 'gpunode sim build' (or scripts/setup-host) once on this machine")
    return {version: path for version, path in found.items() if path is not None}


def digest(binaries: dict[str, Path]) -> str:
    """What the simulated repository is built from: a rebuilt binary rebuilds the repository."""
    hashed = hashlib.sha256()
    for version, path in sorted(binaries.items()):
        for name in PROGRAMS:
            hashed.update(version.encode() + hashlib.sha256(program(path, name).read_bytes()).digest())
    return hashed.hexdigest()[:16]


def ensure_built(cache: Path, say: Say) -> dict[str, Path]:
    for version, commit in COMMITS.items():
        if built(cache, version):
            continue
        if shutil.which("gcc") is None and shutil.which("cc") is None:
            raise GpunodeError("building nvidia-ctk needs a C compiler (cgo)", "apt-get install gcc libc6-dev")
        started = time.monotonic()
        work = cache / f"nvidia-ctk-build-v{version}"
        log = work / "build.log"
        write_build_module(work, f"module gpunode.local/ctkbuild\n\ngo 1.22\n\nrequire {MODULE} v{version}\n",
                           [f"{MODULE}/cmd/{name}" for name in PROGRAMS], "ctkbuild")
        log.write_text("")
        say(f"building {', '.join(PROGRAMS)} {version} from {MODULE} (log: {log})")
        run_go(["mod", "tidy"], work, log)
        info = f"{MODULE}/internal/info"
        ldflags = f"-s -w -X {info}.version={version} -X {info}.gitCommit={commit}"
        folder = binary_dir(cache, version)
        build_into(folder, [(name, f"{MODULE}/cmd/{name}", ldflags) for name in PROGRAMS], work, log,
                   {"version": version, "commit": commit}, started, cgo=True)
        say(f"NVIDIA's toolkit programs {version} built in {time.monotonic() - started:.0f} s: {folder}")
    return require(cache)
