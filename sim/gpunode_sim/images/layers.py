"""The read-only images every simulated node shares: the Debian base and the runtime layers.

* ``base``: ``debootstrap --variant=minbase`` of Debian 12 with sshd, python3,
  systemd's unit files and the few tools a node needs.
* ``sim``: the systemd stand-in (patched docker-systemctl-replacement as
  ``systemctl``/PID 1, real ``systemctl`` diverted), a preset that enables
  services on install as Debian does, sshd settings, no shared host keys.
* ``containerd`` and ``docker``: Debian's containerd (and docker.io on top), so
  nodes come up with their runtime installed, as Kubernetes nodes do.

Each is built once, in a private mount namespace, then cached as a zstd
tarball under the cache folder, so fresh clones and CI runs only extract it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path

import tomlkit

from gpunode.errors import GpunodeError
from gpunode.image.mirror import debian_mirror
from gpunode_sim.access.ssh import SIM_USER
from gpunode_sim.guest import systemctl
from gpunode_sim.host.hostcmd import run
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.spec.profiles import DEFAULT_OS, OPERATING_SYSTEMS

SUITE = OPERATING_SYSTEMS[DEFAULT_OS]
BASE_PACKAGES = ("openssh-server", "python3", "gnupg", "ca-certificates", "curl", "procps", "iproute2",
                 "kmod", "systemd", "less", "iputils-ping", "sudo")
LAYER_ORDER = ("sim", "containerd", "docker")
LAYER_PACKAGES = {"sim": (), "containerd": ("containerd", "runc", "containernetworking-plugins"),
                  "docker": ("docker.io",)}
# What a release packages apart: Debian unstable's docker.io 28 only recommends its client (docker-cli), which
# an install with recommends (apt's default) brings; the layers are built without recommends.
SUITE_PACKAGES = {("sid", "docker"): ("docker-cli",)}
RUNTIME_LAYERS = {"containerd": ("containerd", "sim"), "docker": ("docker", "containerd", "sim")}
# A node OS made of another one's image plus a layer of its own: (that OS, the layer)
OS_LAYERS = {"rpm-standin": ("debian12", "dnf")}
RPM_OS_RELEASE = """PRETTY_NAME="gpunode rpm stand-in (Debian 12 userspace, real dnf and rpm)"
NAME="gpunode rpm stand-in"
ID=gpunode-rpm-standin
ID_LIKE="rhel centos fedora"
VERSION_ID="9"
"""
REFUSING_APT = """#!/bin/sh
echo "$(basename "$0"): this simulated node stands in for an rpm-family host: it installs packages with dnf" >&2
exit 100
"""
SIM_LIB = "/usr/lib/gpunode-sim"

SYSTEMCTL_WRAPPER = f"""#!/bin/sh
# gpunode simulated node: systemctl is docker-systemctl-replacement (see {SIM_LIB}).
# Debian's helpers pass --root=/, which it does not take. It runs as a module so its
# precompiled bytecode is used (compiling its 7,000 lines took 120 ms per call).
for arg do shift; [ "$arg" = "--root=/" ] || set -- "$@" "$arg"; done
exec /usr/bin/python3 -c 'import runpy, sys; sys.path.insert(0, "{SIM_LIB}"); sys.argv[0] = "systemctl"; \
runpy.run_module("systemctl3", run_name="__main__", alter_sys=True)' "$@"
"""
JOURNALCTL_WRAPPER = f"""#!/bin/sh
exec /usr/bin/python3 {SIM_LIB}/journalctl3.py "$@"
"""
SIM_INIT = f"""#!/bin/sh
# PID 1 of a simulated node: start every enabled unit, reap orphans, stop cleanly on SIGTERM.
exec /usr/bin/python3 {SIM_LIB}/systemctl3.py init
"""
# The operator's account on every node, as production fleets have it: a non-root user with passwordless sudo
# (root's SSH login is refused). Its password is for the tests in which sudo asks for one (a sudoers file without
# NOPASSWD); SSH never takes a password.
SIM_UID = 1000
SIM_USER_PASSWORD = "gpunode-sim-sudo"
SUDOERS = f"""# gpunode simulated node: the operator may run anything as root, without a password
{SIM_USER} ALL=(ALL:ALL) NOPASSWD: ALL
"""
SSHD_CONF = """# gpunode simulated node
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
HostKey /etc/ssh/ssh_host_ed25519_key
MaxStartups 100:30:200
MaxSessions 100
"""
DOCKER_DROPIN = """# gpunode simulated node: no socket activation without systemd, so listen on the unix socket.
[Service]
ExecStart=
ExecStart=/usr/sbin/dockerd -H unix:///run/docker.sock --containerd=/run/containerd/containerd.sock $DOCKER_OPTS
"""
APT_CONF = 'APT::Keep-Downloaded-Packages "false";\n'
# The pod network of a node: one bridge inside the node's own network namespace (pods of different nodes never
# talk to each other here; there is no kube-proxy). Debian's containernetworking-plugins live in /usr/lib/cni.
CNI_CONFLIST = """{
  "cniVersion": "1.0.0",
  "name": "gpunode-pods",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}}
  ]
}
"""
# What an admin sets in containerd's CRI plugin for the kubelet on these nodes: the pause image the kubelet
# expects (built locally, never pulled), and no oom_score_adj below containerd's own (this VM lacks
# CAP_SYS_RESOURCE, so runc cannot give a sandbox -998).
CRI_SETTINGS = {"sandbox_image": "registry.k8s.io/pause:3.10.1", "restrict_oom_score_adj": True}


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def _layer_digest(name: str, suite: str = SUITE) -> str:
    parents = [_layer_digest(p, suite) for p in RUNTIME_LAYERS.get(name, ())[1:]] if name in RUNTIME_LAYERS else []
    extra: tuple[object, ...] = ()
    if name == "sim":
        extra = (systemctl.RELEASE, systemctl.PATCHES, SYSTEMCTL_WRAPPER, SIM_INIT, SSHD_CONF, APT_CONF, SIM_USER,
                 SIM_UID, SIM_USER_PASSWORD, SUDOERS)
    if name == "docker":
        extra = (DOCKER_DROPIN,)
    if name == "containerd":
        extra = (CNI_CONFLIST, sorted(CRI_SETTINGS.items()))
    return _digest(name, layer_packages(name, suite), parents, extra, _base_digest(suite))


def layer_packages(name: str, suite: str = SUITE) -> tuple[str, ...]:
    """The packages layer ``name`` installs on ``suite``."""
    return LAYER_PACKAGES[name] + SUITE_PACKAGES.get((suite, name), ())


def _base_digest(suite: str = SUITE) -> str:
    return _digest(suite, BASE_PACKAGES)


def base_rootfs(paths: SimPaths, os_name: str) -> Path:
    """The unpacked base image of ``os_name`` (Debian 12's keeps the folder it always had)."""
    if os_name in OS_LAYERS:
        return base_rootfs(paths, OS_LAYERS[os_name][0])
    return paths.base_rootfs if os_name == DEFAULT_OS else paths.state / f"base-{os_name}" / "rootfs"


def layer_dir(paths: SimPaths, os_name: str, layer: str) -> Path:
    """The unpacked ``layer`` built on ``os_name``'s base."""
    if os_name in OS_LAYERS and layer != OS_LAYERS[os_name][1]:
        return layer_dir(paths, OS_LAYERS[os_name][0], layer)
    return paths.layer(layer if os_name == DEFAULT_OS else f"{os_name}-{layer}")


def _cache_name(kind: str, os_name: str) -> str:
    return kind if os_name == DEFAULT_OS else f"{kind}-{os_name}"


def _extract(tarball: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    run(["tar", "--zstd", "--xattrs", "--xattrs-include=trusted.*", "--numeric-owner", "-xpf", str(tarball),
         "-C", str(target)], what=f"extracting {tarball.name}")


def _archive(source: Path, tarball: Path) -> None:
    tarball.parent.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_suffix(".partial")
    run(["tar", "--zstd", "--xattrs", "--xattrs-include=trusted.*", "--numeric-owner", "-cpf", str(partial),
         "-C", str(source), "."], what=f"caching {tarball.name}")
    os.replace(partial, tarball)


def _cached(paths: SimPaths, name: str, digest: str, target: Path, build: Callable[[Path], None],
            say: Callable[[str], None]) -> None:
    """Make ``target`` hold image ``name`` at ``digest``: as it is, from the cache, or built anew."""
    stamp = target.parent / f".{target.name}.digest"
    if target.is_dir() and stamp.exists() and stamp.read_text() == digest:
        return
    tarball = paths.cache / f"{name}-{digest}.tar.zst"
    if tarball.exists():
        say(f"extracting cached {name} image")
        _extract(tarball, target)
    else:
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        build(target)
        say(f"caching {name} image as {tarball}")
        _archive(target, tarball)
    stamp.write_text(digest)


def _debootstrap(target: Path, suite: str, say: Callable[[str], None]) -> None:
    mirror = os.environ.get("GPUNODE_DEBIAN_MIRROR") or debian_mirror()
    say(f"debootstrap {suite} (minbase) from the host's Debian mirror: about a minute, once per machine")
    run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, str(target), mirror],
        what="debootstrap of the node base image", timeout=1800)
    for leftover in (target / "var/cache/apt/archives").glob("*.deb"):
        leftover.unlink()


