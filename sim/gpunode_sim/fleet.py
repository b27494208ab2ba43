"""Bringing a simulated fleet up and down, and what it looks like while it runs.

``up`` prepares the shared images (cached), the local signed repository and
its server, then starts every node and waits for its sshd; a node that fails
is reported with its console log while the others come up. The fleet's state
(nodes, host processes) is written as it changes, so ``down`` can always clean
up, also after Ctrl-C or a crash.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpunode.errors import GpunodeError
from gpunode_sim.access.bastion import FORWARD_PREFIX, Bastion
from gpunode_sim.access.ssh import SIM_USER, client_key, write_client_files
from gpunode_sim.build import kubernetes, nvml_build, toolkit_build
from gpunode_sim.cluster import controlplane
from gpunode_sim.host import prereqs
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.host.processes import alive
from gpunode_sim.images import checker_image, layers, plugin_image
from gpunode_sim.images.tools_layer import write_tools_layer
from gpunode_sim.node.simnode import (
    REPO_PORT,
    NodeProcess,
    SimNode,
    cgroup_root_of,
    firmware_links,
    init_pid_of,
    real_kubelet,
    remove_cgroups,
    stop_processes,
)
from gpunode_sim.registry import server as registry
from gpunode_sim.repos.aptrepo import REPO_PATH, build_repo
from gpunode_sim.spec.gpus import DEFAULT_DRIVER, FAULTS, LIVE_FAULTS, LIVE_FIELDS, driver_state
from gpunode_sim.spec.profiles import NodeSpec, load_profile

Say = Callable[[str], None]
READY_TIMEOUT = 60.0
CHECKER_INTERVAL = 20  # seconds: a fault shows in its Node condition within a test's patience, at little CPU
CHECKER_HEARTBEAT = 60  # seconds: its writes when nothing changed, three intervals (a test sees one and a quiet check)


@dataclass
class NodeResult:
    name: str
    address: str
    profile: str
    runtime: str
    error: str | None = None
    console: str = ""


@dataclass
class FleetReport:
    nodes: list[NodeResult] = field(default_factory=list)
    ssh_config: Path | None = None
    inventory: Path | None = None

    @property
    def failed(self) -> list[NodeResult]:
        return [n for n in self.nodes if n.error]


class FleetState:
    """The JSON record of a running fleet: nodes, their host processes, the repo server."""

    def __init__(self, paths: SimPaths) -> None:
        self.paths = paths
        self.data: dict = {"nodes": {}, "services": {}}
        if paths.fleet_file.exists():
            try:
                self.data = json.loads(paths.fleet_file.read_text())
            except json.JSONDecodeError:
                self.data = {"nodes": {}, "services": {}}

    def save(self) -> None:
        self.paths.state.mkdir(parents=True, exist_ok=True)
        tmp = self.paths.fleet_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        os.replace(tmp, self.paths.fleet_file)

    def net_block(self, paths: SimPaths) -> int:
        """The loopback block the running fleet uses (recorded at ``up``; the environment's otherwise)."""
        return int(self.data.get("net_block", paths.net_block))

    def processes(self, name: str) -> list[NodeProcess]:
        entry = self.data["nodes"].get(name, {})
        return [NodeProcess(role, pid) for role, pid in entry.get("pids", {}).items()]


def _start_service(paths: SimPaths, state: FleetState, role: str, argv: list[str], ready: Path | None) -> None:
    """Start a host-side Python service of the fleet (repo server, supervisor) unless it runs; wait for ``ready``."""
    service = state.data["services"].get(role)
    if service and NodeProcess(role, service).alive():
        return
    paths.run.mkdir(parents=True, exist_ok=True)
    if ready is not None:
        ready.unlink(missing_ok=True)
    log_file = paths.run / f"{role}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with log_file.open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", *argv], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)
    state.data["services"][role] = proc.pid
    state.save()
    deadline = time.monotonic() + 10
    while ready is not None and not ready.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise GpunodeError(f"the fleet's {role} did not start", f"see {log_file}")
        time.sleep(0.05)


def _start_repo_server(paths: SimPaths, state: FleetState) -> None:
    _start_service(paths, state, "repo",
                   ["gpunode_sim.repos.reposerver", str(paths.repo), str(paths.run / "repo.sock")],
                   paths.run / "repo.sock")


