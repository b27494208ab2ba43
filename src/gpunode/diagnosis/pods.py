"""Diagnosis of one GPU pod: why it is Pending, cannot start, failed, or runs without a GPU.

Reads what ``kubectl describe pod`` shows (phase, reason, container states,
events, the container's output) and the cluster around it (nodes, the pods
holding GPUs, each node's runtime facts) and names the first broken link with
the fix. A pod is "ok" only on positive evidence: its phase and container
states, and for a GPU pod the GPUs its container listed in its output.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpunode.cluster.labels import PLUGIN_LABEL
from gpunode.diagnosis import Finding, Verdict, failures, proven
from gpunode.facts.claims import ClaimView, DraView

STEP = "pod"
GPUS_STEP = "pod GPUs"  # the last link: the container saw the GPUs it was allocated
GPU = "nvidia.com/gpu"
NO_DEVICE = "CUDA_ERROR_NO_DEVICE"
GPU_LINE = re.compile(r"^GPU \d+: .+\(UUID: GPU-[^)]+\)\s*$")  # nvidia-smi -L, one line per GPU
MIG_LINE = re.compile(r"^\s+MIG .+\(UUID: MIG-[^)]+\)\s*$")  # and one per MIG device under its GPU
CUDA_COUNT = re.compile(r"^CUDA devices: (\d+)\s*$")  # what a CUDA sample's device query prints
NO_CUDA_DEVICE = "no CUDA-capable device is detected"  # cudaGetErrorString of cudaErrorNoDevice (runtime API)
CEL_ERROR = "CEL runtime error"  # the DRA allocator's words for a selector that fails on a device

# What a failed GPU container's components print, in their own words, and the link each points to:
# (the words, the finding's code, what they mean, the fix; {node} is the pod's node)
SIGNATURES: tuple[tuple[str, str, str, str], ...] = (
    ("nvidia-container-cli: ldcache error", "hook-ldconfig-failed",
     "the NVIDIA hook could not run the ldconfig the toolkit's config.toml names",
     "'gpunode verify --limit {node}' (toolkit step) quotes the config line; re-run deploys/toolkit.py for {node} "
     "(it sets the ldconfig this host has)"),
    ("is not host-relative (does not start with a '@')", "hook-ldconfig-failed",
     "the NVIDIA runtime refuses its config: the toolkit's ldconfig is not a host path",
     "re-run deploys/toolkit.py for {node} (it sets the ldconfig this host has)"),
    ("nvidia-container-runtime: permission denied", "runtime-not-executable",
     "the container runtime cannot execute nvidia-container-runtime",
     "re-run deploys/toolkit.py for {node} (it restores the programs' 0755); 'gpunode verify --limit {node}' "
     "quotes their modes"),
    ("unsatisfied condition: cuda>=", "driver-too-old-for-image",
     "the image asks for a newer CUDA (NVIDIA_REQUIRE_CUDA) than the driver on the node supports",
     "run it where the driver supports that CUDA (nvidia-smi's 'CUDA Version' on each node; gpunode labels nodes "
     "by GPU model), upgrade the driver on {node}, or use an image built for an older CUDA"),
    ("CUDA driver version is insufficient", "driver-too-old-for-image",
     "the CUDA runtime in the image is newer than the driver on the node supports",
     "run it where the driver supports that CUDA (nvidia-smi's 'CUDA Version'), upgrade the driver on {node}, or use "
     "an image built for an older CUDA"),
    ("Failed to initialize NVML: Insufficient Permissions", "device-permissions",
     "the container cannot open the GPU device nodes",
     "the driver creates /dev/nvidiactl and /dev/nvidia<N> mode 0666; 'ls -l /dev/nvidia*' on {node} shows what "
     "changed them (a udev rule, NVreg_DeviceFileMode)"),
    ("is/are busy or unavailable", "gpu-busy-or-unavailable",
     "a GPU it was given takes no new CUDA context: its compute mode is Exclusive_Process with another process "
     "holding it (time-slicing hands one GPU to several pods), or Prohibited",
     "'nvidia-smi --query-gpu=index,compute_mode --format=csv' on {node} shows each GPU's mode; 'nvidia-smi -i N -c "
     "DEFAULT' sets a shared GPU back (or leave that GPU out of time-slicing); 'gpunode doctor --limit {node}' names "
     "the GPUs"),
    # (the volume-mounts root passed as a device: NVIDIA's nvidia-container-toolkit issue 108)
    ("device error: /var/run/nvidia-container-devices: unknown device", "volume-mounts-refused",
     "the device plugin handed the GPUs as volume mounts and the NVIDIA hook on the node does not take devices from "
     "mounts, so it passed the mount root to nvidia-container-cli as a device",
     "nvidia-ctk config --in-place --config-file=/etc/nvidia-container-runtime/config.toml --set "
     "accept-nvidia-visible-devices-as-volume-mounts=true on {node} (re-running deploys/toolkit.py with "
     "plugin_device_list_strategy = volume-mounts does this)"),
    ("unknown device", "device-unknown-to-driver",
     "the container asked for a GPU the driver on the node does not have (an index past the last GPU, or a UUID "
     "of another node's or a replaced GPU, in NVIDIA_VISIBLE_DEVICES)",
     "'nvidia-smi -L' on {node} lists the GPUs it has: set NVIDIA_VISIBLE_DEVICES to one of them, or leave it to "
     "the device plugin (ask for nvidia.com/gpu)"),
    # the kubelet's event when a claim's DRA driver cannot prepare it (k8s.io/kubernetes v1.35.4,
    # pkg/kubelet/kuberuntime: FailedPrepareDynamicResources), the driver's words or "DRA driver X is not registered"
    ("Failed to prepare dynamic resources", "claim-prepare-failed",
     "the kubelet could not have the DRA driver prepare the pod's ResourceClaims (the driver's own words, or that no "
     "driver of that name is registered with the kubelet there)",
     "the DRA driver's pod on {node}: 'kubectl get pods -A -o wide --field-selector spec.nodeName={node}' shows it "
     "(not registered: it is not running there, or cannot reach the kubelet's plugins_registry folder); its log "
     "says why a prepare failed"),
    # the CDI library's words (tags.cncf.io/container-device-interface, as containerd 1.7 and 2.x vendor it) when
    # a spec names a device node the node does not have, e.g. /dev/nvidia-uvm with nvidia_uvm not loaded
    ("failed to stat CDI host device", "cdi-device-node-missing",
     "the node's CDI spec names a device node that the node does not have (quoted above), so the container runtime "
     "cannot give the container its GPU",
     "'gpunode doctor --limit {node}' names why the device node is missing (for /dev/nvidia-uvm: nvidia_uvm is not "
     "loaded); the spec works again once it is back. If the node's devices changed for good: nvidia-ctk cdi generate "
     "--output=/etc/cdi/nvidia.yaml on {node} (re-running deploys/toolkit.py does this)"),
    ("unresolvable CDI devices", "cdi-spec-missing",
     "the runtime was asked for CDI devices that no CDI spec on the node defines",
     "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml on {node} (again after every driver change); "
     "'gpunode verify --limit {node}' checks the spec"),
)


@dataclass(frozen=True)
class ContainerView:
    """One container's state as the pod's status reports it."""

    name: str
    state: str  # "running", "waiting", "terminated" or "" (no status yet)
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    ready: bool = False
    restarts: int = 0

    def describe(self) -> str:
        text = f"container {self.name}: {self.state or 'no status'}"
        if self.reason:
            text += f" ({self.reason})"
        if self.exit_code is not None:
            text += f", exit code {self.exit_code}"
        if self.message:
            text += f": {self.message.strip()}"
        return text + f", ready={str(self.ready).lower()}, restarts={self.restarts}"


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
    reason: str = ""  # status.reason (UnexpectedAdmissionError, Evicted, ...)
    message: str = ""  # status.message
    containers: tuple[ContainerView, ...] = ()
    dra: DraView | None = None  # its ResourceClaims and the devices around them, when it names any


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: dict[str, str]
    allocatable_gpus: int
    nvidia_default: bool | None = None  # from the node's runtime facts; None when unknown
    unschedulable: bool = False
    cordon_reason: str = ""
    taints: tuple[dict, ...] = ()  # spec.taints: {"key", "value", "effect"}


def scheduling_reasons(message: str) -> list[tuple[int, str]]:
    """Each part of the scheduler's FailedScheduling message as (node count, reason), in its order.

    ``0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {dedicated: ml}.
    preemption: ...`` gives ``[(1, "Insufficient nvidia.com/gpu"), (2, "node(s) had untolerated taint
    {dedicated: ml}")]``.
    """
    head = message.split(" preemption:", 1)[0]
    _, sep, reasons = head.partition("nodes are available: ")
    if not sep:
        return []
    parts = re.split(r", (?=\d+ )", reasons.strip().rstrip("."))
    found = []
    for part in parts:
        count, _, reason = part.partition(" ")
        if count.isdigit() and reason:
            found.append((int(count), reason.strip()))
    return found


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    """Whether one of the pod's tolerations matches the taint (Kubernetes' rule: key, operator, value, effect)."""
    for toleration in tolerations:
        operator = toleration.get("operator") or "Equal"
        key = toleration.get("key") or ""
        if key and key != taint.get("key"):
            continue
        if not key and operator != "Exists":
            continue
        if operator == "Equal" and (toleration.get("value") or "") != (taint.get("value") or ""):
            continue
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        return True
    return False


def untolerated(node: NodeView, spec: dict) -> list[dict]:
    """The node's scheduling taints (NoSchedule, NoExecute) the pod does not tolerate."""
    tolerations = spec.get("tolerations") or []
    return [t for t in node.taints if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t)]


