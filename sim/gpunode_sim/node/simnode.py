"""One simulated node: its files on the host, its boot plan, and its processes.

A node is a folder under the fleet's state (upper and work folders of its
overlay root, real-disk data folders for containerd/docker/kubelet, its boot
plan and console log) plus a handful of host processes: the namespaced init,
the socat forwarders that connect its private network to the host's loopback
(sshd on 22 as a socket the fleet's bastion forwards to, the kubelet's port 10250 at the node's address; the local
repository at the node's 127.0.0.1:8080 and the API server at its own address
inside the node), and the node's kubelet.

On containerd nodes the kubelet is the real one (v1.35, built by ``gpunode sim
build``), a ``kubelet.service`` the node's init starts, with the node's
containerd as its CRI runtime. A real kubelet refuses a loopback node IP, so the
node also has ``10.230.<block>.<n>`` on its own loopback device (the API server
reaches it through ``gpunode_sim.cluster.egress``). Docker nodes run the simulator's
node agent (``gpunode_sim.guest.kubelet_agent``) instead: Kubernetes removed its docker
support, and cri-dockerd is not built here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomlkit
import yaml

from gpunode.image.oci import archive_digest
from gpunode_sim.access.ssh import SIM_USER, ensure_key
from gpunode_sim.build.nvml_build import LIBRARY as NVML_LIBRARY
from gpunode_sim.build.nvml_build import SMI as NVIDIA_SMI
from gpunode_sim.cluster.controlplane import APISERVER_PORT, node_credentials
from gpunode_sim.cluster.egress import node_address
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.host.processes import alive, signal_group, signal_pid
from gpunode_sim.images.layers import SIM_UID, layer_dir, lower_dirs
from gpunode_sim.registry.server import NAME as REGISTRY_NAME
from gpunode_sim.registry.server import PORT as REGISTRY_PORT
from gpunode_sim.registry.server import node_side_address as registry_node_address
from gpunode_sim.spec.gpus import driver_state
from gpunode_sim.spec.profiles import NodeSpec

NVIDIA_MAJOR, UVM_MAJOR, CAPS_MAJOR = 195, 237, 236  # the last two are dynamic majors
DATA_DIRS = ("var/lib/containerd", "var/lib/docker", "var/lib/kubelet", "var/lib/gpunode-sim")
REBOOT_REQUEST = "reboot-requested"  # written by the node's reboot stand-in into data/gpunode-sim/
KUBELET_PORT = 10250
REPO_PORT = 8080
CERTS_D = "/etc/containerd/certs.d"  # containerd's hosts.toml folder, as containerd's docs name it
DRIVER_BUILD_DATE = "Tue Mar  5 22:23:56 UTC 2024"
KUBELET_UNIT_LINK = "etc/systemd/system/multi-user.target.wants/kubelet.service"


def real_kubelet(runtime: str) -> bool:
    """Whether a node with ``runtime`` runs the real kubelet (else the simulator's node agent)."""
    return runtime == "containerd" and os.environ.get("GPUNODE_SIM_KUBELET", "real") != "agent"


def kubelet_config(cgroup_root: str) -> dict:
    """The real kubelet's configuration on a simulated node; each setting says why it differs from kubeadm's."""
    pki = "/etc/kubernetes/pki"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False,  # this machine's cgroups are v1; 1.35 still runs there when told so
        "cgroupDriver": "cgroupfs",  # no systemd as the node's init
        "cgroupRoot": cgroup_root,  # nodes share the host's cgroup tree: each boot has a root of its own
        # the kubelet would set vm.overcommit_memory, kernel.panic and kernel.panic_on_oops, machine-wide: it only
        # checks them, and the node's /proc/sys shows it the values it wants (gpunode_sim.guest.init)
        "protectKernelDefaults": True,
        "failSwapOn": False,
        "address": "127.0.0.1", "healthzBindAddress": "127.0.0.1", "readOnlyPort": 0,
        "tlsCertFile": f"{pki}/kubelet.crt", "tlsPrivateKeyFile": f"{pki}/kubelet.key",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": f"{pki}/ca.crt"}},
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "localStorageCapacityIsolation": False,  # the nodes' root is an overlay: no filesystem stats to isolate
        "evictionHard": {"memory.available": "1Mi"},  # nodes share the host's memory and disk figures
        "imageGCHighThresholdPercent": 100,  # images here cannot be pulled again: never collect them
        "imageGCLowThresholdPercent": 99,
        "resolvConf": "/etc/resolv.conf",
        # the cluster DNS address pods are given (no DNS answers there: nothing in the simulated fleet resolves
        # names, and a node's network namespace has no route out)
        "clusterDNS": ["10.96.0.10"], "clusterDomain": "cluster.local",
        # a pod's nvidia.com/gpu served through DRA (KEP-5004): GA in the 1.37 control plane, alpha (off by default)
        # in this 1.35 kubelet, which must admit such a pod and prepare the claim the scheduler made for it
        "featureGates": {"DRAExtendedResource": True},
    }