def _start_control_plane(paths: SimPaths, state: FleetState, say: Say) -> Path:
    """The real Kubernetes control plane on 127.0.<block>.254 and the kubeconfig of its users."""
    def record(role: str, pid: int) -> None:
        state.data["services"][role] = pid
        state.save()

    kubeconfig = controlplane.start(paths, state.data["services"], record, say)
    _start_service(paths, state, "supervisor", ["gpunode_sim.host.supervisor", str(paths.state)], None)
    return kubeconfig


def _start_registry(paths: SimPaths, state: FleetState, say: Say, checker: bool = False) \
        -> tuple[str | None, str | None]:
    """The fleet's registry, running, with gpunode's plugin image (and the node checker's, with ``checker``)
    pushed to it; each image's reference by digest (None when it is not built)."""
    from gpunode.image.push import Registry, pinned, push, resolve

    def record(role: str, pid: int) -> None:
        state.data["services"][role] = pid
        state.save()

    reach = registry.start(paths, state.data["services"], record, alive)
    credentials = Registry(reach.cert_dir, reach.username, reach.password)

    def pushed(built: Path | None, repository: str) -> str | None:
        if built is None:
            return None
        described = plugin_image.describe(built)
        version = described["name"].rsplit(":", 1)[1]
        target = f"{reach.push_host}/{repository}:{version}"
        try:
            there = resolve(target, credentials)
        except GpunodeError:
            there = None
        if there != described["digest"]:
            started = time.monotonic()
            digest = push(built / plugin_image.ARCHIVE, target, credentials)
            say(f"pushed {target} ({digest[:19]}) to the fleet's registry in {time.monotonic() - started:.1f} s")
        return pinned(f"{reach.host}/{repository}:{version}", described["digest"])

    return (pushed(plugin_image.built(paths.cache), registry.REPOSITORY),
            pushed(checker_image.built(paths.cache) if checker else None, registry.CHECKER_REPOSITORY))


def write_inventory(paths: SimPaths, state: FleetState, repo_fingerprint: str, plugin_reference: str | None = None,
                    checker_reference: str | None = None) -> Path:
    """The inventory pyinfra and testinfra read (``inventories/sim.py`` finds it)."""
    key = paths.ssh / "id_ed25519"
    hosts = {}
    for name, entry in sorted(state.data["nodes"].items()):
        hosts[name] = {
            # reached as production nodes are: a non-root user with sudo, through the bastion (ProxyJump in the
            # fleet's ssh_config, which pyinfra, verify and doctor all read)
            "ssh_config_file": str(paths.ssh_config),
            "ssh_user": SIM_USER,
            "_sudo": True,
            "ssh_key": str(key),
            "ssh_known_hosts_file": str(paths.ssh / "known_hosts"),
            "ssh_strict_host_key_checking": "yes",
            "sim_profile": entry["profile"],
            "container_runtime": entry["runtime"],
            "gpu_expected": entry["gpu_count"] > 0,
            # the nodes' kubelets use the cgroupfs driver (no systemd as init): containerd's runc must match
            "containerd_systemd_cgroup": False,
        }
    inventory = {
        "ssh_config": str(paths.ssh_config),
        "hosts": hosts,
        "groups": {
            "gpu_nodes": sorted(n for n, h in hosts.items() if h["gpu_expected"]),
            "cpu_nodes": sorted(n for n, h in hosts.items() if not h["gpu_expected"]),
        },
        "kubeconfig": str(paths.kubeconfig),
        "kube_context": controlplane.OPERATOR_CONTEXT,  # least privilege: 'gpunode render --rbac', nothing more
        "toolkit_repo": {
            "repository_url": f"http://127.0.0.1:{REPO_PORT}/{REPO_PATH}/stable/deb/$(ARCH)",
            "rpm_repository_url": f"http://127.0.0.1:{REPO_PORT}/{REPO_PATH}/stable/rpm/$basearch",
            "key_url": f"http://127.0.0.1:{REPO_PORT}/{REPO_PATH}/gpgkey",
            "key_fingerprint": repo_fingerprint,
        },
    }
    if plugin_reference is not None:  # the plugin pods pull their image from the fleet's registry, by digest
        reach = registry.access(paths)
        # gpunode's pods that talk to the API (the node checker, the DRA driver) reach it as the kubelets do: the
        # fleet has no kube-proxy for the kubernetes Service
        api_server = f"{paths.apiserver_address}:{controlplane.APISERVER_PORT}"
        inventory["plugin"] = {"plugin_image": plugin_reference, "plugin_registry_username": reach.username,
                               "plugin_registry_password": reach.password, "checker_api_server": api_server}
        if checker_reference is not None:  # the node checker on every GPU node
            inventory["checker"] = {"checker_image": checker_reference, "checker_interval": CHECKER_INTERVAL,
                                    "checker_heartbeat": CHECKER_HEARTBEAT}
    paths.inventory_file.write_text(json.dumps(inventory, indent=2) + "\n")
    return paths.inventory_file