def _chroot_build(paths: SimPaths, os_name: str, name: str, upper: Path, script: str,
                  below: tuple[str, ...] | None = None) -> None:
    """Run ``script`` in a chroot of the layers below ``name`` (``below``, topmost first; by default its runtime
    chain's) with ``upper`` taking the writes."""
    chain = below if below is not None else RUNTIME_LAYERS.get(name, (name,))[1:]
    lowers = [layer_dir(paths, os_name, layer) for layer in chain]
    lowers.append(base_rootfs(paths, os_name))
    work = upper.parent / f".{name}.work"
    merged = upper.parent / f".{name}.merged"
    for folder in (work, merged):
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
    lowerdir = ":".join(str(p) for p in lowers)
    wrapper = textwrap.dedent(f"""\
        set -e
        mount -t overlay overlay -o lowerdir={lowerdir},upperdir={upper},workdir={work} {merged}
        mount -t proc proc {merged}/proc
        mount --rbind /dev {merged}/dev
        mount -t tmpfs tmpfs {merged}/run
        cp /etc/resolv.conf {merged}/etc/resolv.conf.gpunode-build
        mount --bind /etc/resolv.conf {merged}/etc/resolv.conf
        printf '#!/bin/sh\\nexit 101\\n' > {merged}/usr/sbin/policy-rc.d
        chmod 755 {merged}/usr/sbin/policy-rc.d
        chroot {merged} /bin/sh -e -c "$GPUNODE_LAYER_SCRIPT"
        rm -f {merged}/usr/sbin/policy-rc.d {merged}/etc/resolv.conf.gpunode-build
        """)
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
           "LC_ALL": "C.UTF-8", "GPUNODE_LAYER_SCRIPT": script}
    try:
        run(["unshare", "--mount", "--propagation", "private", "sh", "-c", wrapper],
            what=f"building the {name} layer", env=env, timeout=1800)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(merged, ignore_errors=True)
    # whiteouts of files the build itself created and removed are not part of the layer
    for path in ("etc/resolv.conf.gpunode-build", "usr/sbin/policy-rc.d"):
        candidate = upper / path
        if candidate.is_char_device() or candidate.exists():
            candidate.unlink()


