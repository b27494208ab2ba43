"""Diagnosis of the device-plugin step: the plugin runs on the node and the node offers all its GPUs."""

from __future__ import annotations

from dataclasses import replace

from gpunode.cluster.labels import DRA_LABEL, PLUGIN_LABEL
from gpunode.cluster.plugin_config import GPU_RESOURCE, Offer, PluginConfig, gpu_sharing
from gpunode.diagnosis import Finding, Verdict, proven
from gpunode.facts.device_plugin import DAEMONSET, PluginPodState, RolloutState
from gpunode.facts.labels import CORDON_REASON, NodeLabelsState
from gpunode.image.push import refusal

STEP = "device_plugin"
RESOURCE = "nvidia.com/gpu"
PRESENT = "nvidia.com/gpu.present"


def allocatable_of(node: NodeLabelsState, resource: str) -> int:
    try:
        return int(node.allocatable.get(resource, "0"))
    except ValueError:
        return 0


def allocatable_gpus(node: NodeLabelsState) -> int:
    return allocatable_of(node, RESOURCE)


def unhealthy_fix(devices: tuple[tuple[str, str, str], ...]) -> str:
    """What to do about the GPUs the plugin marked unhealthy, from the reason it logged."""
    reasons = " ".join(reason for _, _, reason in devices)
    uuids = " ".join(device for device, _, _ in devices)
    if "ECC" in reasons or "Xid 48" in reasons or "Xid 63" in reasons or "Xid 64" in reasons:
        return (f"memory errors on {uuids}: drain the node, then 'nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER' "
                "shows whether a reset retires the pages ('nvidia-smi -r -i <index>' or a reboot); a GPU whose "
                "remapping failed goes back to the vendor")
    if "Xid 79" in reasons or "Xid 74" in reasons or "Xid 94" in reasons or "Xid 95" in reasons:
        return (f"{uuids}: drain the node and reset the GPU ('nvidia-smi -r -i <index>') or reboot; the plugin "
                "offers it again once healthy")
    return (f"{uuids}: read the node's kernel log (dmesg | grep -i xid) for the Xid's meaning; drain and reset the GPU "
            "or reboot the node if it repeats")


def plugin_pod_evidence(pod: PluginPodState, namespace: str) -> list[str]:
    """The plugin pod as read: phase, restarts, its last log lines (its own words) and warning events."""
    evidence = [f"pod {namespace}/{pod.name}: {pod.phase}" + (f", {pod.waiting}" if pod.waiting else "")
                + f", ready={str(pod.ready).lower()}, restarts={pod.restarts}"
                + (f", last exit code {pod.last_exit}" if pod.last_exit is not None else "")]
    evidence += [f"log: {line}" for line in pod.log_tail if line.strip()]
    return evidence + [f"event {line}" for line in pod.warnings]


def other_nvidia(node: NodeLabelsState, resource: str) -> dict[str, int]:
    """The node's other nvidia.com/ resources it offers (a renamed or MIG resource), with their counts."""
    return {name: allocatable_of(node, name) for name in sorted(node.allocatable)
            if name.startswith("nvidia.com/") and name != resource and allocatable_of(node, name) > 0}


def crash_fix(pod: PluginPodState, namespace: str) -> str:
    """The fix the plugin's own last words point at."""
    said = " ".join(pod.log_tail)
    if "mig-strategy single" in said or "MIG device" in said:
        return ("the GPUs' MIG layout does not fit the plugin's MIG strategy (its words above): create MIG instances "
                "(nvidia-smi mig -cgi <profiles> -C) or turn MIG mode off (nvidia-smi -mig 0, then reset the GPU), or "
                "set plugin_mig_strategy to mixed (several profiles) or none, and re-run deploys/device_plugin.py")
    if "socket directory" in said:
        return ("the DaemonSet must mount the host's /var/lib/kubelet/device-plugins (hostPath, type Directory) and "
                "run as root: re-run deploys/device_plugin.py (gpunode's manifest does both)")
    if "NVML" in said or "nvml" in said or "driver" in said:
        return "the plugin cannot initialise NVML: fix the driver on this node first (gpunode verify, driver step)"
    return f"kubectl -n {namespace} logs {pod.name} --previous"


PULL_FAILED = ("ErrImagePull", "ImagePullBackOff")