# inotify instances one node with the real kubelet takes (kubelet, cAdvisor, containerd; seen: 50 nodes stopped at
# "inotify_init: too many open files" after 17 real-kubelet nodes with fs.inotify.max_user_instances = 128)
INOTIFY_PER_KUBELET_NODE = 7


def inotify_limit() -> int:
    try:
        return int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    except (OSError, ValueError):
        return 128


def inotify_in_use() -> int:
    """The inotify instances open on the host now (every process runs as root here: one user's count)."""
    count = 0
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            count += sum(1 for fd in fd_dir.iterdir() if os.readlink(fd) == "anon_inode:inotify")
        except OSError:
            continue
    return count


def inotify_shortfall(kubelets: int, limit: int, in_use: int) -> str | None:
    """Why ``kubelets`` more real-kubelet nodes would not start here, or None when they fit."""
    needed = kubelets * INOTIFY_PER_KUBELET_NODE
    if needed <= limit - in_use:
        return None
    return (f"{kubelets} node(s) with the real kubelet need about {needed} inotify instances, and the host has "
            f"{max(limit - in_use, 0)} left (fs.inotify.max_user_instances = {limit}, {in_use} in use): their "
            "kubelets would fail with 'inotify_init: too many open files'")


def up(paths: SimPaths, specs: list[NodeSpec], say: Say) -> FleetReport:
    """Start ``specs`` (nodes already running are left as they are) and report each."""
    prereqs.check_host()
    state = FleetState(paths)
    if state.data["nodes"] and state.net_block(paths) != paths.net_block:
        raise GpunodeError(f"the fleet in {paths.state} runs on 127.0.{state.net_block(paths)}.N, not "
                           f"127.0.{paths.net_block}.N", f"set GPUNODE_SIM_NET={state.net_block(paths)}, or "
                           "'gpunode sim down' first")
    state.data["net_block"] = paths.net_block
    clash = [s.name for s in specs if s.name in state.data["nodes"]
             and state.data["nodes"][s.name]["profile"] != s.profile_name
             and any(p.alive() for p in state.processes(s.name))]
    if clash:
        raise GpunodeError(f"{', '.join(clash)} already running with another profile",
                           "run 'gpunode sim down' first, or keep the running profiles")
    kubelets = sum(real_kubelet(s.runtime) for s in specs if s.name not in state.data["nodes"])
    short = inotify_shortfall(kubelets, inotify_limit(), inotify_in_use())
    if short:
        raise GpunodeError(short, "set GPUNODE_SIM_KUBELET=agent (containerd nodes then run the simulator's node "
                           "agent, as docker nodes do), or start fewer nodes; raising fs.inotify.max_user_instances "
                           "is the host owner's decision, not the simulator's")
    started, booted = time.monotonic(), time.time()
    say(f"starting {len(specs)} node(s) in {paths.state}")
    layers.prepare_images(paths, {(s.os, s.runtime) for s in specs}, say)
    write_tools_layer(paths.layer("tools"), kubernetes.require_node(paths.cache) / "pause")
    if any(real_kubelet(s.runtime) or s.runtime == "docker" for s in specs):
        plugin_image.ensure_built(paths.cache, say)
        nvml_build.ensure_built(paths.cache, say)  # the plugin's image runs its NVML backend over it
    # the node checker runs as a pod from its image: where every GPU node has the real kubelet or docker (the node
    # agent of the light mode runs the device plugin's code, not images)
    checker = all(real_kubelet(s.runtime) or s.runtime == "docker"
                  for s in specs if int(s.profile["gpu"].get("count", 0)) > 0)
    if checker:
        checker_image.ensure_built(paths.cache, say)
    repo = build_repo(paths.repo, toolkit_build.require(paths.cache))
    _start_repo_server(paths, state)
    _start_control_plane(paths, state, say)
    plugin_reference, checker_reference = _start_registry(paths, state, say, checker)
    key = client_key(paths.ssh)
    authorized = Path(f"{key}.pub").read_text().strip()
    bastion, bastion_key = _start_bastion(paths, state, authorized)
    report = FleetReport()
    nodes = [SimNode(paths, spec) for spec in specs]
    host_keys: dict[str, tuple[str, str]] = {}
    to_wait: list[SimNode] = []
    for node in nodes:
        spec = node.spec
        entry = state.data["nodes"].get(spec.name)
        running = entry is not None and all(p.alive() for p in state.processes(spec.name))
        host_keys[spec.name] = (spec.address, node.prepare(authorized) if not running
                                else Path(f"{node.host_key}.pub").read_text().strip())
        gpu_count = int(spec.profile["gpu"].get("count", 0))
        if running:
            continue
        if entry:
            stop_processes(state.processes(spec.name))
        state.data["nodes"][spec.name] = {"address": spec.address, "profile": spec.profile_name,
                                          "runtime": spec.runtime, "gpu_count": gpu_count, "pids": {},
                                          **{key: entry[key] for key in ("faults", "driver")
                                             if entry and key in entry}}
        state.save()
        def record(proc: NodeProcess, name: str = spec.name) -> None:
            state.data["nodes"][name]["pids"][proc.role] = proc.pid
            state.save()

        try:
            node.start(record)
        except (OSError, subprocess.CalledProcessError) as error:
            report.nodes.append(NodeResult(spec.name, spec.address, spec.profile_name, spec.runtime,
                                           f"could not start: {error}", node.console_tail()))
            continue
        to_wait.append(node)
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(to_wait)))) as pool:
        waits = dict(zip([n.spec.name for n in to_wait],
                         pool.map(lambda n: n.wait_ready(READY_TIMEOUT, state.processes(n.spec.name)), to_wait),
                         strict=True))
    for node in to_wait:
        if waits.get(node.spec.name) is None and not real_kubelet(node.spec.runtime):
            error = _start_kubelet(paths, node, state)
            if error:
                waits[node.spec.name] = error
    waits.update(_wait_registered(paths, [n.spec.name for n in to_wait if waits.get(n.spec.name) is None],
                                  booted))
    for node in nodes:
        spec = node.spec
        if any(r.name == spec.name for r in report.nodes):
            continue
        error = waits.get(spec.name)
        report.nodes.append(NodeResult(spec.name, spec.address, spec.profile_name, spec.runtime, error,
                                       node.console_tail() if error else ""))
    all_keys = {name: (entry["address"], Path(f"{paths.node(name) / 'ssh_host_ed25519_key'}.pub").read_text())
                for name, entry in state.data["nodes"].items()}
    all_keys.update(host_keys)
    for name, entry in state.data["nodes"].items():  # each node's sshd, at its address inside the bastion's network
        _forward(bastion, state, name, entry["address"], paths.node(name) / "sshd.sock")
    error = bastion.wait_ready(READY_TIMEOUT)
    if error:
        raise GpunodeError(error, "stop the fleet with 'gpunode sim down' and start it again")
    report.ssh_config = write_client_files(paths.ssh, all_keys, (bastion.address, bastion_key))
    report.inventory = write_inventory(paths, state, repo.fingerprint, plugin_reference, checker_reference)
    say(f"fleet ready in {time.monotonic() - started:.1f} s")
    return report


