"""What the Kubernetes API says about the device plugin's rollout and its pod on a node.

Read from the API (see gpunode.facts.labels): the DaemonSet's status and the
plugin pod bound to one node, with its container state, so a GPU count that
does not show up as allocatable can be pinned on a cause.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Pod

from gpunode.cluster.client import ClusterSettings, api_call, get_or_none
from gpunode.errors import GpunodeError
from gpunode.facts.node_events import moment

DAEMONSET = "gpunode-device-plugin"


def pod_selector(app: str = DAEMONSET) -> dict[str, str]:
    """The label that gpunode's DaemonSet ``app`` (the device plugin's, the DRA driver's) gives its pods."""
    return {"app.kubernetes.io/name": app}


POD_SELECTOR = pod_selector()


@dataclass(frozen=True)
class RolloutState:
    """The DaemonSet's status, as ``kubectl rollout status`` reads it."""

    exists: bool
    generation: int = 0
    observed: int = 0
    desired: int = 0
    updated: int = 0
    ready: int = 0
    node_selector: dict[str, str] = field(default_factory=dict)  # the pod template's nodeSelector, as live
    affinity: bool = False  # the pod template has a node affinity (it narrows the nodes too)
    tolerations: tuple[str, ...] = ()  # "key=value:Effect" / "key:Effect" (Exists), "*" for tolerate-everything
    image: str = ""  # the image the pod template asks for now (a pod running another is of an older template)

    @property
    def complete(self) -> bool:
        return self.exists and self.observed >= self.generation and self.desired == self.updated == self.ready

    def selector(self) -> str:
        """The nodeSelector as kubectl prints it (``k=v,k2=v2``), for evidence."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.node_selector.items())) or "<none>"

    def progress(self) -> str:
        return f"{self.ready}/{self.desired} ready, {self.updated}/{self.desired} updated"


@dataclass(frozen=True)
class PluginPodState:
    """The plugin pod on one node: none, or its phase and container state."""

    node: str
    name: str = ""
    phase: str = ""
    ready: bool = False
    waiting: str = ""
    restarts: int = 0
    last_exit: int | None = None
    log_tail: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # the pod's last Warning events, "Reason: message", when it is not ready
    unhealthy: tuple[tuple[str, str, str], ...] = ()  # (device, resource, reason) the plugin logged as unhealthy
    waiting_message: str = ""  # the kubelet's words with the waiting reason (an image pull's error, ...)
    image: str = ""  # the image its container runs or is to run

    @property
    def exists(self) -> bool:
        return bool(self.name)


def read_rollout(settings: ClusterSettings, namespace: str) -> RolloutState:
    ds = api_call(settings, f"read daemonset {namespace}/{DAEMONSET}",
                  lambda client: get_or_none(client, DaemonSet, DAEMONSET, namespace))
    if ds is None:
        return RolloutState(False)
    status = ds.status
    template = ds.spec.template.spec if ds.spec and ds.spec.template else None
    return RolloutState(True, ds.metadata.generation or 0, (status.observedGeneration or 0) if status else 0,
                        status.desiredNumberScheduled if status else 0,
                        (status.updatedNumberScheduled or 0) if status else 0, status.numberReady if status else 0,
                        dict(template.nodeSelector or {}) if template else {},
                        bool(template and template.affinity and template.affinity.nodeAffinity),
                        tuple(toleration_text(t) for t in (template.tolerations or [] if template else [])),
                        template.containers[0].image or "" if template and template.containers else "")


def toleration_text(toleration: object) -> str:
    key, value = getattr(toleration, "key", None), getattr(toleration, "value", None)
    effect = getattr(toleration, "effect", None) or "*"
    if not key:
        return "*"
    return f"{key}{'=' + value if value else ''}:{effect}"


UNHEALTHY_LINE = re.compile(r"device (?P<device>\S+) of (?P<resource>\S+) unhealthy: (?P<reason>.+)$")


def unhealthy_devices(lines: list[str]) -> tuple[tuple[str, str, str], ...]:
    """The devices the plugin logged unhealthy (text or JSON log lines), the last word per device kept."""
    found: dict[str, tuple[str, str, str]] = {}
    for line in lines:
        text = line.strip()
        if text.startswith("{"):
            try:
                text = str(json.loads(text).get("msg", ""))
            except ValueError:
                pass
        match = UNHEALTHY_LINE.search(text)
        if match:
            found[match.group("device")] = (match.group("device"), match.group("resource"), match.group("reason"))
    return tuple(found.values())


def last_words(lines: list[str]) -> tuple[str, ...]:
    """The plugin's own last error line if it printed one (``gpunode-device-plugin: ...``), else the last line."""
    stripped = [line.rstrip("\n") for line in lines if line.strip()]
    own = [line for line in stripped if line.startswith("gpunode-device-plugin:")]
    return tuple((own or stripped)[-1:])


