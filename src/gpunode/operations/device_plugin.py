"""Operations of the device-plugin step: apply its objects, wait for the rollout, check allocatable GPUs.

Objects are applied server-side as field manager ``gpunode`` (forced: they are
gpunode's own). An object whose live copy already holds every rendered value
and carries the hash of the rendered document is not written again; except
that the fields deciding where the plugin's pods run and what they run
(nodeSelector, affinity, runtime class, command) must equal the rendered ones
exactly: a key another manager added there is drift, and removed. The waits
poll the API (as ``kubectl rollout status`` and NVIDIA's validator do) and fail
with the first broken link named.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from lightkube import codecs
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType
from pyinfra import host, state
from pyinfra.api import Host, operation
from pyinfra.context import ctx_state

from gpunode.cluster.client import FIELD_MANAGER, ClusterSettings, api_call, get_or_none, transient
from gpunode.cluster.labels import DRA_LABEL, driver_version_of
from gpunode.cluster.manifests import ManifestSettings
from gpunode.cluster.plugin_config import CONFIG_FILE, CONFIG_MAP, DIGEST_ANNOTATION, Offer, expected_offer, text_digest
from gpunode.diagnosis import failures
from gpunode.diagnosis.device_plugin import PRESENT, PULL_FAILED, allocatable_of, diagnose, image_pull_failed
from gpunode.errors import GpunodeError
from gpunode.facts.device_plugin import (
    DAEMONSET,
    RolloutState,
    being_deleted,
    plugin_pod_state,
    pod_ready,
    read_plugin_pod,
    read_plugin_pods,
    read_rollout,
    waiting_reason,
)
from gpunode.facts.labels import NodeLabelsState, parse_node, read_gpu_nodes, read_nodes
from gpunode.image.push import Registry, pin
from gpunode.operations import control_command, failing_command
from gpunode.operations.driver import reboot_planned
from gpunode.operations.labels import labelled_driver, node_of_run, relabelled
from gpunode.operations.reboot import fresh_driver_state
from gpunode.operations.run_state import host_run, run_of

HASH_ANNOTATION = "gpunode.io/applied-hash"
POLL_SECONDS = 1.0
SETTLE_SECONDS = 5.0


@dataclass(frozen=True)
class ClusterPoll:
    """The Nodes, the plugin's pods (by node) and the rollout, as the run's waits saw them at ``taken``."""

    taken: float
    nodes: dict[str, NodeLabelsState]
    pods: dict[str, Pod]
    rollout: RolloutState

    def node(self, name: str) -> NodeLabelsState:
        return self.nodes.get(name) or parse_node(name, None)


_polls: dict[tuple[ClusterSettings, str], ClusterPoll] = {}
_poll_lock = threading.Lock()  # gevent's under pyinfra: one host refreshes, the others wait for its answer


def poll_cluster(settings: ClusterSettings, namespace: str) -> ClusterPoll:
    """What every host's allocatable wait reads: one list of Nodes, one of plugin pods and the DaemonSet per
    POLL_SECONDS, shared by all hosts of the run.

    Each host reading its own node, pod, rollout (and the log and events of a pod not ready yet) every second was
    up to five calls per host per second: at 100 simulated nodes the API server's reads timed out.
    """
    key = (settings, namespace)
    with _poll_lock:
        poll = _polls.get(key)
        if poll is None or time.monotonic() - poll.taken >= POLL_SECONDS:
            poll = ClusterPoll(time.monotonic(), read_nodes(settings), read_plugin_pods(settings, namespace),
                               read_rollout(settings, namespace))
            _polls[key] = poll
        return poll


def retry_or_raise(target: Host, error: GpunodeError, deadline: float, what: str, told: list[bool]) -> None:
    """A transient API failure during a wait is retried until the wait's deadline (said once); others raise."""
    if not transient(error) or time.monotonic() > deadline:
        raise GpunodeError(f"{error.problem} (while {what})", error.fix) from error
    if not told:
        told.append(True)
        target.log(f"the API did not answer ({error.args[0] if error.args else error}); retrying until the "
                   "wait's deadline")