def _start_bastion(paths: SimPaths, state: FleetState, authorized: str) -> tuple[Bastion, str]:
    """The fleet's bastion, started unless it runs; (the bastion, its SSH host public key)."""
    bastion = Bastion(paths, state.net_block(paths))
    entry = state.data.setdefault("bastion", {"address": bastion.address, "pids": {}})
    core = [NodeProcess(role, pid) for role, pid in entry["pids"].items() if not role.startswith(FORWARD_PREFIX)]
    if core and all(p.alive() for p in core):
        return bastion, Path(f"{bastion.host_key}.pub").read_text().strip()
    bastion.stop([NodeProcess(role, pid) for role, pid in entry["pids"].items()])
    entry["pids"] = {}
    state.save()
    host_key = bastion.prepare(authorized)

    def record(proc: NodeProcess) -> None:
        entry["pids"][proc.role] = proc.pid
        state.save()

    bastion.start(record)
    return bastion, host_key


def _forward(bastion: Bastion, state: FleetState, name: str, address: str, node_socket: Path) -> None:
    """The bastion's forwarder to node ``name``, started unless it runs."""
    pids = state.data["bastion"]["pids"]
    role = f"{FORWARD_PREFIX}{name}"
    if role in pids and NodeProcess(role, pids[role]).alive():
        return

    def record(proc: NodeProcess) -> None:
        pids[proc.role] = proc.pid
        state.save()

    bastion.forward(name, address, node_socket, record)