def image_pull_fix(said: str, image: str, namespace: str, pod: str) -> str:
    """What to do about an image the node cannot pull, from the runtime's words (containerd's or docker's)."""
    host = image.split("/", 1)[0] if "/" in image else "the registry"
    return {
        "credentials": f"the registry {host} refused the nodes' credentials: set plugin_registry_username and "
                       "plugin_registry_password to a user that can pull it (the deploy writes them into the Secret "
                       "gpunode-registry that the DaemonSet names), or fix the Secret plugin_pull_secret names; "
                       "then re-run deploys/device_plugin.py and delete the waiting pod (the kubelet backs off up "
                       "to 5 minutes)",
        "missing": f"{image} is not in the registry: push it (gpunode image push REGISTRY/REPOSITORY:TAG --archive "
                   "IMAGE.tar prints the reference to use, pinned by digest), or set plugin_image to one that is "
                   "there; then re-run deploys/device_plugin.py",
        "trust": f"the node does not trust {host}'s certificate: put the registry's CA on the node, for containerd "
                 f"in /etc/containerd/certs.d/{host}/ (hosts.toml 'ca', with config_path set in the CRI plugin's "
                 f"registry section), for docker as /etc/docker/certs.d/{host}/ca.crt",
        "tls": f"the node and {host} disagree about TLS (plain HTTP to a TLS port, or the other way round): check "
               "the node's hosts.toml / certs.d for that registry",
        "reach": f"the node cannot reach {host}: check its DNS and route to the registry (from the node: curl "
                 f"https://{host}/v2/)",
    }.get(refusal(said) or "", f"kubectl -n {namespace} describe pod {pod} (the runtime's own error is quoted above)")


def image_pull_failed(what: str, evidence: list[str], pod: PluginPodState, namespace: str) -> Finding:
    said = " ".join([pod.waiting_message, *pod.warnings])
    told = any(w.startswith("Failed: Failed to pull image") for w in pod.warnings)  # the same words, as an event
    quoted = [f"waiting: {pod.waiting}: {pod.waiting_message}"] if pod.waiting_message and not told else []
    return Finding(STEP, Verdict.FINDING, f"{what}: the node cannot pull the device plugin's image {pod.image}",
                   evidence + plugin_pod_evidence(pod, namespace) + quoted,
                   image_pull_fix(said, pod.image, namespace, pod.name), code="plugin-image-pull")


def sandbox_fix(event: str, namespace: str, pod: str) -> str:
    """The fix a FailedCreatePodSandBox event points at."""
    if "no runtime for" in event:
        return ("the node's runtime has no handler for the pod's RuntimeClass (nvidia): re-run deploys/runtime.py "
                "on that node (gpunode verify names its runtime step)")
    return f"kubectl -n {namespace} describe pod {pod} (the runtime's own error is quoted above)"


def selector_evidence(rollout: RolloutState, node: NodeLabelsState, namespace: str) -> list[str]:
    """The DaemonSet's nodeSelector as read, and the node's value of each key it names."""
    evidence = [f"daemonset {namespace}/{DAEMONSET} nodeSelector: {rollout.selector()}"
                + (" (plus a node affinity)" if rollout.affinity else "")]
    evidence += [f"node {node.name} label {key}={node.labels.get(key, '<missing>')}"
                 for key in sorted(rollout.node_selector)]
    if node.taints:
        evidence += [f"node {node.name} taints: {', '.join(node.taints)}",
                     f"daemonset {namespace}/{DAEMONSET} tolerations: {', '.join(rollout.tolerations) or '<none>'}"]
    return evidence


def untolerated(rollout: RolloutState, node: NodeLabelsState) -> list[str]:
    """The node's NoSchedule/NoExecute taints the DaemonSet does not tolerate (each keeps its pod away)."""
    if "*" in rollout.tolerations:
        return []
    left = []
    for taint in node.taints:
        key_value, _, effect = taint.rpartition(":")
        key = key_value.split("=", 1)[0]
        if effect == "PreferNoSchedule":
            continue
        if not any(t in (taint, f"{key}:{effect}", f"{key}:*", f"{key_value}:*") for t in rollout.tolerations):
            left.append(taint)
    return left