def stamped(document: dict) -> dict:
    """The document with the hash of its rendered content as an annotation."""
    digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]
    out = json.loads(json.dumps(document))
    out.setdefault("metadata", {}).setdefault("annotations", {})[HASH_ANNOTATION] = digest
    return out


def holds(live: object, wanted: object) -> bool:
    """True when ``live`` holds every value of ``wanted`` (the server may add defaults around them)."""
    if isinstance(wanted, dict):
        return isinstance(live, dict) and all(holds(live.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(live, list) and len(live) == len(wanted) and all(map(holds, live, wanted))
    return live == wanted


# the pod template's fields that decide which nodes get a plugin pod and what it runs: exact, absent stays absent
EXACT_POD_FIELDS = ("nodeSelector", "affinity", "nodeName", "runtimeClassName")
EXACT_CONTAINER_FIELDS = ("command", "args", "image")


def foreign_extras(live: dict | None, wanted: dict) -> dict:
    """A merge patch removing what the live DaemonSet selects or runs beyond the rendered one ({} if nothing).

    Server-side apply keeps a key another field manager added (a nodeSelector entry, an affinity, a command),
    so re-applying cannot repair it; these are nulled explicitly.
    """
    if wanted.get("kind") != "DaemonSet" or not live:
        return {}
    want = wanted["spec"]["template"]["spec"]
    have = ((live.get("spec") or {}).get("template") or {}).get("spec") or {}
    patch: dict = {}
    for key in EXACT_POD_FIELDS:
        if key not in have:
            continue
        if key not in want:
            patch[key] = None
        elif isinstance(want[key], dict) and isinstance(have[key], dict) and key == "nodeSelector":
            extra = {k: None for k in have[key] if k not in want[key]}
            if extra:
                patch[key] = extra
    containers = []
    for live_container in have.get("containers") or []:
        rendered = next((c for c in want["containers"] if c["name"] == live_container.get("name")), None)
        extra = {k: None for k in EXACT_CONTAINER_FIELDS if rendered is not None and k in live_container
                 and k not in rendered}
        if extra:
            containers.append({"name": live_container["name"], **extra})
    if containers:
        patch["containers"] = containers
    return {"spec": {"template": {"spec": patch}}} if patch else {}


def foreign_config(live: dict | None, wanted: dict) -> list[str]:
    """Where the live object carries a plugin configuration the rendered one does not: applying would drop it.

    A config file flag or variable in the DaemonSet, or a ConfigMap whose config another manager edited.
    """
    if not live:
        return []
    found = []
    if wanted.get("kind") == "DaemonSet":
        want = wanted["spec"]["template"]["spec"]["containers"]
        template = (live.get("spec") or {}).get("template") or {}
        ours = DIGEST_ANNOTATION in ((template.get("metadata") or {}).get("annotations") or {})
        for container in (template.get("spec") or {}).get("containers") or []:
            rendered = next((c for c in want if c["name"] == container.get("name")), {})
            flags = [a for a in container.get("args") or [] if str(a).startswith("--config-file")
                     and a not in (rendered.get("args") or []) and not (ours and a == f"--config-file={CONFIG_FILE}")]
            names = {e.get("name") for e in rendered.get("env") or []}
            env = [f"{e['name']}={e.get('value', '')}" for e in container.get("env") or []
                   if e.get("name") == "CONFIG_FILE" and "CONFIG_FILE" not in names]
            found += [f"daemonset {live['metadata']['name']} container {container.get('name')}: {item}"
                      for item in flags + env]
    if wanted.get("kind") == "ConfigMap" and wanted["metadata"]["name"] == CONFIG_MAP:  # the plugin's config
        live_text = str((live.get("data") or {}).get("config.yaml") or "")
        applied = ((live.get("metadata") or {}).get("annotations") or {}).get(DIGEST_ANNOTATION)
        if text_digest(live_text) != applied and live_text != (wanted.get("data") or {}).get("config.yaml"):
            found.append(f"configmap {live['metadata']['name']} data config.yaml was edited since gpunode applied "
                         f"it (digest {text_digest(live_text)}, gpunode applied {applied}): "
                         + " ".join(live_text.split())[:200])
    return found


def drift_lines(patch: dict) -> list[str]:
    spec = patch["spec"]["template"]["spec"]
    lines = [f"{key}: {', '.join(value) if isinstance(value, dict) else 'set'}" for key, value in spec.items()
             if key != "containers"]
    lines += [f"container {c['name']}: {', '.join(k for k in c if k != 'name')}" for c in spec.get("containers", [])]
    return lines


def _read_live(settings: ClusterSettings, document: dict) -> dict | None:
    resource = type(codecs.from_dict(document))
    meta = document["metadata"]
    live = api_call(settings, f"read {document['kind']} {meta['name']}",
                    lambda client: get_or_none(client, resource, meta["name"], meta.get("namespace")))
    return live.to_dict() if live is not None else None


def retry_pulls(target: Host, settings: ClusterSettings, namespace: str) -> None:
    """Delete the plugin pods whose image pull failed: with the pull Secret just changed, their successors pull
    at once instead of after the kubelet's back-off (up to 5 minutes)."""
    for node, pod in sorted(read_plugin_pods(settings, namespace).items()):
        if waiting_reason(pod) in PULL_FAILED and not being_deleted(pod):
            name = pod.metadata.name
            api_call(settings, f"delete pod {namespace}/{name}",
                     lambda client, name=name: client.delete(Pod, name, namespace=namespace))
            target.log(f"deleted {name} on {node}: its image pull failed before the pull Secret changed")


def apply_documents(target: Host, settings: ClusterSettings, documents: list[dict],
                    extras: dict[str, dict] | None = None) -> None:
    """Apply each document; then remove what other managers added to the DaemonSet's selecting fields."""
    for document in documents:
        obj = codecs.from_dict(document)
        api_call(settings, f"apply {document['kind']} {document['metadata']['name']}",
                 lambda client, obj=obj: client.apply(obj, field_manager=FIELD_MANAGER, force=True))
        target.log(f"applied {document['kind']} {document['metadata']['name']}")
        if document["kind"] == "Secret":
            retry_pulls(target, settings, document["metadata"]["namespace"])
        patch = (extras or {}).get(document["metadata"]["name"]) if document["kind"] == "DaemonSet" else None
        if patch:
            meta = document["metadata"]
            api_call(settings, f"remove foreign fields from daemonset {meta['name']}",
                     lambda client, meta=meta, patch=patch: client.patch(
                         DaemonSet, meta["name"], patch, namespace=meta.get("namespace"), patch_type=PatchType.MERGE,
                         field_manager=FIELD_MANAGER))
            target.log(f"removed from daemonset {meta['name']} what another manager added: "
                       + "; ".join(drift_lines(patch)))


@operation()
def manifests_applied(documents: list[dict], settings: ClusterSettings):
    """
    Apply the device plugin's objects (namespace first); objects already as rendered are not written.

    + documents: the rendered manifests (gpunode.cluster.manifests)
    + settings: which cluster
    """
    wanted = [stamped(d) for d in documents]
    stale, extras, kept = [], {}, []
    try:
        for document in wanted:
            live = _read_live(settings, document)
            kept += foreign_config(live, document)
            patch = foreign_extras(live, document)
            if patch:
                extras[document["metadata"]["name"]] = patch
            if patch or not holds(live, document):
                stale.append(document)
    except GpunodeError as error:
        yield failing_command(str(error))
        return
    if kept:
        yield failing_command("the live device plugin carries a configuration the inventory does not; applying "
                              "would drop it (time-slicing, renames, MIG settings):\n  " + "\n  ".join(kept)
                              + "\n  fix: put that configuration in plugin_config (gpunode then carries it in the "
                              f"ConfigMap {CONFIG_MAP}), or remove it from the cluster first if it is not wanted")
        return
    if not stale:
        host.noop(f"{len(wanted)} device-plugin object(s) up to date")
        return
    run_of(state).rolling = True
    yield control_command(apply_documents, settings, stale, extras)


def pinned_manifests(manifests: ManifestSettings, registry: Registry, say: Callable[[str], None]) -> ManifestSettings:
    """The settings with plugin_image pinned to the digest its tag has in the registry (once per run and image;
    said once); as given where it cannot be resolved from here (then the nodes pull the tag)."""
    cache = run_of(state).pinned if ctx_state.isset() else {}  # a deploy's run, or one command (render)
    if manifests.image not in cache:
        cache[manifests.image] = pin(manifests.image, registry)
        say(cache[manifests.image][1])
    return replace(manifests, image=cache[manifests.image][0])


def pull_refused(settings: ClusterSettings, namespace: str, pods: dict[str, Pod], image: str = "") -> None:
    """Raise, with the kubelet's words and the fix, when a plugin pod's image cannot be pulled: the kubelet only
    backs off (up to 5 minutes), so waiting out the deploy's timeout would change nothing. With ``image`` (the
    template's now), a pod asking for another image is left out: it is of an older template, which the DaemonSet
    controller replaces (a deploy that repairs a wrong image sees the old pod back off until then)."""
    for node, pod in sorted(pods.items()):
        if waiting_reason(pod) != "ImagePullBackOff" or being_deleted(pod) or older_template(pod, image):
            continue
        found = plugin_pod_state(settings, namespace, node, pod)
        finding = image_pull_failed(f"the device plugin's pod {pod.metadata.name} on {node}", [], found, namespace)
        raise GpunodeError(f"{finding.what}\n  evidence: " + "\n            ".join(finding.evidence), finding.fix)


def older_template(pod: Pod, image: str) -> bool:
    """The pod runs another image than the DaemonSet's template asks for now."""
    containers = pod.spec.containers if pod.spec else []
    return bool(image and containers and containers[0].image != image)


def wait_rollout(target: Host, settings: ClusterSettings, namespace: str) -> None:
    deadline = time.monotonic() + settings.rollout_timeout
    shown = ""
    told: list[bool] = []
    while True:
        try:
            rollout = read_rollout(settings, namespace)
        except GpunodeError as error:
            retry_or_raise(target, error, deadline, "waiting for the device-plugin rollout", told)
            time.sleep(POLL_SECONDS)
            continue
        if rollout.complete and rollout.desired == 0:
            selects_none(settings, namespace, rollout)
        if rollout.complete:
            target.log(f"device plugin rolled out: {rollout.progress()}")
            return
        if rollout.progress() != shown:
            shown = rollout.progress()
            target.log(f"device plugin rollout: {shown}")
        try:
            pull_refused(settings, namespace, read_plugin_pods(settings, namespace), rollout.image)
        except GpunodeError as error:
            if not transient(error):
                raise
        if time.monotonic() > deadline:
            raise GpunodeError(f"the device-plugin rollout did not finish in {settings.rollout_timeout} s "
                               f"({rollout.progress()})",
                               f"kubectl -n {namespace} get pods -o wide; 'gpunode verify' names the node and cause")
        time.sleep(POLL_SECONDS)


def selects_none(settings: ClusterSettings, namespace: str, rollout: RolloutState) -> None:
    """A DaemonSet that places no pod while GPU nodes exist is not rolled out: say what it selects."""
    gpu_nodes = [node for node in read_gpu_nodes(settings) if node.labels.get(DRA_LABEL) != "true"]  # DRA's, not its
    if not gpu_nodes:
        return
    keys = sorted(set(rollout.node_selector) | {PRESENT})
    labels = [f"{node.name}: " + ", ".join(f"{k}={node.labels.get(k, '<missing>')}" for k in keys)
              + (f"; taints {', '.join(node.taints)}" if node.taints else "") for node in gpu_nodes[:10]]
    labels.append(f"daemonset {namespace}/{DAEMONSET} tolerations: {', '.join(rollout.tolerations) or '<none>'}")
    raise GpunodeError(f"the device-plugin DaemonSet selects no node ({rollout.progress()}) while {len(gpu_nodes)} "
                       f"GPU node(s) exist\n  evidence: daemonset {namespace}/{DAEMONSET} nodeSelector: "
                       f"{rollout.selector()}" + (" (plus a node affinity)" if rollout.affinity else "")
                       + "\n            " + "\n            ".join(labels),
                       "the selector must match the GPU nodes' labels (re-run deploys/labels.py; gpunode's manifest "
                       f"selects {PRESENT}=true) and the DaemonSet must tolerate their taints (remove the taint, or "
                       "add a toleration in your copy of device-plugin.yaml.j2 in templates_dir)")


@operation()
def rolled_out(namespace: str, settings: ClusterSettings):
    """
    Wait until the DaemonSet is rolled out (desired == updated == ready) when this run changed it.

    + namespace: the plugin's namespace
    + settings: which cluster (and rollout_timeout)
    """
    try:
        rollout = read_rollout(settings, namespace)
    except GpunodeError as error:
        yield failing_command(str(error))
        return
    if not run_of(state).rolling:  # not changed by this run: a node whose plugin is down is its own check's finding
        host.noop(f"device plugin unchanged ({rollout.progress()})" if rollout.exists
                  else "device plugin not deployed")
        return
    yield control_command(wait_rollout, settings, namespace)


def offer_for(target: Host, gpus: list[dict] | None, manifests: ManifestSettings) -> Offer:
    """What the node must offer: from the driver facts of the run, or of after this run's reboot (gpus None)."""
    if gpus is None:
        state = fresh_driver_state(target)
        gpus = state["nvidia_smi"]["gpus"] if state else []
    return expected_offer(gpus, manifests.mig_strategy, manifests.plugin_config)


def wait_allocatable(target: Host, settings: ClusterSettings, node: str, gpus: list[dict] | None,
                     manifests: ManifestSettings) -> None:
    offer = offer_for(target, gpus, manifests)
    namespace = manifests.namespace
    if offer.count is None:
        target.log(f"{node}: allocatable not compared: {offer.basis}")
        return
    deadline = time.monotonic() + settings.allocatable_timeout
    replaced = host_run(target).replaced  # the plugin pod this run deleted: its numbers must not count
    settled_since: float | None = None
    told: list[bool] = []
    while True:
        try:
            poll = poll_cluster(settings, namespace)
        except GpunodeError as error:
            retry_or_raise(target, error, deadline, f"waiting for {node}'s allocatable GPUs", told)
            time.sleep(POLL_SECONDS)
            continue
        found = poll.pods.get(node)
        name = found.metadata.name if found is not None else ""
        # the count is believed from a ready plugin pod (the kubelet keeps it a while after a plugin goes away),
        # and not from the pod this run replaced
        fresh = pod_ready(found) and name != replaced
        current = poll.node(node)
        if fresh and allocatable_of(current, offer.resource) == offer.count:
            target.log(f"{node}: {offer.count} allocatable {offer.resource}"
                       + (f" (from the new plugin pod {name})" if replaced else ""))
            return
        rollout = poll.rollout
        # a rollout that stays finished without a pod here will not place one: no use waiting for the deadline
        # (held for SETTLE_SECONDS: the status lags a pod deletion by a moment)
        settled_since = (settled_since or time.monotonic()) if rollout.complete and found is None else None
        settled = settled_since is not None and time.monotonic() - settled_since >= SETTLE_SECONDS
        backing_off = waiting_reason(found) == "ImagePullBackOff"  # the kubelet retries a pull; waiting fixes nothing
        late = time.monotonic() > deadline or backing_off
        pod = None
        if settled or late:  # the pod's full state (its log and Warning events when not ready) only to explain
            pod = plugin_pod_state(settings, namespace, node, found)
            findings = failures(diagnose(rollout, pod, current, offer, namespace))
            if findings:
                finding = findings[0]
                waited = ("the rollout is complete and placed no pod here" if settled and not late else
                          "the kubelet backs off pulling it" if backing_off else
                          f"after {settings.allocatable_timeout} s")
                raise GpunodeError(f"{finding.what} ({waited})\n  evidence: "
                                   + "\n            ".join(finding.evidence), finding.fix)
        if late and pod is not None:
            waiting = "" if fresh else (
                f"; the device-plugin pod that replaces {replaced} is not ready" if replaced
                else "; no ready device-plugin pod there") + (f" ({pod.name})" if pod.exists else " (none yet)")
            raise GpunodeError(f"{node} offers {allocatable_of(current, offer.resource)} allocatable "
                               f"{offer.resource}, {offer.count} expected ({offer.basis}), after "
                               f"{settings.allocatable_timeout} s{waiting}; no cause found",
                               f"kubectl -n {namespace} get pods -o wide --field-selector spec.nodeName={node}; "
                               "'gpunode doctor' on the node, or raise allocatable_timeout")
        time.sleep(POLL_SECONDS)


def restart_plugin_pod(target: Host, settings: ClusterSettings, node: str, namespace: str, previous: str | None,
                       current: str | None, app: str = DAEMONSET) -> None:
    if current is None:
        state = fresh_driver_state(target)
        current = state["nvidia_smi"]["gpus"][0]["driver_version"] if state else None
    if previous is None or current is None or previous == current:
        return
    pod = read_plugin_pod(settings, namespace, node, app)
    if not pod.exists:
        return
    api_call(settings, f"restart {namespace}/{pod.name}",
             lambda client: client.delete(Pod, pod.name, namespace=namespace))
    host_run(target).replaced = pod.name
    what = "the device plugin" if app == DAEMONSET else f"gpunode's DRA driver ({app})"
    target.log(f"driver {previous} -> {current}: restarted {what} ({pod.name}); its DaemonSet makes a new one")


@operation()
def restarted_after_driver_change(node_name: str, namespace: str, settings: ClusterSettings,
                                  driver_version: str | None, daemonset: str = DAEMONSET):
    """
    Restart the node's device-plugin pod (or DRA driver pod) when its driver changed since gpunode last labelled
    the node (either keeps the old driver's libraries loaded until it restarts). The labels step of the same run
    tells what the labels said before it updated them.

    + node_name: the Node's name
    + namespace: the plugin's namespace
    + settings: which cluster
    + driver_version: the driver the node runs now (None: no working driver when the run began)
    + daemonset: whose pod (gpunode's device plugin, or its DRA driver on a gpu_allocation = dra node)
    """
    if reboot_planned(host):
        driver_version = None  # the driver of after the reboot, read then
    elif driver_version is None:
        host.noop(f"node {node_name}: no driver to compare")
        return
    previous = labelled_driver(host)
    if previous is None:  # the labels step did not run before this one: the node's labels are still the old ones
        try:
            previous = driver_version_of(node_of_run(settings, node_name).labels)
        except GpunodeError as error:
            yield failing_command(str(error))
            return
    if driver_version is not None and (previous is None or previous == driver_version):
        host.noop(f"node {node_name}: driver {driver_version} unchanged")
        return
    host_run(host).replugged = True
    yield control_command(restart_plugin_pod, settings, node_name, namespace, previous, driver_version, daemonset)


@operation()
def allocatable_matches(node_name: str, gpus: list[dict] | None, manifests: ManifestSettings,
                        settings: ClusterSettings):
    """
    Check that the node offers what its GPUs and the plugin's configuration call for (``nvidia.com/gpu`` per
    GPU, times the time-slicing replicas, under a renamed resource if so); polls up to ``allocatable_timeout``
    when the plugin is being rolled out or the numbers differ.

    + node_name: the Node's name
    + gpus: the driver facts' GPU rows (None: no working driver when the run began)
    + manifests: the plugin's settings (namespace, MIG strategy, plugin_config)
    + settings: which cluster
    """
    if reboot_planned(host):
        gpus = None  # the GPUs of after the reboot, counted then
    elif gpus is None:
        host.noop(f"node {node_name}: no GPUs to check")
        return
    try:
        current = node_of_run(settings, node_name)
    except GpunodeError as error:
        yield failing_command(str(error))
        return
    offer = expected_offer(gpus, manifests.mig_strategy, manifests.plugin_config) if gpus is not None else None
    if offer is not None and offer.count is None:
        host.noop(f"node {node_name}: allocatable not compared ({offer.basis})")
        return
    if offer is not None and allocatable_of(current, offer.resource) == offer.count and not (
            relabelled(host) or run_of(state).rolling or host_run(host).replugged):
        host.noop(f"node {node_name}: {offer.count} allocatable {offer.resource}")
        return
    yield control_command(wait_allocatable, settings, node_name, gpus, manifests)