def _stop_bastion(paths: SimPaths, state: FleetState, names: list[str]) -> None:
    """Stop the bastion's forwarders to ``names``, and the bastion itself once no node is left."""
    entry = state.data.get("bastion")
    if not entry:
        return
    if state.data["nodes"]:
        stop_processes([NodeProcess(role, entry["pids"].pop(role)) for role in list(entry["pids"])
                        if role.removeprefix(FORWARD_PREFIX) in names and role.startswith(FORWARD_PREFIX)])
    else:
        Bastion(paths, state.net_block(paths)).stop([NodeProcess(r, p) for r, p in entry["pids"].items()])
        del state.data["bastion"]
    state.save()


def _start_kubelet(paths: SimPaths, node: SimNode, state: FleetState) -> str | None:
    """Start the booted node's kubelet; None, or why it could not be started."""
    name = node.spec.name
    try:
        pid1 = node_pid1(paths, name)
    except GpunodeError as error:
        return f"no init to start its kubelet in: {error}"

    def record(proc: NodeProcess) -> None:
        state.data["nodes"][name]["pids"][proc.role] = proc.pid
        state.save()

    node.start_kubelet(pid1, record)
    return None


def _wait_registered(paths: SimPaths, names: list[str], since: float) -> dict[str, str]:
    """Wait until each node's kubelet posted a Ready Node after ``since`` (a Node of an earlier boot still says
    Ready until the controller manager notices) and holds its Lease; name -> why not, for those that did not."""
    from lightkube.resources.coordination_v1 import Lease
    from lightkube.resources.core_v1 import Node

    if not names:
        return {}
    client = controlplane.admin_client(paths.kubeconfig)
    deadline = time.monotonic() + READY_TIMEOUT
    waiting = set(names)
    while waiting and time.monotonic() < deadline:
        try:
            leased = {lease.metadata.name for lease in client.list(Lease, namespace="kube-node-lease")}
            for node in client.list(Node):
                ready = next((c for c in (node.status.conditions or []) if c.type == "Ready"), None) \
                    if node.status else None
                beat = ready.lastHeartbeatTime.timestamp() if ready is not None and ready.lastHeartbeatTime else 0
                if ready is not None and ready.status == "True" and beat >= since - 1 and node.metadata.name in leased:
                    waiting.discard(node.metadata.name)
        except Exception:  # noqa: BLE001, S110 - the API may be busy: asked again until the deadline
            pass
        if waiting:
            time.sleep(0.2)
    return {name: f"its kubelet did not register a Ready Node within {READY_TIMEOUT:.0f} s (see the node's "
                  "'journalctl -u kubelet', or /var/log/gpunode-kubelet.log on docker nodes)" for name in waiting}