@dataclass
class NodeProcess:
    """A host process started for a node, identified by pid and a cmdline marker."""

    role: str
    pid: int

    def alive(self) -> bool:
        return alive(self.pid)


# the simulated GPUs' state and health events, as their links in the driver's firmware folder (package gpustate)
FIRMWARE_LINKS = {"gsp_gpunode_sim.bin": "/etc/gpunode-sim/gpu.json",
                  "gsp_gpunode_sim_events.bin": "/run/gpunode-sim/events/health-events"}


def firmware_links(firmware: Path, version: str | None) -> None:
    """The simulated hardware's files linked into the node's driver firmware folder ``firmware``, in its subfolder
    ``version`` (None: no driver): NVIDIA's CDI generator and its runtime in jit-cdi mode mount every
    ``/lib/firmware/nvidia/<version>/gsp*.bin`` into a GPU container, which is how the simulated NVML and nvidia-smi
    reach the GPUs there (package gpustate of the library's build); a real container reaches them through the
    driver. Other versions' links go: the driver's package owns its folder. ``firmware`` is the node's
    ``lib/firmware/nvidia`` as written: under ``usr/`` on a merged-/usr node written from its upper layer (a
    ``lib`` folder there would hide the image's ``lib -> usr/lib`` link, and the node would not boot)."""
    for folder in firmware.iterdir() if firmware.is_dir() else []:
        for name in FIRMWARE_LINKS:
            if (folder / name).is_symlink() and folder.name != version:
                (folder / name).unlink()
    if version is not None:
        (firmware / version).mkdir(parents=True, exist_ok=True)
        for name, target in FIRMWARE_LINKS.items():
            if not (firmware / version / name).is_symlink():
                (firmware / version / name).symlink_to(target)


