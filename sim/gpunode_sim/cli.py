"""``gpunode sim``: bring the simulated GPU fleet up and down, look at it, get into it."""

from __future__ import annotations

import json
import os
import shutil
import sys

import click

from gpunode.errors import GpunodeError
from gpunode_sim import fleet
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.spec.gpus import FAULTS, LIVE_FAULTS, MODELS
from gpunode_sim.spec.profiles import OPERATING_SYSTEMS, builtin_profiles, plan_fleet


def say(message: str) -> None:
    click.echo(f"  {message}", err=True)


@click.group()
def sim() -> None:
    """A fleet of simulated GPU nodes on this machine (root; Debian/Ubuntu host).

    Each node is a real Debian 12 userspace with its own sshd (127.0.10.N:22), apt and
    container runtime; only the NVIDIA driver layer and the toolkit apt repository are
    stand-ins. The control plane is real Kubernetes (etcd, kube-apiserver,
    kube-controller-manager, kube-scheduler on 127.0.10.254), built once per machine by
    'gpunode sim build'. State lives in /var/lib/gpunode/sim (GPUNODE_SIM_DIR), cached images in
    /var/cache/gpunode (GPUNODE_CACHE_DIR).

    \b
    Examples:
      gpunode sim up                          # node01 A100x4/containerd, node02 V100x2/docker, node03 CPU
      gpunode sim up -n 20                    # 20 nodes cycling the built-in profiles
      gpunode sim up --profile node03=h100x8-nvswitch
      gpunode sim status
      ssh -F /var/lib/gpunode/sim/ssh/config node01 nvidia-smi -L
      gpunode sim down
    """


@sim.command(name="build")
def build() -> None:
    """Build the fleet's real components once: Kubernetes (etcd, kube-apiserver, -controller-manager,
    -scheduler, kubectl), the nodes' kubelet and pause, NVIDIA's nvidia-ctk at each simulated toolkit
    version, and the device plugin's image.

    From the Go module proxy with the machine's Go, into the image cache
    (/var/cache/gpunode/kubernetes-vX.Y.Z, kubelet-vX.Y.Z, nvidia-ctk-vX.Y.Z); a later run finds them
    there at once. The plugin image (Debian slim with Python, the plugin and its pinned dependencies;
    no Docker engine needed) lands in plugin-image-<inputs>/image.tar and is rebuilt, in seconds, when
    plugin/ changes; 'gpunode sim up' pushes it to the fleet's registry.

    \b
    Example:
      gpunode sim build
    """
    from gpunode_sim.build import kubernetes, nvml_build, toolkit_build
    from gpunode_sim.images import plugin_image
    from gpunode_sim.registry import server as registry

    cache = SimPaths.from_env().cache
    click.echo(str(kubernetes.ensure_built(cache, say)))
    click.echo(str(kubernetes.ensure_node_built(cache, say)))
    for binary in toolkit_build.ensure_built(cache, say).values():
        click.echo(str(binary))
    click.echo(str(registry.ensure_binary(cache, say)))
    click.echo(str(nvml_build.ensure_built(cache, say)))
    image = plugin_image.ensure_built(cache, say)
    described = plugin_image.describe(image)
    click.echo(f"{image / plugin_image.ARCHIVE}  {described['name']}  {described['digest']}  "
               f"{described['archive_bytes'] / 2**20:.0f} MiB")


@sim.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def kubectl(args: tuple[str, ...]) -> None:
    """Run the fleet's kubectl (built with its control plane) against its kubeconfig.

    \b
    Examples:
      gpunode sim kubectl get nodes -L accelerator,nvidia.com/gpu.product
      gpunode sim kubectl get pods -A -o wide
      gpunode sim kubectl --context gpunode-sim-viewer auth can-i list nodes
    """
    from gpunode_sim.build.kubernetes import require

    paths = SimPaths.from_env()
    if not paths.kubeconfig.exists():
        raise GpunodeError("no simulated control plane is running", "start the fleet with 'gpunode sim up'")
    binary = require(paths.cache) / "kubectl"
    os.execv(binary, [str(binary), "--kubeconfig", str(paths.kubeconfig), *args])


@sim.command()
@click.option("-n", "--nodes", "count", type=int, default=None, help="Number of nodes (default 3).")
@click.option("--fleet", "fleet_file", type=click.Path(dir_okay=False), default=None,
              help="YAML fleet file: 'nodes: {node01: a100x4-containerd, ...}'.")