def _delete_node_objects(paths: SimPaths, names: list[str], say: Say) -> None:
    """``kubectl delete node`` for nodes leaving a fleet whose control plane stays up."""
    from lightkube import ApiError
    from lightkube.resources.core_v1 import Node

    try:
        client = controlplane.admin_client(paths.kubeconfig)
        for name in names:
            try:
                client.delete(Node, name)
            except ApiError as error:
                if error.status.code != 404:
                    raise
    except Exception as error:  # noqa: BLE001 - the nodes are stopped either way; their objects go NotReady
        say(f"could not delete the Node objects of {', '.join(names)}: {error}")


def down(paths: SimPaths, say: Say, names: list[str] | None = None) -> list[str]:
    """Stop nodes (all by default) and the repo server; return what could not be cleaned."""
    state = FleetState(paths)
    chosen = names or list(state.data["nodes"])
    unknown = [n for n in chosen if n not in state.data["nodes"]]
    if unknown:
        raise GpunodeError(f"no such node: {', '.join(unknown)}",
                           f"running nodes: {', '.join(state.data['nodes']) or 'none'}")
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(chosen)))) as pool:
        stuck = [line for lines in pool.map(lambda n: _stop_node(paths, state, n), chosen) for line in lines]
    for line in stuck:
        say(f"could not remove cgroup {line}")
    for name in chosen:
        subprocess.run(["ip", "netns", "del", f"gpunode{state.net_block(paths)}-{name}"], capture_output=True,
                       check=False)
        for sock in ("sshd.sock", "kubelet.sock"):
            (paths.node(name) / sock).unlink(missing_ok=True)
        del state.data["nodes"][name]
        state.save()
        say(f"stopped {name}")
    _stop_bastion(paths, state, chosen)
    if state.data["nodes"] and alive(state.data["services"].get("kube-apiserver")):
        _delete_node_objects(paths, chosen, say)
    if not state.data["nodes"]:
        for role in ("supervisor", "repo", *registry.ROLES):
            pid = state.data["services"].pop(role, None)
            if pid:
                stop_processes([NodeProcess(role, pid)])
        controlplane.stop(state.data["services"])
        for role in controlplane.ROLES:
            state.data["services"].pop(role, None)
        controlplane.reset_data(paths)
        for sock in ("apiserver.sock", "registry.sock"):
            (paths.run / sock).unlink(missing_ok=True)
        state.save()
        strays = _stray_processes(paths)
        if strays:
            say(f"stopping {len(strays)} process(es) of this fleet that were not recorded")
            stop_processes([NodeProcess("init" if "nodeinit" in cmd else "stray", pid) for pid, cmd in strays])
        for leftover in (paths.inventory_file,):
            if leftover.exists():
                leftover.unlink()
        remove_unrecorded_cgroups(paths, say)
    return leftovers(paths)


def _stop_node(paths: SimPaths, state: FleetState, name: str) -> list[str]:
    """Stop a node's processes, then remove its kubelet's cgroups; return the cgroups that would not go."""
    stop_processes(state.processes(name))
    try:
        boot_id = json.loads((paths.node(name) / "boot.json").read_text()).get("boot_id") or ""
    except (OSError, ValueError):
        return []
    return remove_cgroups(boot_id) if boot_id else []


def node_entry(state: FleetState, name: str) -> dict:
    """A node's record in the fleet; a clear error for a name the fleet does not have."""
    entry = state.data["nodes"].get(name)
    if entry is None:
        raise GpunodeError(f"no such node: {name}",
                           f"running nodes: {', '.join(state.data['nodes']) or 'none'} (see 'gpunode sim status')")
    return entry


def check_driver_version(version: str) -> None:
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", version):
        raise GpunodeError(f"driver version {version!r} is not a version", "write it like 560.35.03")


def node_profile(entry: dict) -> dict:
    """The node's profile with what was done to it since: injected faults, the driver installed and loaded."""
    profile = load_profile(entry["profile"])
    if "faults" in entry:
        profile = {**profile, "faults": entry["faults"]}
    driver = entry.get("driver")
    if driver:
        profile = {**profile, "driver": {**(profile.get("driver") or {}), "version": driver["version"],
                                         "module_version": driver["module_version"]}}
        if profile.get("nvswitch"):
            profile["nvswitch"] = {**profile["nvswitch"], "fabricmanager_version": driver.get(
                "fabricmanager_version", driver["version"])}
    return profile