def taint_text(taint: dict) -> str:
    """A taint as kubectl prints it: ``key=value:Effect`` (``key:Effect`` without a value)."""
    return f"{taint.get('key')}{'=' + taint['value'] if taint.get('value') else ''}:{taint.get('effect')}"


def toleration_for(taint: dict) -> str:
    """The toleration that lets a pod onto a node with ``taint``, in the pod spec's own words."""
    if taint.get("value"):
        return (f"{{key: {taint.get('key')}, operator: Equal, value: {taint['value']}, "
                f"effect: {taint.get('effect')}}}")
    return f"{{key: {taint.get('key')}, operator: Exists, effect: {taint.get('effect')}}}"


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
    if pod.phase == "Pending" and scheduling and not pod.spec.get("nodeName"):  # once bound, those are history
        message = scheduling[-1]
        evidence = [f"event FailedScheduling: {message}"]
        gpu_nodes = [n for n in nodes if n.allocatable_gpus]
        selector = pod.spec.get("nodeSelector") or {}
        selected = [n for n in nodes if all(n.labels.get(k) == v for k, v in selector.items())]
        matching = [n for n in selected if n.allocatable_gpus]
        if selector and not matching:
            seen = sorted({f"{k}={n.labels.get(k, '<none>')}" for n in gpu_nodes for k in selector})
            return [Finding(STEP, Verdict.FINDING, f"{title} is Pending: its nodeSelector matches no GPU node",
                            evidence + [f"nodeSelector: {selector}", f"GPU nodes have: {', '.join(seen) or 'none'}"],
                            "use a label the GPU nodes carry (gpunode sets accelerator=nvidia-<model> and "
                            "nvidia.com/gpu.product), or label the nodes you meant", code="selector-no-gpu-node")]
        cordoned = [n for n in nodes if n.unschedulable and n.allocatable_gpus]
        if "unschedulable" in message and cordoned:
            return [Finding(STEP, Verdict.FINDING, f"{title} is Pending: GPU node(s) are cordoned",
                            evidence + [f"{n.name}: spec.unschedulable = true"
                                        + (f", cordon reason: {n.cordon_reason}" if n.cordon_reason else "")
                                        for n in cordoned],
                            "kubectl uncordon the node once its reason is dealt with, or re-run the deploy's roll "
                            "(it uncordons a node when the node checks out)", code="nodes-cordoned")]
        if pod.dra is not None and CEL_ERROR in message:
            return [selector_error(pod.dra, title, evidence)]
        if pod.dra is not None and ("cannot allocate all claims" in message or "resourceclaim" in message):
            return [claim_finding(pod.dra, title, evidence)]
        reasons = scheduling_reasons(message)
        tainted = {n.name: untolerated(n, pod.spec) for n in matching or gpu_nodes}
        tainted = {name: taints for name, taints in tainted.items() if taints}
        if tainted and any("untolerated taint" in reason for _, reason in reasons):
            name, taints = sorted(tainted.items())[0]
            blocked = "all" if len(tainted) == len(matching or gpu_nodes) else f"{len(tainted)}"
            return [Finding(STEP, Verdict.FINDING, f"{title} is Pending: {blocked} of the GPU nodes it could use "
                            f"carry a taint it does not tolerate ({', '.join(sorted(tainted))})",
                            evidence + [f"{node}: taints {', '.join(map(taint_text, found))}, not tolerated by the pod"
                                        for node, found in sorted(tainted.items())]
                            + [f"scheduler: {count} {reason}" for count, reason in reasons],
                            f"add the toleration {toleration_for(taints[0])} to the pod spec, or remove the taint "
                            f"(kubectl taint node {name} {taints[0].get('key')}-) if it is not meant for GPU pods",
                            code="untolerated-taint")]
        if f"Insufficient {GPU}" in message:
            held = holders(pods)
            lines = [f"{n.name}: {n.allocatable_gpus} allocatable, held by "
                     f"{', '.join(held.get(n.name, [])) or 'nothing'}" for n in matching or gpu_nodes]
            free = max((n.allocatable_gpus - sum(int(h.rsplit('(', 1)[1][:-1]) for h in held.get(n.name, []))
                        for n in matching or gpu_nodes), default=0)
            # nodes gpunode's device plugin is to serve that offer nothing now: often the whole reason
            idle = [n.name for n in selected if not n.allocatable_gpus and n.labels.get(PLUGIN_LABEL) == "true"]
            lines += [f"{name}: 0 allocatable, though gpunode's device plugin is to serve it (label {PLUGIN_LABEL}="
                      "true)" for name in idle]
            first = (f"'gpunode doctor --limit {','.join(idle)}' names why {', '.join(idle)} offer(s) no GPU now; "
                     if idle else "")
            return [Finding(STEP, Verdict.FINDING, f"{title} is Pending: it asks for {wanted} {GPU} and no node "
                            f"has that many free (most free on one node: {free})", evidence + lines,
                            f"{first}wait for or delete the pods holding GPUs above, ask for fewer GPUs, or add GPU "
                            "nodes; a node missing from the list offers no GPUs (gpunode verify names why)",
                            code="insufficient-gpus")]
        return [Finding(STEP, Verdict.FINDING, f"{title} is Pending: the scheduler places it nowhere", evidence,
                        "read the scheduler's message above: it names each node's reason", code="unschedulable")]
    if pod.phase == "Pending" and (sandbox or pod.waiting == "FailedCreatePodSandBox"):
        message = sandbox[-1] if sandbox else pod.waiting_message
        node = pod.spec.get("nodeName", "?")
        handler = pod.spec.get("runtimeClassName") or "the default"
        evidence = [f"event FailedCreatePodSandBox: {message}"]
        if "no runtime for" in message:
            return [Finding(STEP, Verdict.FINDING,
                            f"{title} cannot start on {node}: the container runtime there has no "
                            f"{handler} runtime", evidence,
                            f"re-run deploys/runtime.py for {node} (it adds the nvidia runtime to containerd and "
                            "restarts it)", code="runtime-handler-missing")]
        return [Finding(STEP, Verdict.FINDING, f"{title} cannot start on {node}: the container runtime refuses its "
                        f"sandbox (runtime handler: {handler})", evidence,
                        f"the runtime's own words are above; 'gpunode verify --limit {node}' checks the toolkit and "
                        "runtime steps there", code="sandbox-failed")]
    signature = signature_finding(pod, title)
    if signature is not None:
        return [signature]
    if NO_DEVICE in pod.log or NO_CUDA_DEVICE in pod.log:
        node = next((n for n in nodes if n.name == pod.spec.get("nodeName")), None)
        evidence = [f"container output: {line}" for line in pod.log.splitlines()
                    if NO_DEVICE in line or NO_CUDA_DEVICE in line][:1]
        if not wanted:
            return [Finding(STEP, Verdict.FINDING, f"{title} runs without a GPU: it does not ask for one", evidence,
                            f"set resources.limits {GPU}: 1 in the container", code="no-gpu-request")]
        if not pod.spec.get("runtimeClassName") and node is not None and node.nvidia_default is False:
            return [Finding(STEP, Verdict.FINDING, f"{title} got {wanted} GPU(s) from the device plugin but runs under "
                            f"runc: nvidia is not the default runtime on {node.name} and the pod has no "
                            "runtimeClassName", evidence + [f"{node.name}: default runtime is not nvidia"],
                            "add runtimeClassName: nvidia to the pod spec (gpunode lint finds these), or set "
                            "nvidia_runtime_default = True and re-run deploys/runtime.py", code="no-runtime-class")]
        return [Finding(STEP, Verdict.FINDING, f"{title} runs without a GPU although it got {wanted}", evidence,
                        "the nvidia runtime did not inject the GPUs: gpunode verify (toolkit and runtime steps) "
                        f"on {pod.spec.get('nodeName', '?')}", code="runtime-no-injection")]
    lifecycle = lifecycle_findings(pod, title)
    if failures(lifecycle) or not wanted:
        return lifecycle
    return lifecycle + [gpus_seen(pod, title, wanted)]


