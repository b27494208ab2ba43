"""Diagnosis of the device-plugin step: the plugin runs on the node and the node offers all its GPUs."""

from __future__ import annotations

from gpunode.diagnosis import Finding, Severity
from gpunode.facts.device_plugin import DAEMONSET, PluginPodState, RolloutState
from gpunode.facts.labels import NodeLabelsState

STEP = "device_plugin"
RESOURCE = "nvidia.com/gpu"
PRESENT = "nvidia.com/gpu.present"


def allocatable_gpus(node: NodeLabelsState) -> int:
    try:
        return int(node.allocatable.get(RESOURCE, "0"))
    except ValueError:
        return 0


def crash_fix(pod: PluginPodState, namespace: str) -> str:
    """The fix the plugin's own last words point at."""
    said = " ".join(pod.log_tail)
    if "socket directory" in said:
        return ("the DaemonSet must mount the host's /var/lib/kubelet/device-plugins (hostPath, type Directory) and "
                "run as root: re-run deploys/device_plugin.py (gpunode's manifest does both)")
    if "NVML" in said or "nvml" in said or "driver" in said:
        return "the plugin cannot initialise NVML: fix the driver on this node first (gpunode verify, driver step)"
    return f"kubectl -n {namespace} logs {pod.name} --previous"


def sandbox_fix(event: str, namespace: str, pod: str) -> str:
    """The fix a FailedCreatePodSandBox event points at."""
    if "no runtime for" in event:
        return ("the node's runtime has no handler for the pod's RuntimeClass (nvidia): re-run deploys/runtime.py "
                "on that node (gpunode verify names its runtime step)")
    return f"kubectl -n {namespace} describe pod {pod} (the runtime's own error is quoted above)"


def diagnose(rollout: RolloutState, pod: PluginPodState, node: NodeLabelsState, expected: int,
             namespace: str) -> list[Finding]:
    """Why ``node`` does not offer ``expected`` GPUs, first cause first; [] when it does."""
    have = allocatable_gpus(node)
    if have == expected:
        return []
    what = f"{node.name} offers {have} allocatable {RESOURCE}, its driver sees {expected}"
    evidence = [f"kubectl get node {node.name} -o jsonpath='{{.status.allocatable}}': "
                f"{RESOURCE}={node.allocatable.get(RESOURCE, '<none>')}"]
    if not rollout.exists:
        return [Finding(STEP, Severity.FAIL, f"{what}: the device plugin is not deployed", evidence +
                        [f"daemonset {namespace}/{DAEMONSET}: NotFound"], "run deploys/device_plugin.py",
                        code="plugin-missing")]
    if not pod.exists:
        present = node.labels.get(PRESENT)
        return [Finding(STEP, Severity.FAIL, f"{what}: no device-plugin pod runs there", evidence +
                        [f"{PRESENT}={present or '<missing>'} (the DaemonSet's nodeSelector wants true)"],
                        "run deploys/labels.py (it sets nvidia.com/gpu.present=true on GPU nodes)"
                        if present != "true" else f"kubectl -n {namespace} describe daemonset {DAEMONSET}",
                        code="plugin-not-scheduled")]
    pod_evidence = [f"pod {namespace}/{pod.name}: {pod.phase}" + (f", {pod.waiting}" if pod.waiting else "")
                    + f", ready={str(pod.ready).lower()}, restarts={pod.restarts}"
                    + (f", last exit code {pod.last_exit}" if pod.last_exit is not None else "")]
    pod_evidence += [f"log: {line}" for line in pod.log_tail if line.strip()]
    pod_evidence += [f"event {line}" for line in pod.warnings]
    sandbox = next((w for w in pod.warnings if w.startswith("FailedCreatePodSandBox")), None)
    if sandbox and not pod.ready and not pod.restarts:
        return [Finding(STEP, Severity.FAIL, f"{what}: the device plugin's pod cannot start there (the runtime "
                        "refuses its sandbox)", evidence + pod_evidence, sandbox_fix(sandbox, namespace, pod.name),
                        code="plugin-sandbox-failed")]
    if pod.waiting == "CrashLoopBackOff" or (pod.restarts and not pod.ready):
        return [Finding(STEP, Severity.FAIL, f"{what}: the device plugin keeps crashing there", evidence + pod_evidence,
                        crash_fix(pod, namespace), code="plugin-crashloop")]
    if not pod.ready:
        return [Finding(STEP, Severity.FAIL, f"{what}: the device plugin is not ready there", evidence + pod_evidence,
                        f"kubectl -n {namespace} logs {pod.name}", code="plugin-not-ready")]
    cause = ("it registered no healthy GPUs (NVML failing, or every GPU marked unhealthy by Xid events)" if have == 0
             else "some GPUs are marked unhealthy (Xid events) or missing from NVML")
    return [Finding(STEP, Severity.FAIL, f"{what}: the plugin runs but {cause}", evidence + pod_evidence,
                    f"kubectl -n {namespace} logs {pod.name}; nvidia-smi -q on the node", code="gpus-unhealthy")]