def restart_node(paths: SimPaths, name: str, say: Say, faults: list[str] | None = None,
                 driver: str | None = None, fabricmanager: str | None = None) -> FleetReport:
    """Reboot a node (its processes stop, its disk stays), with new injected ``faults`` when given.

    A reboot loads the kernel module of the installed driver; ``driver`` installs
    another one first. ``fabricmanager`` pins the fabric manager's version
    (default: the driver's). Faults and driver changes are kept in the fleet's
    record for later reboots.
    """
    state = FleetState(paths)
    entry = node_entry(state, name)
    if faults is not None:
        unknown = sorted(set(faults) - set(FAULTS))
        if unknown:
            raise GpunodeError(f"unknown fault {unknown[0]!r}", f"faults: {', '.join(FAULTS)}")
        entry["faults"] = faults
    if driver is not None:
        check_driver_version(driver)
    base = load_profile(entry["profile"]).get("driver") or {}
    installed = driver or entry.get("driver", {}).get("version") or str(base.get("version", DEFAULT_DRIVER))
    entry["driver"] = {**entry.get("driver", {}), "version": installed, "module_version": installed,
                       **({"fabricmanager_version": fabricmanager} if fabricmanager else {})}
    state.save()
    profile = node_profile(entry)
    for line in _stop_node(paths, state, name):
        say(f"could not remove cgroup {line}")
    subprocess.run(["ip", "netns", "del", f"gpunode{state.net_block(paths)}-{name}"], capture_output=True,
                   check=False)
    (paths.node(name) / "sshd.sock").unlink(missing_ok=True)
    index = int(entry["address"].rsplit(".", 1)[1])
    spec = NodeSpec(name, index, entry["profile"], profile, state.net_block(paths))
    say(f"rebooting {name}" + (f" with faults: {', '.join(profile.get('faults') or []) or 'none'}"
                               if faults is not None else ""))
    return up(paths, [spec], say)


def install_driver(paths: SimPaths, name: str, version: str, say: Say, fabricmanager: str | None = None) -> None:
    """Install driver ``version``'s user space on a running node without rebooting it.

    The loaded kernel module stays the old one, so the node answers "Driver/library
    version mismatch" until it reboots; nothing that runs there is stopped.
    """
    check_driver_version(version)
    state = FleetState(paths)
    entry = node_entry(state, name)
    gpu_file = Path(f"/proc/{node_pid1(paths, name)}/root/etc/gpunode-sim/gpu.json")
    loaded = json.loads(gpu_file.read_text())["module_version"]
    entry["driver"] = {**entry.get("driver", {}), "version": version, "module_version": loaded,
                       **({"fabricmanager_version": fabricmanager} if fabricmanager else {})}
    state.save()
    with gpu_file.open("w") as handle:  # through the node's own view of its disk
        handle.write(json.dumps(driver_state(name, node_profile(entry)), indent=2) + "\n")
    # the new package's firmware folder, through the node's own view (its /lib link, where it has one, resolved there)
    firmware_links(Path(f"/proc/{node_pid1(paths, name)}/root/lib/firmware/nvidia"), version)
    say(f"{name}: driver {version} installed, kernel module {loaded} still loaded (reboot to load the new one)")


def set_live_faults(paths: SimPaths, name: str, faults: list[str], say: Say) -> None:
    """Give a running node's GPUs the live ``faults`` (and only those: [] clears them) without a reboot, as a running
    driver acquires an ECC error, a reset request or another compute mode; faults injected with a reboot stay."""
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise GpunodeError(f"unknown fault {unknown[0]!r}", f"faults: {', '.join(FAULTS)}")
    boot_only = sorted(set(faults) - set(LIVE_FAULTS))
    if boot_only:
        raise GpunodeError(f"fault {boot_only[0]!r} changes what the node's /dev or /proc hold: it needs a reboot",
                           f"inject it without --live; live faults: {', '.join(LIVE_FAULTS)}")
    state = FleetState(paths)
    entry = node_entry(state, name)
    entry["faults"] = [f for f in entry.get("faults") or [] if f not in LIVE_FAULTS] + faults
    state.save()
    gpu_file = Path(f"/proc/{node_pid1(paths, name)}/root/etc/gpunode-sim/gpu.json")
    current = json.loads(gpu_file.read_text())
    fresh = driver_state(name, node_profile(entry))
    for gpu, new in zip(current["gpus"], fresh["gpus"], strict=True):
        gpu.update({key: new[key] for key in LIVE_FIELDS})
    current["faults"] = fresh["faults"]
    with gpu_file.open("w") as handle:  # through the node's own view of its disk
        handle.write(json.dumps(current, indent=2) + "\n")
    say(f"{name}: live faults now {', '.join(faults) or 'none'} (no reboot)")