def two_registrars(node: str, reference: str, pod: str, namespace: str) -> Finding:
    """NVIDIA's device plugin and gpunode's both register nvidia.com/gpu on ``node``."""
    return Finding(STEP, Verdict.FINDING,
                   f"two nvidia.com/gpu registrars on {node}: gpunode's device plugin and NVIDIA's {reference}; the "
                   "kubelet keeps whichever registered last, so allocatable flaps as each one re-registers",
                   [f"daemonset {reference}: pod {pod} on {node}",
                    f"node {node} label {PLUGIN_LABEL}=true (gpunode's plugin, daemonset {namespace}/{DAEMONSET})"],
                   f"keep one: 'gpunode migrate INVENTORY --limit {node}' moves the node to gpunode's plugin (NVIDIA's "
                   f"leaves it), or remove the label {PLUGIN_LABEL} from the node to leave it to NVIDIA's",
                   code="two-registrars")


def not_scheduled(what: str, evidence: list[str], rollout: RolloutState, node: NodeLabelsState,
                  namespace: str) -> Finding:
    unmet = {k: v for k, v in rollout.node_selector.items() if node.labels.get(k) != v}
    blocking = untolerated(rollout, node)
    if blocking and not unmet:
        key = blocking[0].split(":")[0].split("=")[0]
        fix = (f"{node.name} is tainted {', '.join(blocking)}, which the DaemonSet does not tolerate: remove the taint "
               f"(kubectl taint node {node.name} {key}-) or add a toleration for it to the plugin's DaemonSet (your "
               "copy of device-plugin.yaml.j2 in templates_dir)")
    elif unmet and set(unmet) <= {PRESENT, PLUGIN_LABEL} and all(v == "true" for v in unmet.values()):
        fix = (f"run deploys/labels.py (it sets {' and '.join(f'{k}=true' for k in sorted(unmet))} on GPU nodes; "
               f"{PLUGIN_LABEL} only where NVIDIA's own device plugin does not serve the node)")
    elif unmet:
        fix = (f"the DaemonSet's nodeSelector asks for {', '.join(f'{k}={v}' for k, v in sorted(unmet.items()))}, "
               "which this node does not carry: re-run deploys/device_plugin.py (it restores gpunode's selector), "
               "or label the node if that selector is meant")
    else:
        fix = f"kubectl -n {namespace} describe daemonset {DAEMONSET} (its events say why no pod is placed here)"
    return Finding(STEP, Verdict.FINDING, f"{what}: no device-plugin pod runs there",
                   evidence + selector_evidence(rollout, node, namespace), fix, code="plugin-not-scheduled")


def cordoned(node: NodeLabelsState, evidence: list[str]) -> Finding:
    reason = node.cordon_reason
    return Finding(STEP, Verdict.FINDING, f"{node.name} is cordoned: it offers its GPUs, but no new pod is scheduled "
                   "there", evidence + [f"kubectl get node {node.name}: spec.unschedulable = true",
                                        f"annotation {CORDON_REASON}: {reason}" if reason
                                        else f"annotation {CORDON_REASON}: absent (not cordoned by gpunode)"],
                   ("gpunode cordoned it and stopped there: fix what the reason says and re-run the deploy (the roll "
                    f"uncordons it when the node checks out), or kubectl uncordon {node.name}" if reason
                    else f"kubectl uncordon {node.name} when its maintenance is over"), code="node-cordoned")


EXCLUSIVE = ("Exclusive_Process", "Exclusive_Thread")  # nvidia-smi's compute_mode values that admit one context


def exclusive_time_slicing(node: str, health: list[dict], config: PluginConfig | None) -> Finding | None:
    """Time-slicing offers each GPU to several pods at once, but a GPU in an exclusive compute mode takes one CUDA
    context at a time: every pod after the first on it fails with CUDA's 'CUDA-capable device(s) is/are busy or
    unavailable' (cudaErrorDevicesUnavailable). (MPS is different: its control daemon wants Exclusive_Process.)"""
    rule = gpu_sharing(config)
    exclusive = [row for row in health if row.get("compute_mode") in EXCLUSIVE]
    if rule is None or rule.replicas < 2 or not exclusive:
        return None
    indexes = " ".join(str(row["index"]) for row in exclusive)
    return Finding(STEP, Verdict.FINDING, f"{node} time-slices its GPUs {rule.replicas} ways, but GPU(s) {indexes} "
                   "take only one CUDA context at a time (exclusive compute mode): every pod after the first on them "
                   "fails with 'CUDA-capable device(s) is/are busy or unavailable'",
                   [f"nvidia-smi compute_mode: GPU {row['index']} {row['compute_mode']}" for row in exclusive]
                   + [f"plugin_config sharing.timeSlicing: {GPU_RESOURCE} x {rule.replicas} replicas"],
                   f"nvidia-smi -i {exclusive[0]['index']} -c DEFAULT on {node} (as root; set it again after a reboot "
                   "if something sets it at boot), or drop sharing.timeSlicing from plugin_config for this node",
                   code="exclusive-time-sliced")