def selector_lines(dra: DraView, claims: Sequence[ClaimView]) -> list[str]:
    """The CEL selectors that decide which devices ``claims`` can get: their DeviceClasses' (each class once, by
    name), then the requests' own."""
    classes = sorted({name for claim in claims for name, _ in claim.asks})
    return ([f"deviceclass {name}: selector {expression}" for name in classes
             for expression in dra.classes.get(name, ())]
            + [f"resourceclaim {claim.name}: selector {expression}" for claim in claims
               for expression in claim.selectors])


def selector_error(dra: DraView, title: str, evidence: list[str]) -> Finding:
    """The scheduler could not evaluate a selector of the pod's claims on a device (k8s.io/dynamic-resource-allocation:
    "class C: selector #N on device D: CEL runtime error: ..."): no device can be allocated while it fails."""
    return Finding(STEP, Verdict.FINDING, f"{title} is Pending: the scheduler cannot evaluate a selector of its "
                   "claims on the nodes' devices (a CEL runtime error), so it allocates none",
                   evidence + selector_lines(dra, dra.claims),
                   "the message names the DeviceClass (or claim), the selector and the error: 'no such key' is an "
                   "attribute the device does not have (a misspelt name, or one only some devices carry: guard it "
                   "with has() or .?/orValue()), 'no such overload' a comparison of different types (a version "
                   "with a string: semver('1.2.3')); 'gpunode lint' on the manifests checks gpunode's driver's "
                   "attributes", code="claim-selector-error")