def _write(root: Path, path: str, text: str, mode: int = 0o644) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_char_device() or target.is_symlink():
        target.unlink()  # an overlay whiteout or a link left by the build
    target.write_text(text)
    target.chmod(mode)


def _build_sim_layer(paths: SimPaths, os_name: str, upper: Path) -> None:
    sources = systemctl.fetch(paths.cache / "wheels")
    for file_name, text in sources.items():
        _write(upper, f"{SIM_LIB}/{file_name}", text, 0o755)
    script = f"""
        for path in /usr/bin/systemctl /bin/systemctl /usr/bin/journalctl /bin/journalctl; do
          dpkg-divert --local --no-rename --divert "$path.distrib" --add "$path" >/dev/null
        done
        mv /usr/bin/systemctl /usr/bin/systemctl.distrib
        mv /usr/bin/journalctl /usr/bin/journalctl.distrib
        rm -f /etc/ssh/ssh_host_*
        useradd --create-home --shell /bin/bash --uid {SIM_UID} --user-group {SIM_USER}
        echo '{SIM_USER}:{SIM_USER_PASSWORD}' | chpasswd
        : > /etc/machine-id
        rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
        python3 -m compileall -q {SIM_LIB}
    """
    _chroot_build(paths, os_name, "sim", upper, script)
    _write(upper, "/usr/bin/systemctl", SYSTEMCTL_WRAPPER, 0o755)
    _write(upper, "/usr/bin/journalctl", JOURNALCTL_WRAPPER, 0o755)
    _write(upper, "/usr/local/sbin/sim-init", SIM_INIT, 0o755)
    _write(upper, "/usr/lib/systemd/system-preset/99-gpunode-sim.preset", "enable *\n")
    _write(upper, "/etc/ssh/sshd_config.d/gpunode-sim.conf", SSHD_CONF)
    _write(upper, f"/etc/sudoers.d/{SIM_USER}", SUDOERS, 0o440)
    _write(upper, "/etc/apt/apt.conf.d/99gpunode-sim", APT_CONF)