def with_node_warnings(findings: list[Finding], node: str, warnings: tuple[str, ...]) -> list[Finding]:
    """The failing findings with what the node's own watchers said last (its Warning events), quoted as evidence:
    a reboot, an OOM or a detector's GPU report often is the cause the plugin's side cannot see."""
    if not warnings:
        return findings
    lines = [f"Warning event on node {node} ({line})" for line in warnings]
    return [replace(f, evidence=[*f.evidence, *lines]) if f.state is Verdict.FINDING else f for f in findings]


# the DRA drivers that publish NVIDIA GPUs: gpunode's, and NVIDIA's k8s-dra-driver-gpu (a NIC's or another
# vendor's driver on the same node offers other devices, not these GPUs)
DRA_DRIVER = "gpu.gpunode.io"  # gpunode's DRA driver (gpunode_plugin.dra_devices.DRIVER; a test keeps them equal)
DRA_DAEMONSET = "gpunode-dra-driver"


def dra_slice_name(node: str) -> str:
    """The name of the one ResourceSlice gpunode's DRA driver writes for ``node`` (gpunode_plugin's slice_name)."""
    return f"{node}-{DRA_DRIVER}"
GPU_DRA_DRIVERS = (DRA_DRIVER, "gpu.nvidia.com")


def offered_twice(node: NodeLabelsState, resource: str, offered: dict[str, list[str]]) -> Finding | None:
    """A node whose GPUs a device plugin offers (its allocatable) and a GPU DRA driver publishes too (its slices):
    the scheduler counts them apart, so one GPU can go to a device-plugin pod and to a claim at once."""
    have = allocatable_of(node, resource)
    drivers = {driver: devices for driver, devices in offered.items() if driver in GPU_DRA_DRIVERS and devices}
    if not have or not drivers:
        return None
    return Finding(STEP, Verdict.FINDING, f"{node.name} offers its GPUs twice: {have} {resource} from a device plugin "
                   f"and {sum(map(len, drivers.values()))} device(s) in ResourceSlices from "
                   f"{', '.join(sorted(drivers))}; the scheduler can give one GPU to a pod and to a claim at once",
                   [f"kubectl get node {node.name}: allocatable {resource}={have}"]
                   + [f"kubectl get resourceslices (node {node.name}): {len(devices)} device(s) from {driver}"
                      for driver, devices in sorted(drivers.items())],
                   "one allocation method per node: drain it, then take the device plugin off it (remove its "
                   f"{PLUGIN_LABEL} label) or the DRA driver's pod (its DaemonSet's node selector), and uncordon",
                   code="offered-twice")