def driver_files(state: dict) -> tuple[dict[str, str], dict[str, str], list[list]]:
    """``/proc/driver`` files, ``/sys/module`` files and device nodes for a driver state."""
    proc: dict[str, str] = {}
    sysmod: dict[str, str] = {}
    devices: list[list] = []
    if state["nouveau"]:
        sysmod["nouveau/initstate"] = "live\n"
    if not state["loaded"]:
        return proc, sysmod, devices
    version = state["module_version"]
    if state["kernel_module"] == "open":
        banner = (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
                  f"(dvs-builder@U16-I3-B03-4-3)  {DRIVER_BUILD_DATE}")
    else:
        banner = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  {DRIVER_BUILD_DATE}"
    proc["nvidia/version"] = f"{banner}\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    uvm = state.get("uvm", True)  # state files written before the fault existed have no key: loaded
    for module in ("nvidia", "nvidia_modeset", *(("nvidia_uvm",) if uvm else ())):
        sysmod[f"{module}/version"] = f"{version}\n"
        sysmod[f"{module}/initstate"] = "live\n"
    for gpu in state["gpus"] if not state["no_devices"] else []:
        bus = gpu["pci_bus_id"][4:]
        proc[f"nvidia/gpus/{bus}/information"] = (
            f"Model: \t\t {gpu['name']}\nIRQ:   \t\t 0\nGPU UUID: \t {gpu['uuid']}\n"
            f"Video BIOS: \t 92.00.45.00.08\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
            f"DMA Mask: \t 0x7fffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {gpu['minor']}\n"
            "GPU Excluded:\t No\n")
        devices.append([f"nvidia{gpu['minor']}", NVIDIA_MAJOR, gpu["minor"], 0o666])
    if state["nvswitch_count"]:
        proc["nvidia-nvswitch/devices"] = "".join(
            f"0000:{0x05 + i:02x}:00.0\n" for i in range(state["nvswitch_count"]))
    devices += [["nvidiactl", NVIDIA_MAJOR, 255, state.get("ctl_mode", 0o666)],
                ["nvidia-modeset", NVIDIA_MAJOR, 254, 0o666]]
    if uvm:
        devices += [["nvidia-uvm", UVM_MAJOR, 0, 0o666], ["nvidia-uvm-tools", UVM_MAJOR, 1, 0o666]]
    migs = [(gpu["minor"], mig) for gpu in state["gpus"] for mig in gpu.get("mig_devices") or []]
    lines = mig_minors(state["gpus"]) if migs else []
    if lines:
        proc["nvidia-caps/mig-minors"] = "".join(f"{cap} {minor}\n" for cap, minor in lines)
    if lines and state.get("mig_caps", True):  # created on use by the driver's tools, as nvidia-smi mig does
        minors = dict(lines)
        caps = {minors["config"]: 0o400, minors["monitor"]: 0o444}
        for gpu, mig in migs:
            caps[minors[f"gpu{gpu}/gi{mig['gpu_instance']}/access"]] = 0o444
            caps[minors[f"gpu{gpu}/gi{mig['gpu_instance']}/ci{mig['compute_instance']}/access"]] = 0o444
        devices += [[f"nvidia-caps/nvidia-cap{minor}", CAPS_MAJOR, minor, mode] for minor, mode in sorted(caps.items())]
    return proc, sysmod, devices


def mig_minors(gpus: list[dict]) -> list[tuple[str, int]]:
    """/proc/driver/nvidia-caps/mig-minors: every MIG capability the driver knows and its nvidia-caps minor, in the
    line format NVIDIA's toolkit parses (internal/nvcaps: ``config 1``, ``gpu0/gi0/access 3``, ``gpu0/gi0/ci0/access
    4`` as its tests have them); the numbering past those (15 GPU instances of 8 compute instances per GPU) is the
    simulator's: the toolkit and the device plugin only look minors up in this file."""
    lines = [("config", 1), ("monitor", 2)]
    for gpu in sorted(g["minor"] for g in gpus):
        for gi in range(15):
            base = 3 + gpu * 135 + gi * 9
            lines.append((f"gpu{gpu}/gi{gi}/access", base))
            lines += [(f"gpu{gpu}/gi{gi}/ci{ci}/access", base + 1 + ci) for ci in range(8)]
    return lines


