"""The real Kubernetes control plane for the simulated fleet, built once per machine from Go modules.

``k8s.io/kubernetes`` cannot be ``go install``ed: its go.mod replaces the
staging modules (k8s.io/api, client-go, ...) with folders of its own source tree.
So a small build module of ours requires it at one pinned version and replaces
every staging module with its published ``v0.Y.Z``, read from that go.mod. etcd
comes from the same module graph (``go.etcd.io/etcd/server/v3``, the version the
pinned Kubernetes requires). The binaries land in the machine's cache
(``/var/cache/gpunode/kubernetes-vX.Y.Z/``); a later run finds them there.

The nodes' kubelet is another release: 1.35 is the last that supports
containerd 1.x (Debian 12 ships 1.6.20) and cgroup v1 (with ``failCgroupV1:
false``), and a kubelet two minors older than the API server is a supported
skew. It is built the same way, with the pod sandbox's ``pause`` compiled from
the same module's C source (``build/pause/linux/pause.c``) by the host's gcc,
statically, as upstream's Makefile does.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpunode.errors import GpunodeError
from gpunode_sim.build.gobuild import build_into, finished, module_gomod, module_path, run_go, write_build_module

KUBERNETES_VERSION = "1.37.2"
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
ETCD_PACKAGE = "go.etcd.io/etcd/server/v3"
BINARIES = (*KUBE_COMMANDS, "etcd")
KUBELET_VERSION = "1.35.4"
PAUSE_VERSION = "3.10.1"  # build/pause/Makefile's TAG at KUBELET_VERSION
NODE_BINARIES = ("kubelet", "pause")
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
                           "pin another KUBERNETES_VERSION in gpunode_sim.build.kubernetes")
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
    targets = [(c, f"k8s.io/kubernetes/cmd/{c}", f"-s -w {version_ldflags(version)}") for c in KUBE_COMMANDS]
    targets.append(("etcd", ETCD_PACKAGE, "-s -w"))
    folder = binaries_dir(cache, version)
    seconds = build_into(folder, targets, work, log, {
        "version": version, "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, started, say)
    say(f"Kubernetes v{version} built in {seconds / 60:.1f} min: {folder}")
    return folder


def version_ldflags(version: str) -> str:
    minor = version.split(".")[1]
    return " ".join(f"-X {pkg}.{key}={value}" for pkg in ("k8s.io/component-base/version",
                                                          "k8s.io/client-go/pkg/version")
                    for key, value in (("gitVersion", f"v{version}"), ("gitMajor", "1"), ("gitMinor", minor),
                                       ("gitTreeState", "clean")))


def node_binaries_dir(cache: Path, version: str = KUBELET_VERSION) -> Path:
    return cache / f"kubelet-v{version}"


def node_built(cache: Path, version: str = KUBELET_VERSION) -> Path | None:
    """The folder with the nodes' kubelet and pause when a finished build is cached, else None."""
    folder = node_binaries_dir(cache, version)
    return folder if finished(folder, NODE_BINARIES) else None


def require_node(cache: Path) -> Path:
    folder = node_built(cache)
    if folder is None:
        raise GpunodeError(f"the nodes' kubelet v{KUBELET_VERSION} is not built in {node_binaries_dir(cache)}",
                           "run 'gpunode sim build' (or scripts/setup-host) once on this machine")
    return folder


def _compile_pause(module_dir: Path, target: Path, log: Path) -> None:
    source = module_dir / "build/pause/linux/pause.c"
    if not source.is_file():
        raise GpunodeError(f"{source} is missing from the k8s.io/kubernetes module", f"see {log}")
    argv = ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{PAUSE_VERSION}-gpunode", "-o", str(target),
            str(source)]
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(argv)}\n")
        handle.flush()
        result = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, check=False)
    if result.returncode != 0:
        raise GpunodeError(f"compiling pause.c failed (exit {result.returncode})",
                           f"install gcc and libc6-dev (scripts/setup-host does); the log is {log}")


def ensure_node_built(cache: Path, say: Say, version: str = KUBELET_VERSION) -> Path:
    """Build the nodes' kubelet and pause unless cached; return their folder."""
    folder = node_built(cache, version)
    if folder is not None:
        return folder
    started = time.monotonic()
    work = cache / f"kubelet-build-v{version}"
    log = work / "build.log"
    work.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    say(f"building the nodes' kubelet v{version} and pause {PAUSE_VERSION} from the Go module proxy, once per "
        f"machine; log: {log}")
    gomod = module_gomod("k8s.io/kubernetes", f"v{version}")
    write_build_module(work, build_module(version, gomod), ["k8s.io/kubernetes/cmd/kubelet"], "kubeletbuild")
    run_go(["mod", "tidy"], work, log)
    module_dir = Path(module_path("k8s.io/kubernetes", f"v{version}"))
    targets = [("kubelet", "k8s.io/kubernetes/cmd/kubelet", f"-s -w {version_ldflags(version)}")]

    def pause(staging: Path) -> None:
        _compile_pause(module_dir, staging / "pause", log)

    seconds = build_into(folder := node_binaries_dir(cache, version), targets, work, log, {
        "version": version, "pause": PAUSE_VERSION,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, started, say, extra=pause)
    say(f"kubelet v{version} built in {seconds / 60:.1f} min: {folder}")
    return folder