def read_plugin_pod(settings: ClusterSettings, namespace: str, node: str, app: str = DAEMONSET) -> PluginPodState:
    """The node's pod of gpunode's DaemonSet ``app`` (the device plugin's, or the DRA driver's)."""
    def find(client):
        return list(client.list(Pod, namespace=namespace, labels=pod_selector(app),
                                fields={"spec.nodeName": node}))

    pods = api_call(settings, f"list plugin pods on {node}", find)
    return plugin_pod_state(settings, namespace, node, pods[0] if pods else None)


def being_deleted(pod: Pod | None) -> bool:
    """The pod has a deletionTimestamp: on its way out (evicted by a taint, replaced, its node drained), even while
    its process still runs."""
    return pod is not None and pod.metadata is not None and pod.metadata.deletionTimestamp is not None


def read_plugin_pods(settings: ClusterSettings, namespace: str) -> dict[str, Pod]:
    """Every device-plugin pod by the node it is bound to, in one list call (verify and doctor read them so).

    A node's pod being deleted and its successor: the successor is the node's pod. A pod being deleted with no
    successor yet stays in (a wait for the successor must know one is coming); verify and doctor, which judge
    the moment, do not count it as the node's plugin (:func:`being_deleted`).
    """
    pods = api_call(settings, f"list plugin pods in {namespace}",
                    lambda client: list(client.list(Pod, namespace=namespace, labels=POD_SELECTOR)))
    pods.sort(key=lambda pod: not being_deleted(pod))
    return {pod.spec.nodeName: pod for pod in pods if pod.spec and pod.spec.nodeName}


def read_plugin_pod_on(settings: ClusterSettings, namespace: str, node: str) -> Pod | None:
    """The device-plugin pod bound to ``node`` (its successor where one is being deleted), in one list call
    filtered by the node: what the node checker reads instead of every node's."""
    pods = api_call(settings, f"list the plugin pod on {node} in {namespace}",
                    lambda client: list(client.list(Pod, namespace=namespace, labels=POD_SELECTOR,
                                                    fields={"spec.nodeName": node})))
    pods.sort(key=lambda pod: not being_deleted(pod))
    return pods[-1] if pods else None


def pod_ready(pod: Pod | None) -> bool:
    """The pod's (first) container is ready: read from the pod alone, no further API call."""
    statuses = (pod.status.containerStatuses or []) if pod is not None and pod.status else []
    return bool(statuses and statuses[0].ready)


def waiting_reason(pod: Pod | None) -> str:
    """The waiting reason of the pod's (first) container, from the pod alone ('' when it is not waiting)."""
    statuses = (pod.status.containerStatuses or []) if pod is not None and pod.status else []
    state = statuses[0].state if statuses else None
    return (state.waiting.reason or "") if state is not None and state.waiting is not None else ""


def plugin_pod_state(settings: ClusterSettings, namespace: str, node: str, pod: Pod | None,
                     read_log: bool = False) -> PluginPodState:
    """The pod's state; for a pod that is not ready (or with ``read_log``: its node offers fewer GPUs than it
    should), its last log lines too, and the devices it logged unhealthy; Warning events when not ready."""
    if pod is None:
        return PluginPodState(node)
    statuses = (pod.status.containerStatuses or []) if pod.status else []
    container = statuses[0] if statuses else None
    waiting = waiting_reason(pod)
    waiting_message = (container.state.waiting.message or "") if waiting and container and container.state else ""
    # what the pod asks for (once pulled by digest, its status names the image's config digest instead)
    image = pod.spec.containers[0].image if pod.spec and pod.spec.containers else ""
    terminated = container.lastState.terminated if container and container.lastState else None
    log_tail: tuple[str, ...] = ()
    lines: list[str] = []
    if container and (not container.ready or read_log):
        try:
            lines = api_call(settings, f"read the log of {pod.metadata.name}", lambda client: list(
                client.log(pod.metadata.name, namespace=namespace, tail_lines=200)))
            log_tail = tuple(lines[-5:])
        except GpunodeError:  # no log yet (its container has not started): the state above says why
            log_tail = ()
    warnings: tuple[str, ...] = ()
    if not (container and container.ready):
        warnings = pod_warnings(settings, namespace, pod.metadata.name)
    return PluginPodState(node, pod.metadata.name, pod.status.phase if pod.status else "",
                          bool(container and container.ready), waiting,
                          container.restartCount if container else 0, terminated.exitCode if terminated else None,
                          last_words(log_tail), warnings, unhealthy_devices(lines), waiting_message, image or "")


def pod_warnings(settings: ClusterSettings, namespace: str, name: str, keep: int = 3) -> tuple[str, ...]:
    """The pod's last distinct Warning events as the kubelet wrote them (``Reason: message``)."""
    def find(client):
        return list(client.list(Event, namespace=namespace, fields={"involvedObject.name": name, "type": "Warning"}))

    try:
        events = api_call(settings, f"list the events of {namespace}/{name}", find)
    except GpunodeError:
        return ()

    said: list[str] = []
    for event in sorted(events, key=moment, reverse=True):
        line = f"{event.reason}: {(event.message or '').strip()}"
        if line not in said:
            said.append(line)
    return tuple(reversed(said[:keep]))