def leftovers(paths: SimPaths) -> list[str]:
    """Mounts, network namespaces and processes of the simulator still on the host."""
    found = []
    state_dir = str(paths.state)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4].startswith(state_dir):
            found.append(f"mount {fields[4]}")
    state = FleetState(paths)
    prefix = f"gpunode{state.net_block(paths)}-"
    for ns in sorted(Path("/run/netns").glob(f"{prefix}*")) if Path("/run/netns").exists() else []:
        if ns.name.removeprefix(prefix) not in state.data["nodes"] and not (
                ns.name == Bastion(paths, state.net_block(paths)).netns and state.data.get("bastion")):
            found.append(f"network namespace {ns.name}")
    if not state.data["nodes"]:
        found += [f"process {pid}: {cmdline[:120]}" for pid, cmdline in _stray_processes(paths)]
    for boot_id in unrecorded_boots(paths, state):
        name = cgroup_root_of(boot_id).lstrip("/")
        found += [f"cgroup {c}" for c in sorted(Path("/sys/fs/cgroup").glob(f"*/{name}"))]
    return found


def unrecorded_boots(paths: SimPaths, state: FleetState) -> list[str]:
    """The last boot of each node the fleet no longer records (stopped, or never recorded: its init exited
    before its sshd answered in an ``up`` that failed), whose kubelet cgroups may still be on the host."""
    boots = []
    for plan in sorted((paths.state / "nodes").glob("*/boot.json")):
        if plan.parent.name in state.data["nodes"]:
            continue
        try:
            boot_id = json.loads(plan.read_text()).get("boot_id") or ""
        except (OSError, ValueError):
            continue
        if boot_id:
            boots.append(boot_id)
    return boots


def remove_unrecorded_cgroups(paths: SimPaths, say: Say, root: Path = Path("/sys/fs/cgroup")) -> None:
    """Remove the kubelet cgroups of the nodes the fleet does not record (what :func:`leftovers` would report)."""
    state = FleetState(paths)
    for boot_id in unrecorded_boots(paths, state):
        for line in remove_cgroups(boot_id, root):
            say(f"could not remove cgroup {line}")


def _stray_processes(paths: SimPaths) -> list[tuple[int, str]]:
    """Host processes whose command line names this fleet's state folder (other than this one)."""
    strays = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in (os.getpid(), os.getppid()):
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if f"{paths.state}/" in cmdline and "gpunode" not in cmdline.split()[0]:
            strays.append((int(proc.name), cmdline))
    return strays


def status(paths: SimPaths) -> list[dict]:
    state = FleetState(paths)
    rows = []
    for name, entry in sorted(state.data["nodes"].items()):
        procs = state.processes(name)
        dead = [p.role for p in procs if not p.alive()]
        rows.append({"name": name, "address": entry["address"], "profile": entry["profile"],
                     "runtime": entry["runtime"], "gpus": entry["gpu_count"],
                     "state": "running" if not dead else f"broken ({', '.join(dead)} not running)"})
    return rows


def destroy(paths: SimPaths, say: Say) -> None:
    """Stop everything and delete the fleet's state (the image cache stays)."""
    if paths.fleet_file.exists():
        down(paths, say)
    if paths.state.exists():
        shutil.rmtree(paths.state)
    say(f"removed {paths.state}")


def node_pid1(paths: SimPaths, name: str) -> int:
    """Host PID of a running node's PID 1, for entering its namespaces."""
    state = FleetState(paths)
    node_entry(state, name)
    init = next((p for p in state.processes(name) if p.role == "init"), None)
    pid = init_pid_of(init.pid) if init else None
    if not pid:
        raise GpunodeError(f"{name} is not running", "start it with 'gpunode sim up'")
    return pid

