"""The device plugin's image, run by the real kubelet (v1.35) of a containerd node, on the session fleet.

Runs after tests/test_provisioning.py (file order), which leaves the fleet
bootstrapped with the device plugin rolled out. Everything here goes through
real Kubernetes code: the kubelet's device manager dials the plugin's socket,
streams ListAndWatch, asks GetPreferredAllocation and Allocate for a pod, and
hands the result to containerd over CRI; only the driver is simulated.
"""

from __future__ import annotations

import datetime
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from .conftest import gpunode
from .fleet_ssh import ssh_ok

pytestmark = pytest.mark.fleet
NAMESPACE = "gpunode-system"
NODE = "node01"  # A100 x4, containerd 1.6.20: the real kubelet
RESTARTS, KILLS = 25, 5  # 20 rounds after the warm-up sample show whether anything accumulates


def api(fleet: dict) -> Client:
    kubeconfig = Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "kubeconfig"
    return Client(KubeConfig.from_file(kubeconfig).get("gpunode-sim"), trust_env=False)


def ssh(fleet: dict, command: str, node: str = NODE) -> str:
    return ssh_ok(fleet, node, command)


def wait_for(check: Callable[[], object], timeout: float = 60, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def allocatable(client: Client, node: str = NODE) -> str | None:
    return (client.get(Node, node).status.allocatable or {}).get("nvidia.com/gpu")


def plugin_pod(client: Client, node: str = NODE) -> Pod:
    pods = [p for p in client.list(Pod, namespace=NAMESPACE) if p.spec.nodeName == node
            and p.metadata.deletionTimestamp is None]
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def plugin_process(fleet: dict) -> dict:
    """The plugin's process in the node: pid, threads, open fds, its root's mount options."""
    out = ssh(fleet, "pid=$(pgrep -f 'python3 -m gpunode_plugin' | head -1); echo pid=$pid; "
                     "grep ^Threads: /proc/$pid/status; echo fds=$(ls /proc/$pid/fd | wc -l); "
                     "awk '$5 == \"/\" {print \"root=\" $6}' /proc/$pid/mountinfo; "
                     "test -d /proc/$pid/root/usr/local/lib/python3.11/dist-packages/gpunode_plugin && echo image=yes")
    fields = dict(re.findall(r"^(\w+)[=:]\s*(\S+)", out, re.MULTILINE))
    return {"pid": int(fields["pid"]), "threads": int(fields["Threads"]), "fds": int(fields["fds"]),
            "root": fields.get("root", ""), "image": fields.get("image") == "yes"}


def metrics(fleet: dict, client: Client) -> str:
    return ssh(fleet, f"curl -sf http://{plugin_pod(client).status.podIP}:8081/metrics")


def counter(text: str, name: str) -> int:
    match = re.search(rf'^gpunode_plugin_{name}{{resource="nvidia.com/gpu"}} (\d+)$', text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def test_containerd_nodes_run_the_real_kubelet_and_the_plugin_image_built_here(fleet: dict) -> None:
    client = api(fleet)
    # a kubelet whose runtime did not answer CRI Version at its first status update reports "containerd://Unknown"
    # and fills the version in at a later one (every 10 s): seen once in CI, right after the fleet came up
    wait_for(lambda: client.get(Node, "node01").status.nodeInfo.containerRuntimeVersion != "containerd://Unknown",
             timeout=30, what="node01's kubelet to report its runtime's version")
    info = {n: client.get(Node, n).status.nodeInfo for n in ("node01", "node02", "node03")}
    assert info["node01"].kubeletVersion == "v1.35.4" and info["node03"].kubeletVersion == "v1.35.4"
    assert info["node01"].containerRuntimeVersion == "containerd://1.6.20"
    assert info["node02"].kubeletVersion.endswith("-gpunode-sim")  # docker: the simulator's node agent
    # pulled from the fleet's registry by digest (nothing of gpunode's is side-loaded into the node)
    image = json.loads((Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "inventory.json").read_text())["plugin"]["plugin_image"]
    assert image.startswith("registry.gpunode.test:5000/gpunode/device-plugin@sha256:")
    images = ssh(fleet, "ctr -n k8s.io images ls -q").split()
    assert image in images and not [i for i in images if "gpunode-device-plugin" in i], images
    pod = plugin_pod(client)
    status = pod.status.containerStatuses[0]
    assert status.ready and status.imageID == image  # (.image is the config digest: no tag was pulled)
    process = plugin_process(fleet)
    assert process["image"], "the plugin does not run from the image's root filesystem"
    assert process["root"].startswith("ro"), process  # readOnlyRootFilesystem, as the DaemonSet says
    tree = ssh(fleet, f"ls /proc/{process['pid']}/root/usr/local/lib/python3.11/dist-packages")
    assert "grpc" in tree and "pynvml.py" in tree and "gpunode_plugin" in tree
    # its production backend: nvidia-ml-py over the libnvidia-ml.so.1 the runtime mounted (the simulated driver's)
    maps = ssh(fleet, f"grep -c libnvidia-ml.so.1 /proc/{process['pid']}/maps; "
                      f"tr '\\0' '\\n' < /proc/{process['pid']}/environ | grep -c GPUNODE_PLUGIN_BACKEND || true")
    mapped, backend_env = maps.split()
    assert int(mapped) > 0 and backend_env == "0", maps
    assert allocatable(client) == "4"


def test_a_gpu_pod_gets_its_gpus_through_the_kubelets_device_manager(fleet: dict) -> None:
    client = api(fleet)
    before = metrics(fleet, client)
    run = gpunode("sim", "run", "two-gpus", "--gpus", "2", "--node-selector", f"kubernetes.io/hostname={NODE}",
                  "--", "nvidia-smi", "-L", env=fleet["env"], check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    listed = re.findall(r"UUID: (GPU-[0-9a-f-]+)", run.stdout)
    node_gpus = [g["uuid"] for g in json.loads(ssh(fleet, "cat /etc/gpunode-sim/gpu.json"))["gpus"]]
    assert len(listed) == 2 and set(listed) <= set(node_gpus), run.stdout
    after = metrics(fleet, client)
    assert counter(after, "allocations_total") == counter(before, "allocations_total") + 1
    # the kubelet asked the plugin which two it prefers before allocating (it advertises the option)
    assert counter(after, "preferred_allocations_total") == counter(before, "preferred_allocations_total") + 1
    checkpoint = json.loads(ssh(fleet, "cat /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"))
    entries = checkpoint["Data"]["PodDeviceEntries"] or []
    assert any(sorted(sum(e["DeviceIDs"].values(), [])) == sorted(listed) for e in entries), entries


def test_a_pod_asking_more_gpus_than_the_node_has_is_refused_by_the_scheduler(fleet: dict) -> None:
    run = gpunode("sim", "run", "five-gpus", "--gpus", "5", "--node-selector", f"kubernetes.io/hostname={NODE}",
                  "--timeout", "8", "--", "nvidia-smi", "-L", env=fleet["env"], check=False)
    assert run.returncode != 0
    assert "Insufficient nvidia.com/gpu" in run.stdout + run.stderr


def plugin_args(client: Client) -> list[str]:
    return list(client.get(DaemonSet, "gpunode-device-plugin", namespace=NAMESPACE).spec.template.spec
                .containers[0].args)


def set_plugin_args(client: Client, args: list[str]) -> None:
    """Give the DaemonSet's container these args and wait for node01's new plugin pod to serve every GPU."""
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
    old = plugin_pod(client).metadata.uid
    client.patch(DaemonSet, "gpunode-device-plugin", patch, namespace=NAMESPACE, patch_type=PatchType.JSON)

    def replaced() -> bool:
        pods = [p for p in client.list(Pod, namespace=NAMESPACE) if p.spec.nodeName == NODE]
        return len(pods) == 1 and pods[0].metadata.uid != old and bool(pods[0].status.containerStatuses) \
            and pods[0].status.containerStatuses[0].ready

    wait_for(replaced, 90, "the plugin pod replaced and ready")
    wait_for(lambda: allocatable(client) == "4", 30, "allocatable back to 4")


@pytest.mark.parametrize("strategy", ["volume-mounts", "envvar"])
def test_allocate_for_each_device_list_strategy(fleet: dict, strategy: str) -> None:
    client = api(fleet)
    rendered = plugin_args(client)
    chosen = [a for a in rendered if not a.startswith("--device-list-strategy=")]
    chosen.append(f"--device-list-strategy={strategy}")
    if chosen != rendered:
        set_plugin_args(client, chosen)
    config = "/etc/nvidia-container-runtime/config.toml"
    try:
        command = ["sh", "-c", "nvidia-smi -L; echo visible=$NVIDIA_VISIBLE_DEVICES; "
                               "ls /var/run/nvidia-container-devices 2>/dev/null; true"]
        if strategy == "volume-mounts":
            # NVIDIA's hook takes devices from mounts only when its config says so (false by default): it passes
            # the mount root on as a device, and nvidia-container-cli refuses it (NVIDIA's toolkit issue 108)
            refused = gpunode("sim", "run", "list-unaccepted", "--gpus", "1", "--node-selector",
                              f"kubernetes.io/hostname={NODE}", "--timeout", "30", "--", *command, env=fleet["env"],
                              check=False)
            assert "nvidia-container-cli: device error: /var/run/nvidia-container-devices: unknown device" in \
                refused.stdout + refused.stderr, refused.stdout + refused.stderr
            client.delete(Pod, "list-unaccepted", namespace="default", grace_period=0)
            ssh(fleet, f"cp -a {config} {config}.before-test && nvidia-ctk config --in-place --config-file={config} "
                       "--set accept-nvidia-visible-devices-as-volume-mounts=true")  # what the deploy sets for it
        run = gpunode("sim", "run", f"list-{strategy}", "--gpus", "1", "--node-selector",
                      f"kubernetes.io/hostname={NODE}", "--", *command, env=fleet["env"], check=False)
        assert run.returncode == 0, run.stdout + run.stderr
        uuids = re.findall(r"UUID: (GPU-[0-9a-f-]+)", run.stdout)
        assert len(uuids) == 1, run.stdout
        if strategy == "envvar":
            assert f"visible={uuids[0]}" in run.stdout
        else:  # the device list travels as mounts under /var/run/nvidia-container-devices, the variable names it
            assert "visible=/var/run/nvidia-container-devices" in run.stdout
            assert re.search(rf"^{uuids[0]}$", run.stdout, re.MULTILINE), run.stdout
    finally:
        if plugin_args(client) != rendered:  # the deploy's own args again, in its order: no drift left behind
            set_plugin_args(client, rendered)
        ssh(fleet, f"if [ -e {config}.before-test ]; then mv {config}.before-test {config}; fi")


def klog_time(line: str) -> float:
    """The UTC time of a klog line (``I1201 15:12:41.096365 ...``), this year."""
    stamp = re.match(r"[IWE](\d{4} \d\d:\d\d:\d\d\.\d+)", line)
    assert stamp, line
    year = datetime.datetime.now(datetime.UTC).year
    moment = datetime.datetime.strptime(f"{year}{stamp.group(1)}", "%Y%m%d %H:%M:%S.%f")
    return moment.replace(tzinfo=datetime.UTC).timestamp()


RESTART = """
old=$(pgrep -x kubelet)
if [ "$1" = kill ]; then kill -KILL $old; while kill -0 $old 2>/dev/null; do sleep 0.05; done; systemctl start kubelet
else systemctl restart kubelet; fi
new=$(pgrep -x kubelet)
for i in $(seq 1 200); do
  line=$(journalctl -u kubelet | grep " $new server.go.*Got registration request from device plugin" | tail -1)
  [ -n "$line" ] && break
  sleep 0.05
done
echo "pid=$new"
echo "socket=$(date -r /var/lib/kubelet/device-plugins/kubelet.sock +%s.%N)"
echo "registered=$line"
"""


def test_kubelet_restarts_and_kills_lose_no_gpu_and_leak_nothing(fleet: dict) -> None:
    """The seed's own failure: "GPUs vanish from the node until the plugin is restarted". Not here."""
    client = api(fleet)
    holder = "holds-a-gpu"
    client.create(Pod.from_dict({
        "metadata": {"name": holder, "namespace": "default"},
        "spec": {"restartPolicy": "Never", "runtimeClassName": "nvidia", "nodeSelector": {
            "kubernetes.io/hostname": NODE}, "containers": [{
                "name": "main", "image": "gpunode-workload:1", "command": ["sleep", "100000"],
                "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}))
    wait_for(lambda: client.get(Pod, holder, namespace="default").status.phase == "Running", 60, "GPU pod running")
    held = client.get(Pod, holder, namespace="default").status.containerStatuses[0]
    plugin_before = plugin_pod(client).status.containerStatuses[0]
    first = plugin_process(fleet)
    latencies, samples = [], []
    script = ssh(fleet, f"cat > /tmp/restart-kubelet <<'EOF'\n{RESTART}\nEOF\nchmod +x /tmp/restart-kubelet; echo ok")
    assert script.strip() == "ok"
    for round_ in range(RESTARTS + KILLS):
        out = ssh(fleet, f"sh /tmp/restart-kubelet {'kill' if round_ >= RESTARTS else 'restart'}")
        fields = dict(re.findall(r"^(\w+)=(.*)$", out, re.MULTILINE))
        assert fields["registered"], f"round {round_}: the plugin did not register with kubelet {fields['pid']}"
        latencies.append(klog_time(fields["registered"]) - float(fields["socket"]))
        wait_for(lambda: allocatable(client) == "4", 30, f"round {round_}: allocatable back to 4")
        if round_ % 10 == 9 or round_ == 0:
            samples.append(plugin_process(fleet))
    last = plugin_process(fleet)
    print(f"re-registration after a real kubelet restart, {len(latencies)} rounds: "
          f"p50 {sorted(latencies)[len(latencies) // 2] * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms")
    assert max(latencies) < 1.0, latencies
    assert last["pid"] == first["pid"], "the plugin process was restarted"
    assert plugin_pod(client).status.containerStatuses[0].restartCount == plugin_before.restartCount
    # after warm-up, the same threads and descriptors: nothing accumulates per kubelet restart
    assert last["threads"] <= samples[1]["threads"] + 1 and last["fds"] <= samples[1]["fds"] + 2, samples
    now = client.get(Pod, holder, namespace="default").status.containerStatuses[0]
    assert now.containerID == held.containerID and now.restartCount == 0 and now.state.running, now
    client.delete(Pod, holder, namespace="default", grace_period=0)


def test_an_xid_makes_the_kubelet_offer_one_gpu_less_until_the_plugin_restarts(fleet: dict) -> None:
    client = api(fleet)
    gpu = json.loads(ssh(fleet, "cat /etc/gpunode-sim/gpu.json"))["gpus"][2]["uuid"]
    started = time.monotonic()
    ssh(fleet, f"echo '{gpu} 79' >> /run/gpunode-sim/events/health-events")  # through NVML's event set
    wait_for(lambda: allocatable(client) == "3", 30, "allocatable 3 after Xid 79")
    print(f"Xid 79 to allocatable 3 through NVML events and the kubelet: {time.monotonic() - started:.2f} s")
    assert client.get(Node, NODE).status.capacity["nvidia.com/gpu"] == "4"
    assert f'gpunode_plugin_last_xid{{gpu="{gpu}"}} 79' in metrics(fleet, client)
    client.delete(Pod, plugin_pod(client).metadata.name, namespace=NAMESPACE)  # a new plugin: a fresh view
    wait_for(lambda: allocatable(client) == "4", 90, "allocatable 4 with a new plugin pod")