class SimNode:
    """A simulated node of the fleet."""

    def __init__(self, paths: SimPaths, spec: NodeSpec) -> None:
        self.paths = paths
        self.spec = spec
        self.dir = paths.node(spec.name)

    @property
    def upper(self) -> Path:
        return self.dir / "upper"

    @property
    def console_log(self) -> Path:
        return self.dir / "console.log"

    @property
    def ssh_socket(self) -> Path:
        return self.dir / "sshd.sock"

    @property
    def kubelet_socket(self) -> Path:
        return self.dir / "kubelet.sock"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    def prepare(self, authorized_key: str) -> str:
        """Create the node's folders and per-node files; return its SSH host public key."""
        for folder in ("upper", "work", "merged", *(f"data/{d.split('/')[-1]}" for d in DATA_DIRS)):
            (self.dir / folder).mkdir(parents=True, exist_ok=True)
        host_pub = ensure_key(self.host_key, f"root@{self.spec.name}")
        state = driver_state(self.spec.name, self.spec.profile)
        machine_id = uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.spec.name}.gpunode.sim").hex
        real = real_kubelet(self.spec.runtime)
        kubelet_dir = self._built(real)
        files = {
            "etc/hostname": f"{self.spec.name}\n",
            "etc/hosts": (f"127.0.0.1\tlocalhost\n127.0.1.1\t{self.spec.name}\n::1\tlocalhost ip6-localhost\n"
                          f"{registry_node_address(self.paths)}\t{REGISTRY_NAME}\n"),
            "etc/machine-id": f"{machine_id}\n",
            "etc/gpunode-sim/gpu.json": json.dumps(state, indent=2) + "\n",
            "etc/gpunode-sim/profile.json": json.dumps(
                {"profile": self.spec.profile_name, **self.spec.profile}, indent=2) + "\n",
            f"home/{SIM_USER}/.ssh/authorized_keys": authorized_key + "\n",
            "etc/ssh/ssh_host_ed25519_key": self.host_key.read_text(),
            "etc/ssh/ssh_host_ed25519_key.pub": host_pub + "\n",
            "etc/gpunode-sim/kubelet.json": json.dumps({
                "node": self.spec.name, "address": self.spec.address, "kubelet_version": kubelet_version(),
                "runtime_version": runtime_version(self.paths, self.spec.os, self.spec.runtime)},
                indent=2) + "\n",
            **node_credentials(self.paths, self.spec.name, self.spec.address),
            **registry_files(self.paths, self.spec.runtime),
        }
        lowers = lower_dirs(self.paths, self.spec.os, self.spec.runtime)
        config = containerd_config_with_registry(self.upper, lowers)
        if config is not None and self.spec.runtime == "containerd":
            files["etc/containerd/config.toml"] = config
        boot_id = str(uuid.uuid4())
        nvml = self._nvml()
        binds = code_roots() + [str(p) for p in (kubelet_dir, nvml.parent if nvml else None) if p is not None]
        if kubelet_dir is not None:
            files |= self._kubelet_files(boot_id)
        write_upper(self.upper, files)
        (self.upper / "etc/kubernetes/pki/kubelet-client.key").chmod(0o600)
        (self.upper / "etc/kubernetes/pki/kubelet.key").chmod(0o600)
        # the native nvidia-smi beside the simulated NVML (the node's Python stand-in answers through it; in a
        # container NVIDIA's CDI spec or runtime mounts it into, it answers -L itself)
        self._link("usr/bin/nvidia-smi", str(nvml.parent / NVIDIA_SMI) if nvml else "/usr/lib/gpunode-sim/nvidia-smi",
                   state["installed"])
        self._nvml_library(nvml if state["installed"] else None, state["driver_version"])
        self._cuda_placeholder(state["driver_version"], state["installed"])
        merged_usr = any((lower / "lib").is_symlink() for lower in lowers)
        firmware_links(self.upper / ("usr/lib" if merged_usr else "lib") / "firmware/nvidia",
                       state["driver_version"] if state["installed"] else None)
        fm_wants = "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service"
        self._link(fm_wants, "/lib/systemd/system/nvidia-fabricmanager.service",
                   state["fabricmanager"]["installed"] and state["fabricmanager"]["running"])
        self._link("usr/bin/nv-fabricmanager", "/usr/lib/gpunode-sim/nv-fabricmanager",
                   state["fabricmanager"]["installed"])
        self._link(KUBELET_UNIT_LINK, "/lib/systemd/system/kubelet.service", real)
        self._link("usr/local/bin/kubelet", f"{kubelet_dir}/kubelet", kubelet_dir is not None)
        proc, sysmod, devices = driver_files(state)
        plan = {
            "hostname": self.spec.name,
            "merged": str(self.dir / "merged"),
            "upper": str(self.upper),
            "work": str(self.dir / "work"),
            "lowers": [str(p) for p in lowers],
            "data_binds": {d: str(self.dir / "data" / d.split("/")[-1]) for d in DATA_DIRS},
            "code_binds": binds,
            "boot_id": boot_id,
            "proc_driver": proc,
            "sys_module": sysmod,
            "devices": devices,
        }
        (self.dir / "boot.json").write_text(json.dumps(plan, indent=2))
        return host_pub

    def _built(self, kubelet: bool) -> Path | None:
        """The built kubelet folder this node needs (None where it runs the simulator's agent)."""
        from gpunode_sim.build import kubernetes

        return kubernetes.require_node(self.paths.cache) if kubelet else None

    def _nvml(self) -> Path | None:
        """The built simulated libnvidia-ml.so.1 (None where it is not built: the plugin then reads the state)."""
        from gpunode_sim.build import nvml_build

        return nvml_build.built(self.paths.cache)

    def _kubelet_files(self, boot_id: str) -> dict[str, str]:
        """The kubelet's config, and the images a node image would hold (the pause image and the test workload's;
        gpunode's plugin comes from the fleet's registry)."""
        from gpunode_sim.images import workload_image
        from gpunode_sim.images.tools_layer import PAUSE_IMAGE, PAUSE_NAME, WORKLOAD_IMAGE

        tools_layer = self.paths.layer("tools")
        archives = {PAUSE_NAME: tools_layer / PAUSE_IMAGE,
                    workload_image.IMAGE_NAME: tools_layer / WORKLOAD_IMAGE}
        inside = {PAUSE_NAME: f"/{PAUSE_IMAGE}", workload_image.IMAGE_NAME: f"/{WORKLOAD_IMAGE}"}
        images = " ".join(f"{name}@{archive_digest(path)}={inside.get(name, path)}" for name, path in archives.items())
        cgroup_root = cgroup_root_of(boot_id)
        extra = f"--hostname-override={self.spec.name} --node-ip={node_address(self.spec.address)}"
        return {
            "etc/kubernetes/kubelet-config.yaml": yaml.safe_dump(kubelet_config(cgroup_root), sort_keys=False),
            "etc/default/kubelet": (f'KUBELET_EXTRA_ARGS="{extra}"\nGPUNODE_CGROUP_ROOT={cgroup_root}\n'
                                    f'GPUNODE_IMAGES="{images}"\n'),
        }

    def _nvml_library(self, built: Path | None, version: str) -> None:
        """NVML where and as the driver installs it: ``libnvidia-ml.so.<driver version>`` (the simulated library,
        hard-linked from the build, else copied) and its ``libnvidia-ml.so.1`` link. NVIDIA's CDI generator looks
        for the versioned file: without it, a container given GPUs through CDI gets no NVML."""
        folder = self.upper / "usr/lib/x86_64-linux-gnu"
        target = folder / f"libnvidia-ml.so.{version}"
        for old in folder.glob("libnvidia-ml.so.*") if folder.is_dir() else []:
            if old.name != NVML_LIBRARY:
                old.unlink()  # this build's, anew at every boot (the build may have changed)
        if built is not None:
            folder.mkdir(parents=True, exist_ok=True)
            try:
                os.link(built, target)
            except OSError:  # another filesystem than the cache's
                shutil.copyfile(built, target)
        self._link(f"usr/lib/x86_64-linux-gnu/{NVML_LIBRARY}", target.name, built is not None)

    def _cuda_placeholder(self, version: str, wanted: bool) -> None:
        """``libcuda.so.<driver version>`` (and its ``libcuda.so.1`` link) where the driver installs it: NVIDIA's
        CDI generator (``nvidia-ctk cdi generate``) refuses to write a spec without the driver's CUDA library. An
        empty file: CUDA needs a GPU, and a container that loads it fails as it would without one."""
        folder = self.upper / "usr/lib/x86_64-linux-gnu"
        for old in folder.glob("libcuda.so.*") if folder.is_dir() else []:
            if old.name != f"libcuda.so.{version}" or not wanted:
                old.unlink()
        if wanted:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"libcuda.so.{version}").touch()
        self._link("usr/lib/x86_64-linux-gnu/libcuda.so.1", f"libcuda.so.{version}", wanted)

    def _link(self, relative: str, target: str, wanted: bool) -> None:
        path = self.upper / relative
        if path.is_symlink() or path.exists():
            path.unlink()
        if wanted:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(target)

    def start(self, record: Callable[[NodeProcess], None]) -> None:
        """Start the node and its forwarders, handing each host process to ``record`` as it starts.

        SIGINT is held back between a process's start and its recording, so an
        interrupted ``up`` never leaves a process that ``down`` does not know.
        """
        ns = self.spec.netns
        if not Path(f"/run/netns/{ns}").exists():
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True, capture_output=True)
        # the address the node's kubelet reports (a real kubelet refuses a loopback one); only inside the node
        subprocess.run(["ip", "-n", ns, "addr", "replace", f"{node_address(self.spec.address)}/32", "dev", "lo"],
                       check=True, capture_output=True)
        subprocess.run(["ip", "-n", ns, "addr", "replace", f"{registry_node_address(self.paths)}/32", "dev", "lo"],
                       check=True, capture_output=True)  # the fleet registry's forwarder listens there
        log = self.console_log.open("ab")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        commands = {
            "init": ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--ipc", "--mount", "--pid",
                     "--fork", "--kill-child=SIGTERM", sys.executable, "-m", "gpunode_sim.guest.init",
                     str(self.dir / "boot.json")],
        }
        for sock in (self.ssh_socket, self.kubelet_socket):
            sock.unlink(missing_ok=True)
        commands |= {
            "ssh-node": ["nsenter", f"--net=/run/netns/{ns}", "socat",
                         f"UNIX-LISTEN:{self.ssh_socket},fork,mode=600", "TCP:127.0.0.1:22"],
            "repo-node": ["nsenter", f"--net=/run/netns/{ns}", "socat",
                          f"TCP-LISTEN:{REPO_PORT},bind=127.0.0.1,reuseaddr,fork",
                          f"UNIX-CONNECT:{self.paths.run / 'repo.sock'}"],
            "registry-node": ["nsenter", f"--net=/run/netns/{ns}", "socat",
                              f"TCP-LISTEN:{REGISTRY_PORT},bind={registry_node_address(self.paths)},reuseaddr,fork",
                              f"UNIX-CONNECT:{self.paths.run / 'registry.sock'}"],
            "api-node": ["nsenter", f"--net=/run/netns/{ns}", "socat",
                         f"TCP-LISTEN:{APISERVER_PORT},bind={self.paths.apiserver_address},reuseaddr,fork",
                         f"UNIX-CONNECT:{self.paths.run / 'apiserver.sock'}"],
            "kubelet-node": ["nsenter", f"--net=/run/netns/{ns}", "socat",
                             f"UNIX-LISTEN:{self.kubelet_socket},fork,mode=600", f"TCP:127.0.0.1:{KUBELET_PORT}"],
            "kubelet-host": ["socat", f"TCP-LISTEN:{KUBELET_PORT},bind={self.spec.address},reuseaddr,fork",
                             f"UNIX-CONNECT:{self.kubelet_socket}"],
        }
        try:
            for role, argv in commands.items():
                spawn(role, argv, record, log, env)
        finally:
            log.close()

    def start_kubelet(self, pid1: int, record: Callable[[NodeProcess], None]) -> None:
        """The node's kubelet, inside all of its namespaces; its log is the node's /var/log/gpunode-kubelet.log."""
        argv = ["nsenter", "-t", str(pid1), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "sh", "-c",
                f"exec {sys.executable} -m gpunode_sim.guest.kubelet_agent >>/var/log/gpunode-kubelet.log 2>&1"]
        spawn("kubelet", argv, record, subprocess.DEVNULL, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})

    def wait_ready(self, timeout: float, processes: list[NodeProcess]) -> str | None:
        """None once sshd answers on the node's SSH socket (the bastion's way in), else why not (at once if a
        process died)."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            dead = [p.role for p in processes if not p.alive()]
            if dead:
                return f"{', '.join(dead)} exited before sshd answered on {self.spec.name}'s port 22"
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                    conn.settimeout(2)
                    conn.connect(str(self.ssh_socket))
                    banner = conn.recv(64)
                    if banner.startswith(b"SSH-2.0-"):
                        return None
                    last = f"unexpected banner {banner[:30]!r}" if banner else "connection closed"
            except OSError as error:
                last = str(error)
            time.sleep(0.2)
        return f"sshd did not answer on {self.spec.name}'s port 22 within {timeout:.0f} s ({last})"

    def console_tail(self, lines: int = 20) -> str:
        """The console's last lines, after the errors of the node's forwarders (socat's ``E`` lines) before them."""
        if not self.console_log.exists():
            return "(no console log)"
        text = self.console_log.read_text(errors="replace").splitlines()
        errors = [line for line in text[:-lines] if re.search(r"socat\[\d+\] E ", line)]
        return "\n".join(errors[-5:] + text[-lines:])


def write_upper(upper: Path, files: dict[str, str]) -> None:
    """Write a simulated host's own files into its upper folder (replacing a link or whiteout found there); the
    operator's home and key, written here by root, are handed to the operator."""
    for relative, text in files.items():
        target = upper / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.is_char_device():
            target.unlink()
        target.write_text(text)
    home = upper / "home" / SIM_USER
    for path in (home, home / ".ssh", home / ".ssh/authorized_keys"):
        os.chown(path, SIM_UID, SIM_UID)
    (home / ".ssh").chmod(0o700)
    (upper / "etc/ssh/ssh_host_ed25519_key").chmod(0o600)


def spawn(role: str, argv: list[str], record: Callable[[NodeProcess], None], output: object,
          env: dict[str, str]) -> None:
    """Start a host process of a simulated host in a session of its own and hand it to ``record``; SIGINT is held
    back in between, so an interrupted ``up`` never leaves a process that ``down`` does not know."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
        record(NodeProcess(role, proc.pid))
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def kubelet_version() -> str:
    """What the node's kubelet says it is: the control plane's version, marked as the simulator's kubelet."""
    from gpunode_sim.build.kubernetes import KUBERNETES_VERSION

    return f"v{KUBERNETES_VERSION}-gpunode-sim"


def runtime_version(paths: SimPaths, os_name: str, runtime: str) -> str:
    """``containerd://1.6.20~ds1-1+b1`` as the kubelet reports it, from the runtime layer's dpkg status."""
    package = {"containerd": "containerd", "docker": "docker.io"}.get(runtime, runtime)
    status = layer_dir(paths, os_name, runtime) / "var/lib/dpkg/status"
    version = "unknown"
    if status.exists():
        for block in status.read_text().split("\n\n"):
            if f"Package: {package}\n" in f"{block}\n":
                version = next((line.split(": ", 1)[1] for line in block.splitlines()
                                if line.startswith("Version: ")), version)
    return f"{runtime}://{version}"


def registry_files(paths: SimPaths, runtime: str) -> dict[str, str]:
    """The fleet registry's trust as an admin sets it on a node: containerd's ``hosts.toml`` with the CA beside it
    (``config_path`` points containerd's CRI there), docker's ``certs.d/HOST:PORT/ca.crt``."""
    from gpunode_sim.registry import server

    reach = server.access(paths)
    ca = reach.ca.read_text()
    if runtime == "docker":
        return {f"etc/docker/certs.d/{reach.host}/ca.crt": ca}
    folder = f"{CERTS_D}/{reach.host}"
    # the server itself with its CA, no [host] mirror before it: a mirror's "not found" would be followed by a try
    # at the server without the mirror's CA, and containerd reports that last error (x509) for a missing tag
    hosts = f'server = "https://{reach.host}"\nca = "{folder}/ca.crt"\n'
    return {f"{folder.lstrip('/')}/ca.crt": ca, f"{folder.lstrip('/')}/hosts.toml": hosts}


def containerd_config_with_registry(upper: Path, lowers: list[Path]) -> str | None:
    """The image's containerd config with the CRI plugin's registry ``config_path`` set to ``CERTS_D``, for a node
    whose own copy does not exist yet (one the deploy wrote is left alone); None when there is nothing to write."""
    if (upper / "etc/containerd/config.toml").exists():
        return None
    packaged = next((d / "etc/containerd/config.toml" for d in lowers if (d / "etc/containerd/config.toml").is_file()),
                    None)
    if packaged is None:
        return None
    document = tomlkit.parse(packaged.read_text())
    plugins = document.setdefault("plugins", tomlkit.table())
    if int(document.get("version", 1)) >= 3:
        images = plugins.setdefault("io.containerd.cri.v1.images", tomlkit.table())
        images.setdefault("registry", tomlkit.table())["config_path"] = CERTS_D
    else:
        cri = plugins.setdefault("io.containerd.grpc.v1.cri", tomlkit.table())
        cri.setdefault("registry", tomlkit.table())["config_path"] = CERTS_D
    return tomlkit.dumps(document)


def cgroup_root_of(boot_id: str) -> str:
    """The real kubelet's cgroup root for one boot of a node (workload containers of the agent use
    ``/gpunode-<boot8>-<pod>``)."""
    return f"/gpunode-{boot_id[:8]}"


def remove_cgroups(boot_id: str, root: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """Remove a stopped node's kubelet cgroup tree from every controller; return what could not go."""
    left = []
    name = cgroup_root_of(boot_id).lstrip("/")
    for controller in sorted(root.iterdir()) if root.is_dir() else []:
        top = controller / name
        if not top.is_dir():
            continue
        for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
            try:
                folder.rmdir()
            except OSError as error:
                left.append(f"{folder}: {error.strerror}")
    return left


def code_roots() -> list[str]:
    """Host folders with this Python environment and the gpunode and plugin code.

    They are bound read-only at the same paths inside each node, so the node
    agent and the device plugin run there from the same code as the host. A
    Python under /usr is Debian's, which the nodes have of their own.
    """
    import gpunode_plugin

    import gpunode
    import gpunode_sim

    roots = {Path(sys.prefix).resolve(), Path(gpunode.__file__).resolve().parents[1],
             Path(gpunode_plugin.__file__).resolve().parents[1], Path(gpunode_sim.__file__).resolve().parents[1]}
    interpreter = Path(sys.base_prefix).resolve()
    if not interpreter.is_relative_to("/usr"):  # a Python of its own (pyenv, /opt): the node needs it too
        roots.add(interpreter)
    chosen: list[Path] = []
    for root in sorted(roots, key=lambda p: len(p.parts)):
        if not any(root.is_relative_to(c) for c in chosen):
            chosen.append(root)
    return [str(c) for c in chosen]


def init_pid_of(unshare_pid: int) -> int | None:
    """PID (host view) of the node's PID 1: the child of the ``unshare`` process."""
    children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children")
    try:
        first = children.read_text().split()
    except OSError:
        return None
    return int(first[0]) if first else None


def stop_processes(processes: list[NodeProcess], timeout: float = 15) -> None:
    """Stop a node: SIGTERM its init (services stop cleanly), then SIGKILL what is left."""
    init = next((p for p in processes if p.role == "init"), None)
    node_pid1 = init_pid_of(init.pid) if init else None
    targets = [p for p in processes if p.role != "init"]
    for proc in targets:
        signal_group(proc.pid, signal.SIGTERM)
    if node_pid1:
        signal_pid(node_pid1, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    watched = [NodeProcess("pid1", node_pid1)] if node_pid1 else []
    while time.monotonic() < deadline and any(p.alive() for p in watched):
        time.sleep(0.1)
    if node_pid1:
        signal_pid(node_pid1, signal.SIGKILL)  # takes the whole PID namespace with it
    for proc in processes:
        signal_group(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(p.alive() for p in processes):
        time.sleep(0.05)
