"""The real Kubernetes control plane for the simulated fleet, built once per machine from Go modules.

``k8s.io/kubernetes`` cannot be ``go install``ed: its go.mod replaces the
staging modules (k8s.io/api, client-go, ...) with folders of its own source tree.
So a small build module of ours requires it at one pinned version and replaces
every staging module with its published ``v0.Y.Z``, read from that go.mod. etcd
comes from the same module graph (``go.etcd.io/etcd/server/v3``, the version the
pinned Kubernetes requires). The binaries land in the machine's cache
(``/var/cache/gpunode/kubernetes-vX.Y.Z/``); a later run finds them there.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from gpunode.errors import GpunodeError
from gpunode.sim.gobuild import build_into, finished, module_gomod, run_go, write_build_module

KUBERNETES_VERSION = "1.37.2"
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
ETCD_PACKAGE = "go.etcd.io/etcd/server/v3"
BINARIES = (*KUBE_COMMANDS, "etcd")
Say = Callable[[str], None]


def binaries_dir(cache: Path, version: str = KUBERNETES_VERSION) -> Path:
    return cache / f"kubernetes-v{version}"


def built(cache: Path, version: str = KUBERNETES_VERSION) -> Path | None:
    """The folder with every binary when a finished build is cached, else None."""
    folder = binaries_dir(cache, version)
    return folder if finished(folder, BINARIES) else None


def require(cache: Path) -> Path:
    """The cached binaries, or a clear error saying how to build them."""
    folder = built(cache)
    if folder is None:
        raise GpunodeError(f"the Kubernetes control plane v{KUBERNETES_VERSION} is not built in "
                           f"{binaries_dir(cache)}", "run 'gpunode sim build' (or scripts/setup-host) once "
                           "on this machine; it takes about half an hour on 2 cores")
    return folder


def build_module(version: str, kubernetes_gomod: str) -> str:
    """Our go.mod: require k8s.io/kubernetes, replace each staging module with its published v0.Y.Z."""
    minor_patch = version.split(".", 1)[1]
    staging = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", kubernetes_gomod, re.MULTILINE)))
    if not staging:
        raise GpunodeError(f"k8s.io/kubernetes v{version}'s go.mod names no staging modules",
                           "pin another KUBERNETES_VERSION in gpunode.sim.kubernetes")
    go = re.search(r"^go (\d+\.\d+)", kubernetes_gomod, re.MULTILINE)
    lines = ["module gpunode.local/kubebuild", "", f"go {go.group(1) if go else '1.25'}", "",
             f"require k8s.io/kubernetes v{version}", "", "replace ("]
    lines += [f"\t{module} => {module} v0.{minor_patch}" for module in staging]
    lines.append(")")
    return "\n".join(lines) + "\n"


def ensure_built(cache: Path, say: Say, version: str = KUBERNETES_VERSION) -> Path:
    """Build the control plane's binaries unless cached; return their folder."""
    folder = built(cache, version)
    if folder is not None:
        return folder
    started = time.monotonic()
    work = cache / f"kubernetes-build-v{version}"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "build.log"
    log.write_text("")
    say(f"building Kubernetes v{version} (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl) and "
        f"etcd from the Go module proxy, once per machine; log: {log}")
    gomod = module_gomod("k8s.io/kubernetes", f"v{version}")
    write_build_module(work, build_module(version, gomod),
                       [ETCD_PACKAGE, *(f"k8s.io/kubernetes/cmd/{c}" for c in KUBE_COMMANDS)], "kubebuild")
    say("resolving modules (go mod tidy)")
    run_go(["mod", "tidy"], work, log)
    minor = version.split(".")[1]
    version_flags = " ".join(f"-X {pkg}.{key}={value}" for pkg in ("k8s.io/component-base/version",
                                                           "k8s.io/client-go/pkg/version")
                     for key, value in (("gitVersion", f"v{version}"), ("gitMajor", "1"), ("gitMinor", minor),
                                        ("gitTreeState", "clean")))
    targets = [(c, f"k8s.io/kubernetes/cmd/{c}", f"-s -w {version_flags}") for c in KUBE_COMMANDS]
    targets.append(("etcd", ETCD_PACKAGE, "-s -w"))
    folder = binaries_dir(cache, version)
    seconds = build_into(folder, targets, work, log, {
        "version": version, "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, started, say)
    say(f"Kubernetes v{version} built in {seconds / 60:.1f} min: {folder}")
    return folder
