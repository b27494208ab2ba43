"""Operations of the device-plugin step: apply its objects, wait for the rollout, check allocatable GPUs.

Objects are applied server-side as field manager ``gpunode`` (forced: they are
gpunode's own). An object whose live copy already holds every rendered value
and carries the hash of the rendered document is not written again. The waits
poll the API (as ``kubectl rollout status`` and NVIDIA's validator do) and fail
with the first broken link named.
"""

from __future__ import annotations

import hashlib
import json
import time
from weakref import WeakKeyDictionary

from lightkube import codecs
from pyinfra import host, state
from pyinfra.api import Host, State, operation

from gpunode.cluster.client import FIELD_MANAGER, ClusterSettings, api_call, get_or_none
from gpunode.diagnosis.device_plugin import allocatable_gpus, diagnose
from gpunode.errors import GpunodeError
from gpunode.facts.device_plugin import read_plugin_pod, read_rollout
from gpunode.facts.labels import read_node
from gpunode.operations import api_command, failing_command
from gpunode.operations.labels import relabelled

HASH_ANNOTATION = "gpunode.io/applied-hash"
POLL_SECONDS = 1.0
# Runs whose objects are being (re)applied: every host's allocatable check then waits for the new pods.
_rolling: WeakKeyDictionary[State, bool] = WeakKeyDictionary()


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


def _read_live(settings: ClusterSettings, document: dict) -> dict | None:
    resource = type(codecs.from_dict(document))
    meta = document["metadata"]
    live = api_call(settings, f"read {document['kind']} {meta['name']}",
                    lambda client: get_or_none(client, resource, meta["name"], meta.get("namespace")))
    return live.to_dict() if live is not None else None


def apply_documents(target: Host, settings: ClusterSettings, documents: list[dict]) -> None:
    for document in documents:
        obj = codecs.from_dict(document)
        api_call(settings, f"apply {document['kind']} {document['metadata']['name']}",
                 lambda client, obj=obj: client.apply(obj, field_manager=FIELD_MANAGER, force=True))
        target.log(f"applied {document['kind']} {document['metadata']['name']}")


@operation()
def manifests_applied(documents: list[dict], settings: ClusterSettings):
    """
    Apply the device plugin's objects (namespace first); objects already as rendered are not written.

    + documents: the rendered manifests (gpunode.cluster.manifests)
    + settings: which cluster
    """
    wanted = [stamped(d) for d in documents]
    try:
        stale = [d for d in wanted if not holds(_read_live(settings, d), d)]
    except GpunodeError as error:
        yield failing_command(str(error))
        return
    if not stale:
        host.noop(f"{len(wanted)} device-plugin object(s) up to date")
        return
    _rolling[state] = True
    yield api_command(apply_documents, settings, stale)


def wait_rollout(target: Host, settings: ClusterSettings, namespace: str) -> None:
    deadline = time.monotonic() + settings.rollout_timeout
    shown = ""
    while True:
        rollout = read_rollout(settings, namespace)
        if rollout.complete:
            target.log(f"device plugin rolled out: {rollout.progress()}")
            return
        if rollout.progress() != shown:
            shown = rollout.progress()
            target.log(f"device plugin rollout: {shown}")
        if time.monotonic() > deadline:
            raise GpunodeError(f"the device-plugin rollout did not finish in {settings.rollout_timeout} s "
                               f"({rollout.progress()})",
                               f"kubectl -n {namespace} get pods -o wide; 'gpunode verify' names the node and cause")
        time.sleep(POLL_SECONDS)


@operation()
def rolled_out(namespace: str, settings: ClusterSettings):
    """
    Wait until the DaemonSet is rolled out (desired == updated == ready) when it is being changed or is not yet.

    + namespace: the plugin's namespace
    + settings: which cluster (and rollout_timeout)
    """
    try:
        rollout = read_rollout(settings, namespace)
    except GpunodeError as error:
        yield failing_command(str(error))
        return
    if rollout.complete and not _rolling.get(state):
        host.noop(f"device plugin rolled out ({rollout.progress()})")
        return
    yield api_command(wait_rollout, settings, namespace)


def wait_allocatable(target: Host, settings: ClusterSettings, node: str, expected: int, namespace: str) -> None:
    deadline = time.monotonic() + settings.allocatable_timeout
    while True:
        current = read_node(settings, node)
        if allocatable_gpus(current) == expected:
            target.log(f"{node}: {expected} allocatable nvidia.com/gpu")
            return
        if time.monotonic() > deadline:
            findings = diagnose(read_rollout(settings, namespace), read_plugin_pod(settings, namespace, node),
                                current, expected, namespace)
            if findings:
                finding = findings[0]
                raise GpunodeError(f"{finding.what} (after {settings.allocatable_timeout} s)\n  evidence: "
                                   + "\n            ".join(finding.evidence), finding.fix)
            return
        time.sleep(POLL_SECONDS)


@operation()
def allocatable_matches(node_name: str, expected: int, namespace: str, settings: ClusterSettings):
    """
    Check that the node offers as many allocatable ``nvidia.com/gpu`` as its driver sees (polls up to
    ``allocatable_timeout`` when the plugin is being rolled out or the numbers differ).

    + node_name: the Node's name
    + expected: GPUs the driver check found
    + namespace: the plugin's namespace (for the diagnosis)
    + settings: which cluster
    """
    try:
        current = read_node(settings, node_name)
    except GpunodeError as error:
        yield failing_command(str(error))
        return
    if allocatable_gpus(current) == expected and not (relabelled(host) or _rolling.get(state)):
        host.noop(f"node {node_name}: {expected} allocatable nvidia.com/gpu")
        return
    yield api_command(wait_allocatable, settings, node_name, expected, namespace)