def claim_finding(dra: DraView, title: str, evidence: list[str]) -> Finding:
    """A pod the scheduler places nowhere because of its ResourceClaims: what each asks, what each node's
    ResourceSlices offer and which claims hold those devices (the scheduler says only "cannot allocate")."""
    lines = []
    for claim in dra.claims:
        if not claim.name:
            lines.append(f"claim {claim.entry}: not created yet (its template's claim)")
            continue
        state = (f"allocated {', '.join(claim.allocated)}" if claim.allocated else "not allocated")
        lines.append(f"resourceclaim {claim.name}: requests {'; '.join(claim.requests) or 'none'}, {state}")
    free_most = 0
    for node, drivers in sorted(dra.offered.items()):
        for driver, devices in sorted(drivers.items()):
            held = [f"{d} by {dra.held[f'{driver}/{d}']}" for d in devices if f"{driver}/{d}" in dra.held]
            free_most = max(free_most, len(devices) - len(held))
            lines.append(f"resourceslices of {node}: {len(devices)} device(s) from {driver}"
                         + (f", {len(held)} allocated ({', '.join(held)})" if held else ", none allocated"))
    if not dra.offered:
        return Finding(STEP, Verdict.FINDING, f"{title} is Pending: no node publishes devices (no ResourceSlice), so "
                       "none of its claims can be allocated", evidence + lines
                       + [f"kubectl get resourceslices: {', '.join(dra.offered) or 'none'}"],
                       "the DRA driver publishes each node's devices: check its pods on the GPU nodes (kubectl get "
                       "pods -A -o wide | grep dra) and their logs; the kubelet's plugin registration names a driver "
                       "that did not register", code="claim-no-devices")
    waiting = [claim for claim in dra.claims if claim.name and not claim.allocated]
    counts = [count for claim in waiting for _, count in claim.asks]
    if waiting and counts and None not in counts and max(counts) <= free_most:
        selectors = selector_lines(dra, waiting)
        return Finding(STEP, Verdict.FINDING, f"{title} is Pending: enough devices are free ({free_most} on one node, "
                       f"it asks for {max(counts)} per request) but the scheduler allocates none: the selectors of "
                       "its DeviceClass or request match none of them", evidence + lines + selectors,
                       "compare the selectors above with the devices' attributes ('kubectl get resourceslices -o "
                       "yaml'): a class for another driver or model, or a misspelt attribute, matches nothing",
                       code="claim-selector-matches-none")
    return Finding(STEP, Verdict.FINDING, f"{title} is Pending: the scheduler cannot allocate its ResourceClaim(s) "
                   f"on any node (most free devices of one driver on one node: {free_most})", evidence + lines,
                   "ask for fewer devices or a device class the nodes offer, wait for or delete the claims holding "
                   "them (above), or add nodes running the DRA driver; 'kubectl get resourceslices -o yaml' shows "
                   "each device's attributes for the class's selectors", code="claim-unallocatable")


