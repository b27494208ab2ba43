"""Reading a pod's ResourceClaims (Dynamic Resource Allocation) and the devices around them, for ``doctor --pod``.

A pod that asks for devices through claims (``spec.resourceClaims``: a claim by name, or one the control plane makes
from a template, named in ``status.resourceClaimStatuses``) is scheduled only where every claim can be allocated.
When it cannot, the scheduler says "cannot allocate all claims" and no more; what the SRE needs next is what each
claim asks (device class, count), what the nodes offer (their ResourceSlices, per driver) and which claims hold
those devices, and the selectors of the classes they name. Read with three lists (every claim, slice and
DeviceClass). The slices alone also tell verify which nodes a DRA driver offers (a node offered by it and by a
device plugin too is offered twice).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice

from gpunode.cluster.client import ClusterSettings, api_call, get_or_none


@dataclass(frozen=True)
class ClaimView:
    """One of the pod's claims as the API has it ("" as ``name`` when the claim was not created yet)."""

    entry: str  # the pod's name for it (spec.resourceClaims[].name)
    name: str
    requests: tuple[str, ...] = ()  # "gpu: 2 x gpu.gpunode.io" (one per request, first choice of firstAvailable)
    allocated: tuple[str, ...] = ()  # "driver/pool/device" of each allocated device
    asks: tuple[tuple[str, int | None], ...] = ()  # (device class, count; None for allocationMode All)
    selectors: tuple[str, ...] = ()  # the requests' own CEL expressions


@dataclass(frozen=True)
class DraView:
    """The pod's claims, what each node's ResourceSlices offer (node -> driver -> devices) and who holds what."""

    claims: tuple[ClaimView, ...]
    offered: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # node -> driver -> "pool/device"
    held: dict[str, str] = field(default_factory=dict)  # "driver/pool/device" -> "namespace/claim"
    classes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # DeviceClass -> its CEL selectors


def pod_claim_names(pod: dict) -> list[tuple[str, str]]:
    """(entry, claim name) for each claim the pod spec names; a template's claim by the name its status gives."""
    made = {s.get("name"): s.get("resourceClaimName") or "" for s in
            ((pod.get("status") or {}).get("resourceClaimStatuses") or [])}
    names = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        names.append((entry.get("name", ""), entry.get("resourceClaimName") or made.get(entry.get("name"), "")))
    return names


def asked(claim: dict) -> list[tuple[str, dict]]:
    """Each request's name and what it asks (``exactly``, or the first choice of ``firstAvailable``)."""
    return [(request.get("name", "?"), request.get("exactly") or next(iter(request.get("firstAvailable") or []), {}))
            for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []]


def count_of(ask: dict) -> int | None:
    return None if (ask.get("allocationMode") or "ExactCount") == "All" else int(ask.get("count") or 1)


def cel_of(selectors: list[dict] | None) -> tuple[str, ...]:
    return tuple(s["cel"]["expression"] for s in selectors or [] if (s.get("cel") or {}).get("expression"))


def request_lines(requests: list[tuple[str, dict]]) -> tuple[str, ...]:
    lines = []
    for name, ask in requests:
        count = count_of(ask)
        lines.append(f"{name}: {'all' if count is None else count} x {ask.get('deviceClassName', '?')}"
                     + (f" ({len(ask['selectors'])} selector(s))" if ask.get("selectors") else ""))
    return tuple(lines)


def allocated_devices(claim: dict) -> tuple[str, ...]:
    results = ((((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or [])
    return tuple(f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}" for r in results)


def claim_view(entry: str, claim: dict | None, name: str) -> ClaimView:
    if claim is None:
        return ClaimView(entry, name)
    requests = asked(claim)
    asks = tuple((str(ask.get("deviceClassName", "?")), count_of(ask)) for _, ask in requests)
    selectors = tuple(e for _, ask in requests for e in cel_of(ask.get("selectors")))
    return ClaimView(entry, name, request_lines(requests), allocated_devices(claim), asks, selectors)


def offered_devices(slices: list[dict]) -> dict[str, dict[str, list[str]]]:
    offered: dict[str, dict[str, list[str]]] = {}
    for item in slices:
        spec = item.get("spec") or {}
        node = spec.get("nodeName") or ("all nodes" if spec.get("allNodes") else "some nodes")
        pool = (spec.get("pool") or {}).get("name", "?")
        devices = offered.setdefault(node, {}).setdefault(spec.get("driver", "?"), [])
        devices += [f"{pool}/{d.get('name')}" for d in spec.get("devices") or []]
    return offered


def read(client: Any, namespace: str, pod: dict) -> DraView | None:
    """The pod's claims and the devices around them; None for a pod that names no claim."""
    names = pod_claim_names(pod)
    if not names:
        return None
    everyone = [c.to_dict() for c in client.list(ResourceClaim, namespace="*")]
    by_name = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in everyone}
    claims = tuple(claim_view(entry, by_name.get((namespace, name)) if name else None, name)
                   for entry, name in names)
    held = {device: f"{c['metadata']['namespace']}/{c['metadata']['name']}"
            for c in everyone for device in allocated_devices(c)}
    slices = [s.to_dict() for s in client.list(ResourceSlice)]
    wanted = {name for claim in claims for name, _ in claim.asks}
    classes = {c["metadata"]["name"]: cel_of((c.get("spec") or {}).get("selectors"))
               for c in (d.to_dict() for d in client.list(DeviceClass)) if c["metadata"]["name"] in wanted}
    return DraView(claims, offered_devices(slices), held, classes)


def read_offered(settings: ClusterSettings) -> dict[str, dict[str, list[str]]]:
    """What every node's ResourceSlices offer (node -> driver -> devices), in one list call; a GpunodeError where
    they cannot be read (no DRA API, RBAC): the caller decides whether that matters."""
    return offered_devices(api_call(settings, "list the ResourceSlices",
                                    lambda client: [s.to_dict() for s in client.list(ResourceSlice)]))


def device_names(slices: list[dict]) -> list[str]:
    """The names of every device the ``slices`` list, sorted."""
    return sorted(str(d.get("name")) for s in slices for d in (s.get("spec") or {}).get("devices") or [])


def read_slice_devices(settings: ClusterSettings, name: str) -> list[str]:
    """The device names of the ResourceSlice ``name`` (one GET; [] when there is none)."""
    found = api_call(settings, f"read ResourceSlice {name}", lambda client: get_or_none(client, ResourceSlice, name))
    return device_names([found.to_dict()] if found is not None else [])


def read_node_devices(settings: ClusterSettings, node: str, driver: str) -> list[str]:
    """The device names ``driver`` publishes for ``node``: its ResourceSlices in one list filtered by the API
    server (spec.nodeName, spec.driver), not every slice of the cluster."""
    slices = api_call(settings, f"list the ResourceSlices of node {node}",
                      lambda client: [s.to_dict() for s in client.list(
                          ResourceSlice, fields={"spec.nodeName": node, "spec.driver": driver})])
    return device_names(slices)
