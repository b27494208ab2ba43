"""How a simulated node's kubelet runs a workload pod: allocate devices, resolve the runtime, run the container.

Runs inside the node (the node agent calls it). Devices come from the device
plugin through the kubelet stand-in's Allocate; the RuntimeClass handler is
looked up in the node's EFFECTIVE containerd config (``containerd config dump``)
as the CRI plugin does, so a missing handler fails with CRI's words; the
container runs for real with ``ctr run`` and that runtime's binary (docker
nodes: ``docker run --runtime``), from the locally built workload image.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field

from gpunode_sim.guest.device_manager import KubeletStandin
from gpunode_sim.images.workload_image import IMAGE_NAME

IMAGE_ARCHIVE = "/usr/lib/gpunode-sim/workload-image.tar"
ROOTFS_ARCHIVE = "/usr/lib/gpunode-sim/workload-rootfs.tar"
DOCKER_IMAGE = "gpunode-workload:1"
CRI_TABLES = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")  # containerd config version 2, 3


@dataclass
class Outcome:
    """What the kubelet reports for a workload pod's container."""

    phase: str  # Running, Succeeded, Failed, Pending
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    log: str = ""
    devices: dict[str, list[str]] = field(default_factory=dict)


class DeviceAdmissionError(Exception):
    pass


def allocate(kubelet: KubeletStandin, limits: dict, taken: set[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Devices for the pod's extended resources and the environment Allocate returns; as the kubelet's manager."""
    env: dict[str, str] = {}
    chosen: dict[str, list[str]] = {}
    for resource, count in sorted(limits.items()):
        if not resource.startswith("nvidia.com/"):
            continue
        plugin = kubelet.plugins.get(resource)
        healthy = sorted(i for i, h in (plugin.devices.items() if plugin else []) if h == "Healthy")
        free = [i for i in healthy if i not in taken]
        if len(free) < int(count):
            raise DeviceAdmissionError(f"Allocate failed due to requested number of devices unavailable for "
                                       f"{resource}. Requested: {count}, Available: {len(free)}, which is unexpected")
        ids = free[:int(count)]
        if plugin.options.get_preferred_allocation_available:
            ids = kubelet.preferred(resource, free, [], int(count))
        response = kubelet.allocate(resource, ids)
        for container in response.container_responses:
            env.update(container.envs)
        chosen[resource] = ids
        taken.update(ids)
    return env, chosen


def _run(argv: list[str], timeout: float | None) -> subprocess.CompletedProcess[str]:
    """A command of the node's kubelet, never on the kubelet's stdin (``ctr run`` would read it as the
    container's input)."""
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                          check=False)


def containerd_runtime(handler: str) -> tuple[str | None, str]:
    """(the runc binary of ``handler`` in the effective containerd config, or None; the error when None)."""
    dump = _run(["containerd", "config", "dump"], 30)
    try:
        config = tomllib.loads(dump.stdout)
    except tomllib.TOMLDecodeError as error:
        return None, f"containerd config dump does not parse: {error}"
    plugins = config.get("plugins", {})
    cri = next((plugins[t]["containerd"] for t in CRI_TABLES if "containerd" in plugins.get(t, {})), {})
    name = handler or cri.get("default_runtime_name", "runc")
    runtime = (cri.get("runtimes") or {}).get(name)
    if runtime is None:
        return None, ("Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: "
                      f'no runtime for "{name}" is configured')
    return (runtime.get("options") or {}).get("BinaryName") or "runc", ""


def _boot() -> str:
    with open("/proc/sys/kernel/random/boot_id") as handle:  # the node's own (bound per boot)
        return handle.read().strip()[:8]


def run_containerd(pod: str, command: list[str], env: dict[str, str], handler: str) -> Outcome:
    binary, error = containerd_runtime(handler)
    if binary is None:
        return Outcome("Pending", reason="FailedCreatePodSandBox", message=error)
    images = _run(["ctr", "-n", "k8s.io", "images", "ls", "-q"], 30)
    if IMAGE_NAME not in images.stdout.split():
        _run(["ctr", "-n", "k8s.io", "images", "import", IMAGE_ARCHIVE], 60)
    # a cgroup of its own, flat and unique to this boot: nodes of every fleet share the host's cgroup tree, and
    # ctr's default (/k8s.io/<container id>) would collide between two nodes running pods of the same name
    argv = ["ctr", "-n", "k8s.io", "run", "--rm", "--runc-binary", binary, "--cgroup", f"/gpunode-{_boot()}-{pod}"]
    for key, value in sorted(env.items()):
        argv += ["--env", f"{key}={value}"]
    return _finish(_run([*argv, IMAGE_NAME, pod, *command], None))  # runs until it ends or is killed


def run_docker(pod: str, command: list[str], env: dict[str, str], handler: str) -> Outcome:
    images = _run(["docker", "images", "-q", DOCKER_IMAGE], 30)
    if not images.stdout.strip():
        _run(["docker", "import", ROOTFS_ARCHIVE, DOCKER_IMAGE], 60)
    argv = ["docker", "run", "--rm", "--name", pod]
    if handler:
        argv += ["--runtime", handler]
    for key, value in sorted(env.items()):
        argv += ["--env", f"{key}={value}"]
    result = _run([*argv, DOCKER_IMAGE, *command], None)  # runs until it ends or is killed
    if result.returncode == 125:  # docker's own failure (unknown runtime...), not the container's
        return Outcome("Pending", reason="FailedCreatePodSandBox", message=result.stderr.strip())
    return _finish(result)


def _finish(result: subprocess.CompletedProcess[str]) -> Outcome:
    log = result.stdout + result.stderr
    if result.returncode == 0:
        return Outcome("Succeeded", 0, "Completed", log=log)
    return Outcome("Failed", result.returncode, "Error", log=log)


def admit(kubelet: KubeletStandin, container: dict, taken: set[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The container's environment with what Allocate returned, and the devices it got (DeviceAdmissionError)."""
    limits = (container.get("resources") or {}).get("limits") or {}
    alloc_env, devices = allocate(kubelet, limits, set(taken))
    env = {e["name"]: str(e.get("value", "")) for e in container.get("env") or []}
    env.update(alloc_env)
    return env, devices


def kill(pod: str) -> None:
    """Stop a running workload container (its pod was deleted): the kubelet kills what it no longer wants."""
    if shutil.which("dockerd"):
        _run(["docker", "kill", pod], 30)
    else:
        _run(["ctr", "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", pod], 30)


def launch(pod: str, container: dict, env: dict[str, str], handler: str) -> Outcome:
    """Run the container to its end (restartPolicy Never) with the node's runtime."""
    command = [*(container.get("command") or []), *(container.get("args") or [])] or ["sh", "-c", "true"]
    runner = run_docker if shutil.which("dockerd") else run_containerd
    try:
        return runner(pod, command, env, handler)
    except subprocess.TimeoutExpired as error:  # importing the image, not the container itself (it has no limit)
        return Outcome("Pending", reason="FailedCreatePodSandBox",
                       message=f"{' '.join(map(str, error.cmd))} timed out after {error.timeout:.0f} s")