def said(pod: PodView) -> list[tuple[str, str]]:
    """Every text the pod's components wrote, with where it was read."""
    texts = [(f"container {c.name} {c.state or 'status'}", c.message) for c in pod.containers if c.message]
    texts += [(f"event {reason}", message) for reason, message in pod.events]
    texts += [("container output", line) for line in pod.log.splitlines()]
    texts += [("pod status", pod.message), ("waiting", pod.waiting_message)]
    return [(where, text.strip()) for where, text in texts if text and text.strip()]


def signature_finding(pod: PodView, title: str) -> Finding | None:
    """The first known failure a component of the pod's GPU chain wrote, linked to the node fact that explains it."""
    node = pod.spec.get("nodeName") or "?"
    texts = said(pod)
    for words, code, meaning, fix in SIGNATURES:
        found = next(((where, text) for where, text in texts if words in text), None)
        if found is not None:
            return Finding(STEP, Verdict.FINDING, f"{title} failed on {node}: {meaning}", [f"{found[0]}: {found[1]}"],
                           fix.format(node=node), code=code)
    return None


def event_lines(pod: PodView) -> list[str]:
    return [f"event {reason}: {message}" for reason, message in pod.events[-3:]]


def lifecycle_findings(pod: PodView, title: str) -> list[Finding]:
    """The pod ran as it should (proof from its phase and container states), or the finding that it did not."""
    status = f"pod status: phase {pod.phase or '<none>'}" + (f", reason {pod.reason}" if pod.reason else "") + (
        f": {pod.message.strip()}" if pod.message else "")
    states = [c.describe() for c in pod.containers]
    evidence = [status, *states]
    node = pod.spec.get("nodeName") or "?"
    if pod.phase == "Failed":
        last = [f"container output: {line}" for line in pod.log.strip().splitlines()[-3:]]
        if pod.reason == "UnexpectedAdmissionError" or pod.reason.startswith("OutOf"):
            return [Finding(STEP, Verdict.FINDING,
                            f"{title} was refused by the kubelet on {node} at admission: it never "
                            "ran", evidence + event_lines(pod),
                            f"the message says what the kubelet could not do (for GPUs: the device plugin's Allocate "
                            f"failed or its GPUs went away); 'gpunode doctor' checks the device plugin on {node}, then "
                            "re-create the pod", code="admission-refused")]
        exited = [c for c in pod.containers if c.exit_code not in (None, 0)]
        what = (f"{title} failed: container {exited[0].name} exited {exited[0].exit_code}" if exited
                else f"{title} failed")
        return [Finding(STEP, Verdict.FINDING, what, evidence + last + event_lines(pod),
                        f"kubectl -n {pod.namespace} logs {pod.name} (the container's own error)", code="pod-failed")]
    if pod.phase == "Succeeded":
        if all(c.state == "terminated" and c.exit_code == 0 for c in pod.containers) and pod.containers:
            return [proven(STEP, f"{title} ran on {node} and every container exited 0", evidence)]
        return [Finding(STEP, Verdict.FINDING, f"{title} is Succeeded but its containers do not all show exit 0",
                        evidence, f"kubectl -n {pod.namespace} describe pod {pod.name}", code="pod-state-odd")]
    if pod.phase == "Running":
        stuck = [c for c in pod.containers if c.state != "running"]
        if not stuck and pod.containers:
            return [proven(STEP, f"{title} runs on {node}: every container started", evidence)]
        first = stuck[0] if stuck else None
        return [Finding(STEP, Verdict.FINDING, f"{title} is Running but container {first.name if first else '?'} is "
                        f"{first.state if first else 'unreported'}" + (f" ({first.reason})" if first and first.reason
                                                                        else ""),
                        evidence + event_lines(pod), f"kubectl -n {pod.namespace} logs {pod.name} --previous; "
                        f"kubectl -n {pod.namespace} describe pod {pod.name}", code="container-not-running")]
    if pod.phase == "Pending":
        waiting = next((c for c in pod.containers if c.state == "waiting"), None)
        where = f"on {node}" if pod.spec.get("nodeName") else "(not scheduled yet)"
        return [Finding(STEP, Verdict.FINDING, f"{title} is Pending {where}"
                        + (f": container {waiting.name} waits ({waiting.reason})" if waiting else ""),
                        evidence + event_lines(pod), f"kubectl -n {pod.namespace} describe pod {pod.name}",
                        code="pod-pending")]
    return [Finding(STEP, Verdict.FINDING, f"{title} is in phase {pod.phase or '<none>'}", evidence + event_lines(pod),
                    f"kubectl -n {pod.namespace} describe pod {pod.name}", code="pod-state-odd")]