def _build_runtime_layer(paths: SimPaths, os_name: str, name: str, upper: Path) -> None:
    # Debian unstable's Release file carries a Valid-Until a few days ahead; a mirror that is a snapshot
    # (as a package proxy may serve) is past it. The archive's signature is still checked.
    packages = " ".join(layer_packages(name, OPERATING_SYSTEMS[os_name]))
    script = f"""
        apt-get update -qq -o Acquire::Check-Valid-Until=false
        apt-get install -y -qq --no-install-recommends {packages} >/dev/null
        apt-get clean
        rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
    """
    _chroot_build(paths, os_name, name, upper, script)
    if name == "docker":
        _write(upper, "/etc/systemd/system/docker.service.d/gpunode-sim.conf", DOCKER_DROPIN)
    if name == "containerd":
        _write(upper, "/etc/cni/net.d/10-gpunode-pods.conflist", CNI_CONFLIST)
        _set_cri_settings(upper / "etc/containerd/config.toml")


def _build_os_layer(paths: SimPaths, os_name: str, runtime: str, upper: Path) -> None:
    """The layer that makes ``os_name`` of another OS's image: for rpm-standin, the real dnf, rpm and dnf's
    versionlock plugin from Debian, an os-release of the RHEL family, and apt refusing to be used."""
    script = """
        apt-get update -qq -o Acquire::Check-Valid-Until=false
        apt-get install -y -qq --no-install-recommends dnf dnf-plugins-core rpm >/dev/null
        apt-get clean
        rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
        mkdir -p /etc/yum.repos.d /etc/pki/rpm-gpg /etc/dnf/vars
        rm -f /etc/os-release
    """
    _chroot_build(paths, os_name, OS_LAYERS[os_name][1], upper, script, RUNTIME_LAYERS[runtime])
    _write(upper, "/etc/os-release", RPM_OS_RELEASE)
    _write(upper, "/usr/lib/os-release", RPM_OS_RELEASE)
    _write(upper, "/etc/dnf/vars/releasever", "9\n")  # dnf reads it from the rpm database, which holds no release
    for tool in ("apt-get", "apt"):
        _write(upper, f"/usr/local/bin/{tool}", REFUSING_APT, 0o755)