@click.option("--profile", "overrides", multiple=True, metavar="NODE=PROFILE",
              help="Give NODE another profile (a built-in name or a YAML file); repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def up(count: int | None, fleet_file: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Start the simulated fleet and print how to reach it.

    \b
    Examples:
      gpunode sim up
      gpunode sim up -n 4 --profile node04=h100x8-nvswitch
      gpunode sim up --fleet my-fleet.yaml
    Built-in profiles: see 'gpunode sim profiles'.
    """
    paths = SimPaths.from_env()
    specs = plan_fleet(count, fleet_file, list(overrides), paths.net_block)
    try:
        report = fleet.up(paths, specs, say)
    except KeyboardInterrupt:
        click.echo("gpunode sim: interrupted; stopping what was started", err=True)
        fleet.down(paths, say)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps({"ssh_config": str(report.ssh_config), "inventory": str(report.inventory),
                               "nodes": [vars(n) for n in report.nodes]}, indent=2))
    else:
        click.echo(f"{'NODE':<8} {'ADDRESS':<13} {'PROFILE':<20} {'RUNTIME':<11} STATE")
        for node in report.nodes:
            click.echo(f"{node.name:<8} {node.address:<13} {node.profile:<20} {node.runtime:<11} "
                       f"{'FAILED' if node.error else 'up'}")
        click.echo(f"\nssh config: {report.ssh_config}   (ssh -F {report.ssh_config} node01 nvidia-smi -L)")
        click.echo(f"inventory:  {report.inventory}   (pyinfra inventories/sim.py exec -- nvidia-smi -L)")
    for node in report.failed:
        click.echo(f"\n{node.name} failed: {node.error}\n--- console log of {node.name} ---\n{node.console}",
                   err=True)
    if report.failed:
        sys.exit(1)


@sim.command()
@click.argument("nodes", nargs=-1)
@click.option("--purge", is_flag=True, help="Also delete the fleet's state folder (images stay cached).")
def down(nodes: tuple[str, ...], purge: bool) -> None:
    """Stop the fleet (or the named nodes): nothing stays mounted or running.

    \b
    Examples:
      gpunode sim down
      gpunode sim down node02
      gpunode sim down --purge
    """
    paths = SimPaths.from_env()
    if not paths.fleet_file.exists():
        click.echo("gpunode sim: no fleet is running", err=True)
        left = []
        if paths.state.exists():
            fleet.remove_unrecorded_cgroups(paths, say)
            left = fleet.leftovers(paths)
    else:
        left = fleet.down(paths, say, list(nodes) or None)
    if purge and not nodes:
        fleet.destroy(paths, say)
    if left:
        raise GpunodeError("left behind on the host: " + "; ".join(left),
                           "run 'gpunode sim down' again; report it if it stays")


@sim.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(as_json: bool) -> None:
    """Show the fleet's nodes and whether each is running.

    \b
    Example:
      gpunode sim status
    """
    rows = fleet.status(SimPaths.from_env())
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no simulated fleet is running (start one with 'gpunode sim up')")
        return
    click.echo(f"{'NODE':<8} {'ADDRESS':<13} {'PROFILE':<20} {'RUNTIME':<11} {'GPUS':<5} STATE")
    for row in rows:
        click.echo(f"{row['name']:<8} {row['address']:<13} {row['profile']:<20} {row['runtime']:<11} "
                   f"{row['gpus']:<5} {row['state']}")
    if any(row["state"] != "running" for row in rows):
        sys.exit(1)


@sim.command(context_settings={"ignore_unknown_options": True})
@click.argument("node")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def ssh(node: str, command: tuple[str, ...]) -> None:
    """Open SSH to a node, or run COMMAND there (host keys checked).

    \b
    Examples:
      gpunode sim ssh node01
      gpunode sim ssh node01 nvidia-smi -L
    """
    paths = SimPaths.from_env()
    fleet.node_pid1(paths, node)  # clear error for unknown or stopped nodes
    ssh_bin = shutil.which("ssh")
    if not ssh_bin:
        raise GpunodeError("ssh is not installed", "apt-get install openssh-client")
    os.execv(ssh_bin, [ssh_bin, "-F", str(paths.ssh_config), node, *command])


@sim.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(node: str, command: tuple[str, ...]) -> None:
    """Run COMMAND inside a node's namespaces without SSH (works when sshd is broken).

    \b
    Examples:
      gpunode sim exec node01 -- systemctl status containerd
      gpunode sim exec node02 -- cat /etc/docker/daemon.json
    """
    pid = fleet.node_pid1(SimPaths.from_env(), node)
    nsenter = shutil.which("nsenter") or "nsenter"
    os.execv(nsenter, [nsenter, "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w",
                       "env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                       "HOME=/root", *command])


@sim.command()
@click.argument("node")
@click.argument("faults", nargs=-1)
@click.option("--clear", is_flag=True, help="Remove every injected fault (with --live: the live ones).")
@click.option("--live", is_flag=True, help="No reboot: faults a running driver acquires (" + ", ".join(LIVE_FAULTS)
              + ").")
def fault(node: str, faults: tuple[str, ...], clear: bool, live: bool) -> None:
    """Inject driver-layer FAULTS into NODE and reboot it (its disk is kept), or --clear them.

    \b
    Examples:
      gpunode sim fault node01 driver-not-loaded
      gpunode sim fault node01 --clear
      gpunode sim fault node01 ecc-uncorrectable --live
      gpunode sim fault node01 --clear --live
    Faults: see 'gpunode sim profiles'.
    """
    if not faults and not clear:
        raise GpunodeError("name a fault or give --clear", "faults: " + ", ".join(FAULTS))
    if live:
        fleet.set_live_faults(SimPaths.from_env(), node, [] if clear else list(faults), say)
        return
    report = fleet.restart_node(SimPaths.from_env(), node, say, [] if clear else list(faults))
    if report.failed:
        raise GpunodeError(f"{node} did not come back: {report.failed[0].error}", report.failed[0].console)


@sim.command()
@click.argument("node")
@click.option("--version", "version", required=True, help="Driver version to install, e.g. 560.35.03.")
@click.option("--no-reboot", is_flag=True, help="Install only: the old kernel module stays loaded (a mismatch).")
@click.option("--fabricmanager-version", help="Leave the fabric manager at this version (default: the driver's).")
def driver(node: str, version: str, no_reboot: bool, fabricmanager_version: str | None) -> None:
    """Install another NVIDIA driver on NODE, then reboot it (or not, with --no-reboot).

    Without a reboot the node runs the old kernel module under the new user space and
    nvidia-smi answers "Driver/library version mismatch", as a real node does until it
    reboots ('gpunode sim reboot NODE' then loads the new module).

    \b
    Examples:
      gpunode sim driver node01 --version 560.35.03 --no-reboot
      gpunode sim reboot node01
    """
    if no_reboot:
        fleet.install_driver(SimPaths.from_env(), node, version, say, fabricmanager_version)
        return
    report = fleet.restart_node(SimPaths.from_env(), node, say, driver=version, fabricmanager=fabricmanager_version)
    if report.failed:
        raise GpunodeError(f"{node} did not come back: {report.failed[0].error}", report.failed[0].console)


@sim.command()
@click.argument("node")
def reboot(node: str) -> None:
    """Reboot NODE: its processes stop and start again, its disk stays (as a real reboot).

    \b
    Example:
      gpunode sim reboot node02
    """
    report = fleet.restart_node(SimPaths.from_env(), node, say)
    if report.failed:
        raise GpunodeError(f"{node} did not come back: {report.failed[0].error}", report.failed[0].console)


@sim.command()
def profiles() -> None:
    """List the built-in node profiles, GPU models and injectable faults.

    \b
    Example:
      gpunode sim profiles
    """
    click.echo("profiles: " + ", ".join(builtin_profiles()))
    click.echo("node os: " + ", ".join(f"{k} ({suite})" for k, suite in OPERATING_SYSTEMS.items()))
    click.echo("gpu models: " + ", ".join(f"{k} ({m.product_name})" for k, m in MODELS.items()))
    click.echo("faults:")
    for name, meaning in FAULTS.items():
        click.echo(f"  {name}: {meaning}")


@sim.command()
@click.option("--context", default="gpunode-sim", show_default=True, help="Context of the fleet's kubeconfig.")
def cluster(context: str) -> None:
    """Show the simulated control plane as kubectl would: nodes with GPU labels and allocatable GPUs, plugin pods.

    \b
    Example:
      gpunode sim cluster
    """
    from lightkube import Client, KubeConfig
    from lightkube.resources.apps_v1 import DaemonSet
    from lightkube.resources.core_v1 import Node, Pod

    paths = SimPaths.from_env()
    if not paths.kubeconfig.exists():
        raise GpunodeError("no simulated control plane is running", "start the fleet with 'gpunode sim up'")
    client = Client(KubeConfig.from_file(paths.kubeconfig).get(context), trust_env=False)
    click.echo(f"{'NODE':8} {'GPUS':>5}  LABELS (accelerator, nvidia.com/gpu.product, gpu.count)")
    for node in client.list(Node):
        labels = node.metadata.labels or {}
        gpus = (node.status.allocatable or {}).get("nvidia.com/gpu", "-")
        shown = ", ".join(labels[k] for k in ("accelerator", "nvidia.com/gpu.product", "nvidia.com/gpu.count")
                          if k in labels) or "(no GPU labels)"
        click.echo(f"{node.metadata.name:8} {gpus:>5}  {shown}")
    for ds in client.list(DaemonSet, namespace="*"):
        status = ds.status
        click.echo(f"\ndaemonset {ds.metadata.namespace}/{ds.metadata.name}: desired {status.desiredNumberScheduled}, "
                   f"updated {status.updatedNumberScheduled or 0}, ready {status.numberReady}")
    for pod in client.list(Pod, namespace="*"):
        state = (pod.status.containerStatuses or [None])[0]
        click.echo(f"  pod {pod.metadata.name} on {pod.spec.nodeName}: {pod.status.phase}, "
                   f"ready={bool(state and state.ready)}, restarts={state.restartCount if state else 0}")


@sim.command(name="run", context_settings={"ignore_unknown_options": True})
@click.argument("name")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--gpus", type=int, default=1, show_default=True, help="limits nvidia.com/gpu of the container.")
@click.option("--runtime-class", default="nvidia", show_default=True, help="runtimeClassName ('' for none).")
@click.option("--node-selector", multiple=True, metavar="KEY=VALUE", help="nodeSelector entry; repeatable.")
@click.option("--namespace", default="default", show_default=True)
@click.option("--timeout", type=float, default=60, show_default=True, help="Seconds to wait for the pod to end.")
@click.option("--run-as-user", type=int, help="securityContext.runAsUser of the container (a non-root user).")
@click.option("--env", "env_vars", multiple=True, metavar="KEY=VALUE",
              help="Environment of the container (e.g. NVIDIA_REQUIRE_CUDA=cuda>=12.6); repeatable.")
def run_pod(name: str, command: tuple[str, ...], gpus: int, runtime_class: str, node_selector: tuple[str, ...],
            namespace: str, timeout: float, run_as_user: int | None, env_vars: tuple[str, ...]) -> None:
    """Run a pod on the simulated cluster (like kubectl run), wait for it and print its output.

    The container uses the fleet's local image (busybox and a CUDA-style probe, cuda-probe).

    \b
    Examples:
      gpunode sim run gpu-test -- nvidia-smi -L
      gpunode sim run probe --runtime-class '' -- cuda-probe
    """
    import time

    from lightkube import ApiError, Client, KubeConfig
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Event, Namespace, Pod

    paths = SimPaths.from_env()
    if not paths.kubeconfig.exists():
        raise GpunodeError("no simulated control plane is running", "start the fleet with 'gpunode sim up'")
    client = Client(KubeConfig.from_file(paths.kubeconfig), trust_env=False)
    client.apply(Namespace(apiVersion="v1", kind="Namespace", metadata=ObjectMeta(name=namespace)),
                 field_manager="gpunode-sim")
    container = {"name": "main", "image": "gpunode-workload:1", "command": list(command) or ["cuda-probe"]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    if run_as_user is not None:
        container["securityContext"] = {"runAsUser": run_as_user}
    bad = [item for item in env_vars if "=" not in item]
    if bad:
        raise GpunodeError(f"--env {bad[0]!r} is not KEY=VALUE", "write it like --env NVIDIA_REQUIRE_CUDA=cuda>=12.6")
    if env_vars:
        container["env"] = [{"name": k, "value": v} for k, v in (item.split("=", 1) for item in env_vars)]
    spec: dict = {"restartPolicy": "Never", "containers": [container]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if node_selector:
        spec["nodeSelector"] = dict(item.split("=", 1) for item in node_selector)
    try:
        client.create(Pod.from_dict({"apiVersion": "v1", "kind": "Pod",
                                     "metadata": {"name": name, "namespace": namespace}, "spec": spec}))
    except ApiError as error:
        raise GpunodeError(f"the API refused the pod: {error.status.message}") from error
    deadline = time.monotonic() + timeout
    pod = client.get(Pod, name, namespace=namespace)
    while pod.status.phase not in ("Succeeded", "Failed") and time.monotonic() < deadline:
        time.sleep(0.5)
        pod = client.get(Pod, name, namespace=namespace)
    click.echo(f"pod {namespace}/{name} on {pod.spec.nodeName or '(not scheduled)'}: {pod.status.phase}")
    for event in client.list(Event, namespace=namespace, fields={"involvedObject.name": name}):
        if event.type == "Warning":
            click.echo(f"  {event.reason}: {event.message}")
    if pod.status.phase in ("Succeeded", "Failed"):
        click.echo("".join(client.log(name, namespace=namespace)), nl=False)
    sys.exit(0 if pod.status.phase == "Succeeded" else 1)