def gpus_seen(pod: PodView, title: str, wanted: int) -> Finding:
    """Whether the container listed the GPUs it was allocated (its own output is the only proof here)."""
    lines = pod.log.splitlines()
    migs = [line.strip() for line in lines if MIG_LINE.match(line)]
    gpus = [line.strip() for line in lines if GPU_LINE.match(line)]
    counted = [int(m.group(1)) for m in map(CUDA_COUNT.match, lines) if m]
    seen = migs or gpus
    if seen:
        count, evidence = len(seen), [f"container output: {line}" for line in seen[:8]]
    elif counted:
        count, evidence = counted[-1], [f"container output: CUDA devices: {counted[-1]}"]
    else:
        return Finding(GPUS_STEP, Verdict.NOT_CHECKED,
                       f"whether {title}'s container saw its {wanted} GPU(s): its output "
                       "lists none", [f"container output: {len(lines)} line(s), none like nvidia-smi -L's "
                                              "'GPU 0: ... (UUID: GPU-...)'"],
                       "run 'nvidia-smi -L' at the container's start, so its log shows the GPUs it got",
                       code="gpus-not-shown")
    if count != wanted:
        return Finding(GPUS_STEP, Verdict.FINDING, f"{title}'s container saw {count} GPU(s), it was allocated {wanted}",
                       evidence + [f"resources.limits {GPU}: {wanted}"],
                       "the runtime injects what the device plugin's Allocate returned: 'gpunode verify' on "
                       f"{pod.spec.get('nodeName', '?')} (toolkit, runtime and device-plugin steps)",
                       code="gpu-count-mismatch")
    return proven(GPUS_STEP, f"{title}'s container saw the {wanted} GPU(s) it was allocated",
                  evidence + [f"resources.limits {GPU}: {wanted}"])
