"""The simulated GPU nodes' ``libnvidia-ml.so.1``: NVML's C ABI over the node's simulated GPU state.

Built once per machine with cgo (``-buildmode=c-shared``) from ``nvml_mock/`` (Go answering the calls, and a C
shim with NVML's exact prototypes) against NVIDIA's ``nvml.h`` as NVIDIA's ``github.com/NVIDIA/go-nvml`` module
ships it: struct layouts, return codes and event types are NVIDIA's, never ours. The device plugin's production
backend (nvidia-ml-py over this library) then runs unchanged on the simulated nodes; what the library answers is
the same state file the ``nvidia-smi`` stand-in reads, so the two never disagree.

Why Go over the node's state rather than go-nvml's mock servers: the mock servers model DGX boxes of their own,
while the simulated fleet's GPUs come from its node profiles (models, MIG layouts, faults) that nvidia-smi,
doctor's facts and the plugin must all see alike.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from gpunode.errors import GpunodeError
from gpunode_sim.build.gobuild import build_into, finished, module_path, run_go

NVML_MODULE = "github.com/NVIDIA/go-nvml"
NVML_VERSION = "v0.13.4-1"  # the header's source: NVIDIA's go-nvml, from the Go module proxy
LIBRARY = "libnvidia-ml.so.1"
# the SONAME the real library has: ldconfig (NVIDIA's update-ldcache hook in a CDI container) makes the
# libnvidia-ml.so.1 link from it
LIBRARY_LDFLAGS = f"-s -w -extldflags=-Wl,-soname,{LIBRARY}"
SMI = "nvidia-smi"  # the native nvidia-smi (package smi): -L inside containers, the node's stand-in elsewhere
SOURCES = Path(__file__).resolve().parent / "nvml_mock"
Say = Callable[[str], None]


def _sources() -> list[Path]:
    """The Go and C files of the library, its state package and the native nvidia-smi, sorted."""
    return sorted(p for p in SOURCES.rglob("*") if p.suffix in (".go", ".c"))


def _digest() -> str:
    hashed = hashlib.sha256((NVML_VERSION + LIBRARY_LDFLAGS).encode())
    for path in _sources():
        hashed.update(str(path.relative_to(SOURCES)).encode() + b"\0" + path.read_bytes())
    return hashed.hexdigest()[:12]


def folder(cache: Path) -> Path:
    return cache / f"nvml-mock-{_digest()}"


def built(cache: Path) -> Path | None:
    """The cached library when a finished build of these sources is there, else None."""
    path = folder(cache) / LIBRARY
    return path if finished(folder(cache), ()) and path.is_file() else None


def require(cache: Path) -> Path:
    found = built(cache)
    if found is None:
        raise GpunodeError(f"the simulated nodes' {LIBRARY} is not built in {cache}",
                           "run 'gpunode sim build' (or scripts/setup-host) once on this machine")
    return found


def _finish(staging: Path, work: Path, log: Path) -> None:
    """Drop cgo's export header (not part of NVML) and build the native nvidia-smi, static (no cgo: it runs in
    any container, glibc or not)."""
    (staging / "libnvidia-ml.so.h").unlink(missing_ok=True)
    run_go(["build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / SMI), "./smi"], work, log, False)


def ensure_built(cache: Path, say: Say) -> Path:
    """Build the library unless this source's build is cached; return its path."""
    found = built(cache)
    if found is not None:
        return found
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        raise GpunodeError(f"building the simulated {LIBRARY} needs a C compiler (cgo)", "apt-get install gcc")
    started = time.monotonic()
    work = cache / "nvml-mock-build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "build.log"
    log.write_text("")
    header = Path(module_path(NVML_MODULE, NVML_VERSION)) / "pkg" / "nvml" / "nvml.h"
    if not header.is_file():
        raise GpunodeError(f"{NVML_MODULE} {NVML_VERSION} has no pkg/nvml/nvml.h", f"see {header.parent}")
    shutil.copyfile(header, work / "nvml.h")
    for path in _sources():
        (work / path.relative_to(SOURCES)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, work / path.relative_to(SOURCES))
    (work / "go.mod").write_text("module gpunode.local/nvmlmock\n\ngo 1.22\n")
    say(f"building the simulated {LIBRARY} against {NVML_MODULE} {NVML_VERSION}'s nvml.h (log: {log})")
    target = folder(cache)
    seconds = build_into(target, [(LIBRARY, ".", LIBRARY_LDFLAGS)], work, log,
                         {"nvml_h": f"{NVML_MODULE} {NVML_VERSION}"}, started, cgo=True,
                         build_flags=("-buildmode=c-shared",),
                         # cgo's export header is not part of NVML; the native nvidia-smi beside the library
                         extra=lambda staging: _finish(staging, work, log))
    say(f"{LIBRARY} built in {seconds:.0f} s: {target}")
    return target / LIBRARY