def diagnose(rollout: RolloutState, pod: PluginPodState, node: NodeLabelsState, offer: Offer,
             namespace: str) -> list[Finding]:
    """Why ``node`` does not offer what ``offer`` says to new pods, first cause first; else the proof that it does
    (the count, from a ready plugin pod, on a schedulable node)."""
    resource = offer.resource
    have = allocatable_of(node, resource)
    evidence = [f"kubectl get node {node.name} -o jsonpath='{{.status.allocatable}}': "
                f"{resource}={node.allocatable.get(resource, '<none>')}"]
    pod_line = ([f"pod {namespace}/{pod.name}: {pod.phase}, ready={str(pod.ready).lower()}, restarts={pod.restarts}"]
                if pod.exists else [])
    if offer.count is None:
        if node.unschedulable:
            return [cordoned(node, evidence)]
        if pod.exists and pod.waiting in PULL_FAILED:
            return [image_pull_failed(f"{node.name} offers {have} allocatable {resource}", evidence, pod, namespace)]
        if pod.exists and (pod.waiting == "CrashLoopBackOff" or (pod.restarts and not pod.ready)):
            # whatever the count should be, a crash-looping plugin offers nothing new: never "not checked"
            return [Finding(STEP, Verdict.FINDING, f"{node.name} offers {have} allocatable {resource}: the device "
                            "plugin keeps crashing there",
                            evidence + [offer.basis] + plugin_pod_evidence(pod, namespace),
                            crash_fix(pod, namespace), code="plugin-crashloop")]
        offered = [f"kubectl get node {node.name}: allocatable {name}={count}"
                   for name, count in other_nvidia(node, "").items()]
        return [Finding(STEP, Verdict.NOT_CHECKED, f"how many GPU resources {node.name} must offer: {offer.basis}",
                        offered + pod_line, code="count-unknown")]
    matches = have == offer.count
    if matches and pod.exists and pod.ready:
        if node.unschedulable:
            return [cordoned(node, evidence)]
        proof = evidence + [offer.basis, f"kubectl get node {node.name}: spec.unschedulable not set"] + pod_line
        return [proven(STEP, f"{node.name} offers its {offer.count} {resource} to the scheduler", proof)]
    if matches:  # the count alone is no proof: the kubelet keeps it for a grace period after its plugin goes away
        what = (f"{node.name} still shows {have} allocatable {resource}, which the kubelet keeps a while after the "
                "plugin goes away (GPU pods placed there now fail at Allocate)")
    else:
        what = f"{node.name} offers {have} allocatable {resource}, " + (
            f"its driver sees {offer.gpus}" if offer.plain else f"it should offer {offer.count} ({offer.basis})")
    if not rollout.exists:
        return [Finding(STEP, Verdict.FINDING, f"{what}: the device plugin is not deployed", evidence +
                        [f"kubectl -n {namespace} get daemonset {DAEMONSET}: NotFound"], "run deploys/device_plugin.py",
                        code="plugin-missing")]
    if not pod.exists:
        return [not_scheduled(what, evidence, rollout, node, namespace)]
    if pod.waiting in PULL_FAILED:
        return [image_pull_failed(what, evidence, pod, namespace)]
    pod_evidence = plugin_pod_evidence(pod, namespace)
    sandbox = next((w for w in pod.warnings if w.startswith("FailedCreatePodSandBox")), None)
    if sandbox and not pod.ready and not pod.restarts:
        return [Finding(STEP, Verdict.FINDING, f"{what}: the device plugin's pod cannot start there (the runtime "
                        "refuses its sandbox)", evidence + pod_evidence, sandbox_fix(sandbox, namespace, pod.name),
                        code="plugin-sandbox-failed")]
    if pod.waiting == "CrashLoopBackOff" or (pod.restarts and not pod.ready):
        return [Finding(STEP, Verdict.FINDING,
                        f"{what}: the device plugin keeps crashing there", evidence + pod_evidence,
                        crash_fix(pod, namespace), code="plugin-crashloop")]
    if not pod.ready:
        said = " ".join(pod.log_tail)
        fix = ("the plugin waits for the kubelet's socket in a folder the kubelet does not use: the DaemonSet's "
               "hostPath must be the kubelet's device-plugins folder (/var/lib/kubelet/device-plugins, or "
               "<kubelet --root-dir>/device-plugins); re-run deploys/device_plugin.py (gpunode's manifest mounts it)"
               if "kubelet socket" in said and "not there yet" in said else f"kubectl -n {namespace} logs {pod.name}")
        return [Finding(STEP, Verdict.FINDING, f"{what}: the device plugin is not ready there", evidence + pod_evidence,
                        fix, code="plugin-not-ready")]
    if have > (offer.count or 0):
        return [Finding(STEP, Verdict.FINDING, f"{what}: more than the inventory's plugin configuration gives; the "
                        "running plugin shares the GPUs (time-slicing) or counts them otherwise",
                        evidence + [offer.basis] + pod_evidence,
                        "the running plugin's configuration differs from the inventory's: put the sharing it runs "
                        "with in plugin_config (verify and doctor then expect it), or re-run "
                        "deploys/device_plugin.py to bring the inventory's", code="offers-more")]
    elsewhere = other_nvidia(node, resource)
    if elsewhere and have == 0:
        return [Finding(STEP, Verdict.FINDING, f"{what}: the plugin offers the GPUs under another resource name",
                        evidence + [f"kubectl get node {node.name}: allocatable {name}={count}"
                                    for name, count in elsewhere.items()] + pod_evidence,
                        "the running plugin's configuration differs from the inventory's (plugin_config, "
                        "plugin_mig_strategy): re-run deploys/device_plugin.py, or set plugin_config to what the "
                        "node should offer; pods must ask for the resource the node offers",
                        code="resource-name-differs")]
    if pod.unhealthy:
        named = ", ".join(f"{device} ({reason})" for device, _, reason in pod.unhealthy)
        return [Finding(STEP, Verdict.FINDING, f"{what}: the plugin marked {len(pod.unhealthy)} device(s) unhealthy: "
                        f"{named}", evidence + [f"plugin log: device {device} of {resource_name} unhealthy: {reason}"
                                                for device, resource_name, reason in pod.unhealthy] + pod_evidence,
                        unhealthy_fix(pod.unhealthy), code="gpus-unhealthy")]
    cause = ("it registered no healthy GPUs (NVML failing, or every GPU marked unhealthy by Xid events)" if have == 0
             else "some GPUs are marked unhealthy (Xid events) or missing from NVML")
    return [Finding(STEP, Verdict.FINDING, f"{what}: the plugin runs but {cause}", evidence + pod_evidence,
                    f"kubectl -n {namespace} logs {pod.name}; nvidia-smi -q on the node", code="gpus-unhealthy")]


