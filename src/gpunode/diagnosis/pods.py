"""Diagnosis of one GPU pod: why it is Pending, cannot start, or runs without a GPU.

Reads what ``kubectl describe pod`` shows (phase, conditions, events, the
container's output) and the cluster around it (nodes, the pods holding GPUs,
each node's runtime facts) and names the first broken link with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpunode.diagnosis import Finding, Severity

STEP = "pod"
GPU = "nvidia.com/gpu"
NO_DEVICE = "CUDA_ERROR_NO_DEVICE"


@dataclass(frozen=True)
class PodView:
    """The pod and the cluster around it, as read from the API."""

    namespace: str
    name: str
    phase: str
    spec: dict
    events: list[tuple[str, str]] = field(default_factory=list)  # (reason, message)
    log: str = ""
    waiting: str = ""
    waiting_message: str = ""


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: dict[str, str]
    allocatable_gpus: int
    nvidia_default: bool | None = None  # from the node's runtime facts; None when unknown


def gpu_request(spec: dict) -> int:
    total = 0
    for container in spec.get("containers") or []:
        total += int(((container.get("resources") or {}).get("limits") or {}).get(GPU, 0) or 0)
    return total


def holders(pods: list[tuple[str, str, str, dict]]) -> dict[str, list[str]]:
    """Per node, the running pods holding GPUs: ``ns/name (N)``; pods as (namespace, name, phase, spec)."""
    held: dict[str, list[str]] = {}
    for namespace, name, phase, spec in pods:
        count = gpu_request(spec)
        if count and spec.get("nodeName") and phase not in ("Succeeded", "Failed"):
            held.setdefault(spec["nodeName"], []).append(f"{namespace}/{name} ({count})")
    return held


def diagnose(pod: PodView, nodes: list[NodeView], pods: list[tuple[str, str, str, dict]]) -> list[Finding]:
    title = f"pod {pod.namespace}/{pod.name}"
    wanted = gpu_request(pod.spec)
    scheduling = [m for r, m in pod.events if r == "FailedScheduling"]
    sandbox = [m for r, m in pod.events if r == "FailedCreatePodSandBox"]
    if pod.phase == "Pending" and scheduling:
        message = scheduling[-1]
        evidence = [f"event FailedScheduling: {message}"]
        gpu_nodes = [n for n in nodes if n.allocatable_gpus]
        selector = pod.spec.get("nodeSelector") or {}
        matching = [n for n in gpu_nodes if all(n.labels.get(k) == v for k, v in selector.items())]
        if selector and not matching:
            seen = sorted({f"{k}={n.labels.get(k, '<none>')}" for n in gpu_nodes for k in selector})
            return [Finding(STEP, Severity.FAIL, f"{title} is Pending: its nodeSelector matches no GPU node",
                            evidence + [f"nodeSelector: {selector}", f"GPU nodes have: {', '.join(seen) or 'none'}"],
                            "use a label the GPU nodes carry (gpunode sets accelerator=nvidia-<model> and "
                            "nvidia.com/gpu.product), or label the nodes you meant", code="selector-no-gpu-node")]
        if f"Insufficient {GPU}" in message:
            held = holders(pods)
            lines = [f"{n.name}: {n.allocatable_gpus} allocatable, held by "
                     f"{', '.join(held.get(n.name, [])) or 'nothing'}" for n in matching or gpu_nodes]
            free = max((n.allocatable_gpus - sum(int(h.rsplit('(', 1)[1][:-1]) for h in held.get(n.name, []))
                        for n in matching or gpu_nodes), default=0)
            return [Finding(STEP, Severity.FAIL, f"{title} is Pending: it asks for {wanted} {GPU} and no node "
                            f"has that many free (most free on one node: {free})", evidence + lines,
                            "wait for or delete the pods holding GPUs above, ask for fewer GPUs, or add GPU nodes; "
                            "a node missing from the list offers no GPUs (gpunode verify names why)",
                            code="insufficient-gpus")]
        return [Finding(STEP, Severity.FAIL, f"{title} is Pending", evidence, "see the event", code="unschedulable")]
    if sandbox or pod.waiting == "FailedCreatePodSandBox":
        message = sandbox[-1] if sandbox else pod.waiting_message
        node = pod.spec.get("nodeName", "?")
        handler = pod.spec.get("runtimeClassName") or "the default"
        return [Finding(STEP, Severity.FAIL, f"{title} cannot start on {node}: the container runtime there has no "
                        f"{handler} runtime", [f"event FailedCreatePodSandBox: {message}"],
                        f"re-run deploys/runtime.py for {node} (it adds the nvidia runtime to containerd and "
                        "restarts it)", code="runtime-handler-missing")]
    if NO_DEVICE in pod.log:
        node = next((n for n in nodes if n.name == pod.spec.get("nodeName")), None)
        evidence = [f"container output: {line}" for line in pod.log.splitlines() if NO_DEVICE in line][:1]
        if not wanted:
            return [Finding(STEP, Severity.FAIL, f"{title} runs without a GPU: it does not ask for one", evidence,
                            f"set resources.limits {GPU}: 1 in the container", code="no-gpu-request")]
        if not pod.spec.get("runtimeClassName") and node is not None and node.nvidia_default is False:
            return [Finding(STEP, Severity.FAIL, f"{title} got {wanted} GPU(s) from the device plugin but runs under "
                            f"runc: nvidia is not the default runtime on {node.name} and the pod has no "
                            "runtimeClassName", evidence + [f"{node.name}: default runtime is not nvidia"],
                            "add runtimeClassName: nvidia to the pod spec (gpunode lint finds these), or set "
                            "nvidia_runtime_default = True and re-run deploys/runtime.py", code="no-runtime-class")]
        return [Finding(STEP, Severity.FAIL, f"{title} runs without a GPU although it got {wanted}", evidence,
                        "the nvidia runtime did not inject the GPUs: gpunode verify (toolkit and runtime steps) "
                        f"on {pod.spec.get('nodeName', '?')}", code="runtime-no-injection")]
    return []
