"""Building real components of the simulated fleet from Go modules, with the machine's Go.

A small build module of ours requires the upstream module at one version (and
pins what must be pinned); ``go mod tidy`` resolves the rest from the module
proxy, ``go build`` makes the binary. Output goes to a log next to the build
module; a failure raises with the log's tail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpunode.errors import GpunodeError

STAMP = "build.json"  # written last: a folder without it is an unfinished build
TOOLS_GO = """//go:build tools

// Package {package} pins what gpunode's simulated fleet builds.
package {package}

import (
{imports}
)
"""


def go_binary() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise GpunodeError("building the simulated fleet's components needs Go (1.25 or newer) on PATH",
                           "install Go, then run 'gpunode sim build' again")
    return go


def go_env(cgo: bool = False) -> dict[str, str]:
    return {**os.environ, "CGO_ENABLED": "1" if cgo else "0", "GOFLAGS": "-mod=mod -buildvcs=false",
            "GOTOOLCHAIN": "local"}


def run_go(args: list[str], cwd: Path, log: Path, cgo: bool = False) -> None:
    """``go ARGS`` in ``cwd``, its output appended to ``log``; GpunodeError with the log's tail on failure."""
    with log.open("a") as handle:
        handle.write(f"$ go {' '.join(args)}\n")
        handle.flush()
        result = subprocess.run([go_binary(), *args], cwd=cwd, env=go_env(cgo), stdout=handle,
                                stderr=subprocess.STDOUT, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise GpunodeError(f"go {' '.join(args[:3])} failed (exit {result.returncode}):\n{tail}",
                           f"the whole log is {log}")


def _download(module: str, version: str, key: str) -> str:
    download = subprocess.run([go_binary(), "mod", "download", "-json", f"{module}@{version}"], capture_output=True,
                              text=True, check=False, env=go_env())
    try:
        return str(json.loads(download.stdout)[key])
    except (ValueError, KeyError) as error:
        raise GpunodeError(f"cannot fetch {module} {version}: {download.stdout.strip()[-400:]}"
                           f"{download.stderr.strip()[-400:]}", "check that the Go module proxy is reachable"
                           ) from error


def module_gomod(module: str, version: str) -> str:
    """The go.mod file of ``module`` at ``version``, fetched through the module proxy."""
    return Path(_download(module, version, "GoMod")).read_text()


def module_path(module: str, version: str) -> str:
    """The folder of ``module`` at ``version`` in the module cache (downloaded if need be)."""
    return _download(module, version, "Dir")


def write_build_module(work: Path, gomod: str, packages: list[str], package: str = "build") -> None:
    """Our go.mod and a tools.go importing ``packages``, in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(gomod)
    (work / "go.sum").unlink(missing_ok=True)
    imports = "\n".join(f'\t_ "{p}"' for p in packages)
    (work / "tools.go").write_text(TOOLS_GO.format(package=package, imports=imports))


def finished(folder: Path, names: tuple[str, ...]) -> bool:
    """Whether ``folder`` holds a finished build of every binary in ``names``."""
    return (folder / STAMP).is_file() and all(os.access(folder / name, os.X_OK) for name in names)


def build_into(folder: Path, targets: list[tuple[str, str, str]], work: Path, log: Path, stamp: dict,
               started: float, say: Callable[[str], None] | None = None, cgo: bool = False,
               extra: Callable[[Path], None] | None = None, build_flags: tuple[str, ...] = ()) -> float:
    """Build each (binary, package, ldflags) of ``targets`` in the build module ``work`` into ``folder``
    (``build_flags`` go to every ``go build``: ``-buildmode=c-shared`` for a library).

    The folder appears whole or not at all: built aside, stamped (``stamp`` and the seconds since
    ``started``), then put in place. Returns those seconds.
    """
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, package, ldflags in targets:
        step = time.monotonic()
        if say:
            say(f"go build {name}")
        run_go(["build", "-trimpath", *build_flags, "-ldflags", ldflags, "-o", str(staging / name), package], work,
               log, cgo)
        if say:
            say(f"  {name}: {time.monotonic() - step:.0f} s")
    if extra is not None:  # what is not a go build (a C program of the same module) lands in the same folder
        extra(staging)
    seconds = time.monotonic() - started
    (staging / STAMP).write_text(json.dumps({**stamp, "seconds": round(seconds)}) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return seconds