def dra_expected(gpus: list[dict]) -> list[str]:
    """The devices gpunode's DRA driver publishes for ``gpus``: ``gpu-N`` per whole GPU, and for a GPU in MIG
    mode its MIG devices (``gpu-N-mig-...``, how many is MIG's to say: at least one is expected)."""
    return [f"gpu-{g['index']}-mig-" if g.get("mig_mode") == "Enabled" else f"gpu-{g['index']}" for g in gpus]


def dra_driver_replaced(pod: PluginPodState, replaced: str, namespace: str) -> Finding | None:
    """After this run restarted the node's DRA driver pod ``replaced`` (its slice proves nothing new): None once a
    successor is ready, else the finding that names the wait."""
    if pod.exists and pod.ready and pod.name != replaced:
        return None
    return Finding(STEP, Verdict.FINDING, f"{pod.node}: the DRA driver pod that replaces {replaced} is not ready",
                   [f"{DRA_DAEMONSET} pod on {pod.node}: {pod.name or '<none>'}, ready={pod.ready}"],
                   f"kubectl -n {namespace} describe pod -l app.kubernetes.io/name={DRA_DAEMONSET} "
                   f"--field-selector spec.nodeName={pod.node} (its events and log say why)",
                   code="dra-driver-not-ready")


def dra_offer(node: NodeLabelsState, gpus: list[dict], devices: list[str], namespace: str) -> list[Finding]:
    """A node on gpunode's DRA driver (gpu_allocation = dra): proof that its ResourceSlice offers each of its GPUs
    and that no device plugin offers them too; else what is missing, with the driver's pod to look at."""
    listed = f"kubectl get resourceslices --field-selector spec.nodeName={node.name},spec.driver={DRA_DRIVER}"
    evidence = [f"{listed}: {len(devices)} device(s)" + (f" ({', '.join(devices)})" if devices else "")]
    missing = [want for want in dra_expected(gpus)
               if not any(d == want or (want.endswith("-") and d.startswith(want)) for d in devices)]
    pods = (f"kubectl -n {namespace} get pods -o wide -l app.kubernetes.io/name={DRA_DAEMONSET} "
            f"--field-selector spec.nodeName={node.name}")
    if missing:
        return [Finding(STEP, Verdict.FINDING, f"{node.name} uses gpunode's DRA driver (gpu_allocation = dra) but its "
                        f"ResourceSlice lacks {len(missing)} of its {len(gpus)} GPU(s): {', '.join(missing)}",
                        evidence + [f"nvidia-smi on {node.name}: {len(gpus)} GPU(s)",
                                    f"kubectl get node {node.name}: label {DRA_LABEL}="
                                    f"{node.labels.get(DRA_LABEL, '<missing>')}"],
                        f"the DRA driver's pod on {node.name}: {pods} (its log says why; no pod: the node needs the "
                        f"label {DRA_LABEL}=true, which deploys/labels.py sets); re-run deploys/device_plugin.py",
                        code="dra-slice-missing")]
    if node.unschedulable:
        return [cordoned(node, evidence)]
    return [proven(STEP, f"{node.name} offers its {len(gpus)} GPU(s) through gpunode's DRA driver",
                   evidence + [f"kubectl get node {node.name}: allocatable nvidia.com/gpu="
                               f"{node.allocatable.get('nvidia.com/gpu', '<none>')} (no device plugin offers them too)",
                               f"kubectl get node {node.name}: spec.unschedulable not set"])]
