"""Dynamic Resource Allocation references in manifests, checked across every file of one lint run.

A pod names its claims (``spec.resourceClaims``: a ResourceClaim or a ResourceClaimTemplate), its containers
name those (``resources.claims``), and each claim's requests name a DeviceClass. The API server refuses a
container claim the pod does not list and a pod claim with neither or both sources, and a request count below
one (its own words, ``pkg/apis/core/validation`` and ``pkg/apis/resource/validation``); a template, a claim or
a device class the manifests do not define is accepted and leaves the pod Pending until it exists: a warning,
since the cluster may already have it. So is a selector (a DeviceClass's or a request's CEL expression) that reads
an attribute gpunode's DRA driver does not publish, or compares one of its versions with a string: the API server
takes it (attributes are typed only at run time), and the scheduler's evaluation fails on every device of the
driver (a CEL runtime error: ``no such key``, ``no such overload``), so no claim with it is ever allocated.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass

import yaml

from gpunode.diagnosis.device_plugin import DRA_DRIVER

# What gpunode's DRA driver publishes for each device (gpunode_plugin.dra_devices; a test keeps them equal):
# attribute -> its type, and the capacities
ATTRIBUTES = {"type": "string", "uuid": "string", "index": "int", "minor": "int", "productName": "string",
              "pciBusID": "string", "profile": "string", "parentUUID": "string", "cudaComputeCapability": "version",
              "driverVersion": "version", "cudaDriverVersion": "version"}
CAPACITIES = {"memory": "quantity"}
# device.attributes['<domain>'].name, or ["name"]; device.capacity likewise
REFERENCE = re.compile(r"""device\.(attributes|capacity)\[\s*(['"])([^'"]+)\2\s*\]"""
                       r"""(?:\s*\.\s*(\w+)|\[\s*(['"])(\w+)\5\s*\])""")
STRING_COMPARED = re.compile(r"""\s*(==|!=|<=|>=|<|>)\s*['"]""")
CLAIM_KINDS = {"ResourceClaim": ("spec",), "ResourceClaimTemplate": ("spec", "spec")}  # kind -> path to its claim spec
SOURCES = ("resourceClaimName", "resourceClaimTemplateName")


@dataclass(frozen=True)
class Manifest:
    """One document of the run: the object, its YAML node (for lines) and its file."""

    document: dict
    root: yaml.Node
    source: str

    @property
    def kind(self) -> str:
        return str(self.document.get("kind") or "")

    @property
    def name(self) -> str:
        return str((self.document.get("metadata") or {}).get("name") or "?")

    @property
    def namespace(self) -> str | None:
        return (self.document.get("metadata") or {}).get("namespace")


def value_at(document: object, path: tuple[str, ...]) -> object:
    """The value at ``path`` (keys from the document), None where a step is missing or not a mapping."""
    for key in path:
        document = document.get(key) if isinstance(document, dict) else None
    return document


# (manifest, path through the document to the offending field, what, fix, level)
Report = Callable[[Manifest, str, str, str, str], None]


def defined(manifests: list[Manifest]) -> dict[str, set[tuple[str | None, str]]]:
    """The DeviceClasses (cluster-scoped: namespace None), ResourceClaims and ResourceClaimTemplates defined."""
    found: dict[str, set[tuple[str | None, str]]] = {"DeviceClass": set(), **{kind: set() for kind in CLAIM_KINDS}}
    for manifest in manifests:
        if manifest.kind in found:
            found[manifest.kind].add((None if manifest.kind == "DeviceClass" else manifest.namespace, manifest.name))
    return found


def check_pod(manifest: Manifest, spec: dict, spec_path: str, known: dict[str, set], report: Report) -> None:
    """The pod's claims and its containers' references to them."""
    claims = [c for c in spec.get("resourceClaims") or [] if isinstance(c, dict)]
    names = sorted(str(c.get("name")) for c in claims if c.get("name"))
    for index, claim in enumerate(claims):
        field = f"{spec_path}.resourceClaims[{index}]"
        given = [key for key in SOURCES if claim.get(key)]
        if len(given) != 1:
            detail = ("must specify one of: `resourceClaimName`, `resourceClaimTemplateName`" if not given else
                      "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified")
            report(manifest, field, f"{field}: Invalid value: {claim.get('name')!r}: {detail}",
                   "name exactly one source: resourceClaimTemplateName (a claim per pod) or resourceClaimName (one "
                   "claim shared by the pods naming it)", "error")
            continue
        kind = "ResourceClaimTemplate" if given[0] == "resourceClaimTemplateName" else "ResourceClaim"
        wanted = str(claim[given[0]])
        if (manifest.namespace, wanted) not in known[kind]:
            report(manifest, f"{field}.{given[0]}",
                   f"{manifest.kind} {manifest.name!r} names the {kind} {wanted!r}, which these manifests do not "
                   "define: the pod stays Pending until it exists", f"define it (kind: {kind}, metadata.name: "
                   f"{wanted}) in the pod's namespace, or check that the cluster has it: kubectl get "
                   f"{kind.lower()} {wanted}", "warning")
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group) or []):
            if not isinstance(container, dict):
                continue
            for position, used in enumerate((container.get("resources") or {}).get("claims") or []):
                name = str((used or {}).get("name") or "") if isinstance(used, dict) else ""
                if name and name not in names:
                    field = f"{spec_path}.{group}[{index}].resources.claims[{position}]"
                    detail = "must be one of the names in pod.spec.resourceClaims" + (
                        f": {', '.join(names)}" if names else " which is empty")
                    report(manifest, field, f'{field}: Not found: "{name}": {detail}',
                           f"add to the pod spec:\nresourceClaims:\n- name: {name}\n  resourceClaimTemplateName: "
                           "<a ResourceClaimTemplate>" if not names else f"use one of: {', '.join(names)}", "error")