def _set_cri_settings(config: Path) -> None:
    """containerd's packaged config with CRI_SETTINGS added where its schema keeps them, comments and order kept.

    Schema 3 (containerd 2.x) splits the CRI plugin: the sandbox image is
    ``io.containerd.cri.v1.images``' ``pinned_images.sandbox``, the runtime settings are in
    ``io.containerd.cri.v1.runtime``. A package without a config gets containerd's schema for
    its generation from the packaged default (``containerd config default``), written by the caller.
    """
    document = tomlkit.parse(config.read_text())
    plugins = document.setdefault("plugins", tomlkit.table())
    if int(document.get("version", 1)) >= 3:
        images = plugins.setdefault("io.containerd.cri.v1.images", tomlkit.table())
        images.setdefault("pinned_images", tomlkit.table())["sandbox"] = CRI_SETTINGS["sandbox_image"]
        runtime = plugins.setdefault("io.containerd.cri.v1.runtime", tomlkit.table())
        runtime["restrict_oom_score_adj"] = CRI_SETTINGS["restrict_oom_score_adj"]
    else:
        cri = plugins.setdefault("io.containerd.grpc.v1.cri", tomlkit.table())
        for key, value in CRI_SETTINGS.items():
            cri[key] = value
    config.write_text(tomlkit.dumps(document))


def prepare_images(paths: SimPaths, images: set[tuple[str, str]], say: Callable[[str], None]) -> None:
    """Make the base images and layers the given (os, runtime) pairs need ready, from cache when possible, and the
    bastion's (the Debian 12 base and sim layer), which every fleet has whatever its nodes run."""
    plain = {(OS_LAYERS[os_name][0] if os_name in OS_LAYERS else os_name, runtime) for os_name, runtime in images}
    wanted: dict[str, set[str]] = {DEFAULT_OS: {"sim"}}  # the bastion's
    for image_os, runtime in plain:
        wanted.setdefault(image_os, set()).update(RUNTIME_LAYERS[runtime])
    for os_name in sorted(wanted):
        suite = OPERATING_SYSTEMS[os_name]
        _cached(paths, f"base-{suite}", _base_digest(suite), base_rootfs(paths, os_name),
                lambda target, suite=suite: _debootstrap(target, suite, say), say)
        needed = wanted[os_name]
        for layer in LAYER_ORDER:
            if layer not in needed:
                continue

            def build(target: Path, layer: str = layer, os_name: str = os_name) -> None:
                say(f"building the {layer} layer on {os_name} (once per machine)")
                if layer == "sim":
                    _build_sim_layer(paths, os_name, target)
                else:
                    _build_runtime_layer(paths, os_name, layer, target)

            _cached(paths, _cache_name(f"layer-{layer}", os_name), _layer_digest(layer, suite),
                    layer_dir(paths, os_name, layer), build, say)
    for os_name, runtime in sorted(images):
        if os_name not in OS_LAYERS:
            continue
        parent, layer = OS_LAYERS[os_name]

        def build_os(target: Path, os_name: str = os_name, runtime: str = runtime, layer: str = layer) -> None:
            say(f"building the {layer} layer of {os_name} (once per machine)")
            _build_os_layer(paths, os_name, runtime, target)

        _cached(paths, f"layer-{os_name}-{layer}", _os_layer_digest(os_name, runtime),
                layer_dir(paths, os_name, layer), build_os, say)


def _os_layer_digest(os_name: str, runtime: str) -> str:
    parent, layer = OS_LAYERS[os_name]
    return _digest(os_name, layer, _layer_digest(RUNTIME_LAYERS[runtime][0], OPERATING_SYSTEMS[parent]),
                   RPM_OS_RELEASE, REFUSING_APT, "dnf dnf-plugins-core rpm")


def lower_dirs(paths: SimPaths, os_name: str, runtime: str) -> list[Path]:
    """The read-only layers of a node with ``runtime`` on ``os_name``, topmost first."""
    if runtime not in RUNTIME_LAYERS:
        raise GpunodeError(f"no image for runtime {runtime!r}")
    own = [layer_dir(paths, os_name, OS_LAYERS[os_name][1])] if os_name in OS_LAYERS else []
    return ([paths.layer("tools")] + own + [layer_dir(paths, os_name, layer) for layer in RUNTIME_LAYERS[runtime]]
            + [base_rootfs(paths, os_name)])