def check_claim(manifest: Manifest, known: dict[str, set], report: Report) -> None:
    """Each request's device class and count (v1: ``exactly`` and ``firstAvailable``; v1beta1: the request)."""
    path = CLAIM_KINDS[manifest.kind]
    requests = value_at(manifest.document, (*path, "devices", "requests"))
    base = ".".join(path) + ".devices.requests"
    for index, request in enumerate(requests if isinstance(requests, list) else []):
        if not isinstance(request, dict):
            continue
        asks = [(f"{base}[{index}].exactly", request["exactly"])] if isinstance(request.get("exactly"), dict) else []
        asks += [(f"{base}[{index}].firstAvailable[{n}]", sub)
                 for n, sub in enumerate(request.get("firstAvailable") or []) if isinstance(sub, dict)]
        if not asks and request.get("deviceClassName"):  # v1beta1
            asks = [(f"{base}[{index}]", request)]
        for field, ask in asks:
            check_request(manifest, field, ask, known, report)


def check_selectors(manifest: Manifest, field: str, selectors: object, report: Report) -> None:
    """Each CEL selector's reads of gpunode's DRA driver's attributes and capacities (other drivers' are theirs)."""
    for index, selector in enumerate(selectors if isinstance(selectors, list) else []):
        expression = value_at(selector, ("cel", "expression"))
        if not isinstance(expression, str):
            continue
        where = f"{field}[{index}].cel.expression"
        for match in REFERENCE.finditer(expression):
            kind, domain, name = match.group(1), match.group(3), match.group(4) or match.group(6)
            if domain != DRA_DRIVER:
                continue
            published = ATTRIBUTES if kind == "attributes" else CAPACITIES
            read = f"device.{kind}['{domain}'].{name}"
            if name not in published:
                close = difflib.get_close_matches(name, list(published), 1)
                hint = f"did you mean {close[0]}? " if close else ""
                report(manifest, where, f"{manifest.kind} {manifest.name!r}: its selector reads {read}, which "
                       "gpunode's DRA driver does not publish: the scheduler's evaluation fails on each of its "
                       "devices (CEL's 'no such key'), so a claim with it stays Pending",
                       f"{hint}the driver publishes the {kind} {', '.join(sorted(published))} ('kubectl get "
                       "resourceslices -o yaml' shows each device's)", "warning")
            elif published[name] == "version" and STRING_COMPARED.match(expression, match.end()):
                report(manifest, where, f"{manifest.kind} {manifest.name!r}: its selector compares {read}, a "
                       "semantic version, with a string: the scheduler's evaluation fails on each of the driver's "
                       "devices, so a claim with it stays Pending", f"compare versions with versions: "
                       f"{read}.isGreaterThan(semver('1.2.3')), or {read} == semver('1.2.3') (three numbers, "
                       "as the driver publishes them)", "warning")


def check_device_class(manifest: Manifest, report: Report) -> None:
    check_selectors(manifest, "spec.selectors", value_at(manifest.document, ("spec", "selectors")), report)


def check_request(manifest: Manifest, field: str, ask: dict, known: dict[str, set], report: Report) -> None:
    check_selectors(manifest, f"{field}.selectors", ask.get("selectors"), report)
    device_class = str(ask.get("deviceClassName") or "")
    if device_class and (None, device_class) not in known["DeviceClass"]:
        report(manifest, f"{field}.deviceClassName",
               f"{manifest.kind} {manifest.name!r} asks for devices of the DeviceClass {device_class!r}, which these "
               "manifests do not define: the claim cannot be allocated until it exists",
               f"kubectl get deviceclass {device_class} (a DRA driver installs its classes), or fix the name",
               "warning")
    mode, count = ask.get("allocationMode") or "ExactCount", ask.get("count")
    if not isinstance(count, int) or isinstance(count, bool):
        return
    if mode == "ExactCount" and count < 0:  # 0 (unset) is defaulted to 1 before validation
        report(manifest, f"{field}.count", f"{field}.count: Invalid value: {count}: must be greater than zero",
               "count: 1 (or how many devices the request needs)", "error")
    elif mode == "All" and count:
        report(manifest, f"{field}.count",
               f"{field}.count: Invalid value: {count}: must not be specified when allocationMode is 'All'",
               "drop count (All takes every matching device) or use allocationMode: ExactCount", "error")
