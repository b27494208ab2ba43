"""GPU resource specs in workload manifests, checked before the API server or the scheduler sees them.

Class 5 of the runbook (wrong resource spec) in the API server's own words: a
GPU request without a limit (``Limit must be set for non overcommitable
resources``), a request unequal to its limit (``must be equal to nvidia.com/gpu
limit``), a fractional count (``must be an integer``); and class 1's missing
``runtimeClassName: nvidia`` when nvidia is not the cluster's default runtime.
Each finding carries the file, the line and the corrected snippet.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from pathlib import Path

import yaml

from gpunode import lint_dra
from gpunode.lint_dra import Manifest

GPU_PREFIX = "nvidia.com/"
RUNTIME_CLASS = "nvidia"
# kind -> path from the document to its pod spec
POD_SPEC_PATHS = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class SpecError:
    """One invalid field, as the API server reports it (``field: Type: detail``)."""

    field: str
    kind: str  # "Required value" or "Invalid value"
    value: str
    detail: str

    def __str__(self) -> str:
        if self.kind == "Invalid value":
            return f'{self.field}: {self.kind}: "{self.value}": {self.detail}'
        return f"{self.field}: {self.kind}: {self.detail}"


# resource.Quantity's suffixes (k8s.io/apimachinery/pkg/api/resource): decimal SI, binary SI, and decimal exponents
DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?")
IS_NEGATIVE = "must be greater than or equal to 0"  # apimachinery's IsNegativeErrorMsg
NOT_INTEGER = "must be an integer"  # core validation's isNotIntegerErrorMsg


def quantity(value: object) -> Decimal | None:
    """A resource quantity as the API server parses it (``1.0``, ``1000m``, ``1e3``, ``1Ki``), None if it is not one."""
    text = str(value).strip()
    match = QUANTITY.fullmatch(text)
    if not match:
        return None
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        return None
    if match.group(2):
        return number.scaleb(int(match.group(2)[1:]))
    suffix = match.group(3) or ""
    if suffix in BINARY_SUFFIXES:
        return number * (2 ** BINARY_SUFFIXES[suffix])
    return number.scaleb(DECIMAL_SUFFIXES[suffix])


def canonical(number: Decimal) -> str:
    """A quantity as the API server prints it back: whole numbers plain, fractions in milli (``500m``) or finer."""
    if number == number.to_integral_value():
        return str(int(number))
    for suffix, exponent in (("m", 3), ("u", 6), ("n", 9)):
        scaled = number.scaleb(exponent)
        if scaled == scaled.to_integral_value():
            return f"{int(scaled)}{suffix}"
    return str(number)


def _whole_devices(value: object) -> int:
    """The count a fractional GPU quantity rounds up to (at least 1): ``0.5`` and ``500m`` are 1."""
    number = quantity(value)
    return max(1, int(number.to_integral_value(rounding=ROUND_CEILING))) if number is not None else 1


def _milli_whole(number: Decimal) -> bool:
    """The API server's integer check: the milli-value (rounded up, as Quantity.MilliValue does) divides by 1000."""
    milli = number.scaleb(3).to_integral_value(rounding=ROUND_CEILING)
    return milli % 1000 == 0


def value_errors(name: str, value: object, path: str) -> list[SpecError]:
    number = quantity(value)
    if number is None:
        return [SpecError(path, "Invalid value", str(value).strip(), "is not a quantity (the API server refuses "
                          "to decode the object: quantities must match the regular expression "
                          "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$')")]
    errors = []
    if number < 0:
        errors.append(SpecError(path, "Invalid value", canonical(number), IS_NEGATIVE))
    if not _milli_whole(number):
        errors.append(SpecError(path, "Invalid value", canonical(number), NOT_INTEGER))
    return errors


def resource_errors(pod_spec: dict, field_prefix: str = "spec") -> list[SpecError]:
    """The API server's validation of extended (GPU) resources in a pod spec (pkg/apis/core/validation,
    validateResourceRequirements and ValidateResourceQuantityValue, 1.37): quantities compared as quantities."""
    errors: list[SpecError] = []
    for group in ("initContainers", "containers"):
        for index, container in enumerate(pod_spec.get(group) or []):
            if not isinstance(container, dict):
                continue
            resources = container.get("resources") or {}
            requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
            base = f"{field_prefix}.{group}[{index}].resources"
            for name in sorted({*requests, *limits}):
                if not str(name).startswith(GPU_PREFIX):
                    continue
                # requests default to the limits before validation, so a bad limit is reported twice
                merged = {**limits, **requests}
                if name in limits:
                    errors += value_errors(name, limits[name], f"{base}.limits[{name}]")
                if name in merged:
                    errors += value_errors(name, merged[name], f"{base}.requests[{name}]")
                if name in requests and name not in limits:
                    errors.append(SpecError(f"{base}.limits", "Required value", "",
                                            "Limit must be set for non overcommitable resources"))
                elif name in requests:
                    asked, limit = quantity(requests[name]), quantity(limits[name])
                    if asked is not None and limit is not None and asked != limit:
                        errors.append(SpecError(f"{base}.requests", "Invalid value", canonical(asked),
                                                f"must be equal to {name} limit of {canonical(limit)}"))
    return errors


def gpu_containers(pod_spec: dict) -> list[tuple[str, int]]:
    """(group, index) of the containers, init containers included, that ask for at least one NVIDIA device
    (``0`` asks for nothing)."""
    found = []
    for group in ("initContainers", "containers"):
        for index, container in enumerate(pod_spec.get(group) or []):
            if not isinstance(container, dict):
                continue
            resources = container.get("resources") or {}
            values = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
            if any(str(k).startswith(GPU_PREFIX) and (quantity(v) or 0) > 0 for k, v in values.items()):
                found.append((group, index))
    return found


KNOWN_RESOURCE = re.compile(r"nvidia\.com/(gpu|mig-\d+g\.\d+gb(\+me)?|mig-\d+c\.\d+g\.\d+gb)(\.shared)?")


def unknown_resources(pod_spec: dict, known: tuple[str, ...] = ()) -> list[tuple[str, int, str]]:
    """(group, index, name) of NVIDIA resource names no device plugin offers under its usual names (``nvidia.com/gpu``,
    ``nvidia.com/mig-1g.10gb``, their ``.shared`` renames) nor ``known`` (a config's renames): a typo such as
    ``nvidia.com/gpus`` is accepted by the API server and leaves the pod Pending for ever."""
    found = []
    for group in ("initContainers", "containers"):
        for index, container in enumerate(pod_spec.get(group) or []):
            if not isinstance(container, dict):
                continue
            resources = container.get("resources") or {}
            for name in sorted({*(resources.get("requests") or {}), *(resources.get("limits") or {})}):
                text = str(name)
                if text.startswith(GPU_PREFIX) and not KNOWN_RESOURCE.fullmatch(text) and text not in known:
                    found.append((group, index, text))
    return found


@dataclass(frozen=True)
class LintFinding:
    source: str
    line: int
    what: str
    fix: str
    level: str = "error"  # "error": the API server or the runtime refuses it; "warning": likely wrong, accepted

    def __str__(self) -> str:
        mark = "" if self.level == "error" else f"{self.level}: "
        return f"{self.source}:{self.line}: {mark}{self.what}\n  fix:\n" + "\n".join(
            f"    {line}" for line in self.fix.splitlines())

    def as_json(self) -> dict:
        return {"file": self.source, "line": self.line, "level": self.level, "what": self.what, "fix": self.fix}

    def github(self) -> str:
        """A GitHub Actions workflow command: the finding as an annotation on the file's line."""
        def escape(text: str) -> str:
            return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        return f"::{self.level} file={self.source},line={self.line}::{escape(self.what + ' | fix: ' + self.fix)}"


def _node_at(node: yaml.Node, path: tuple[str, ...]) -> yaml.Node | None:
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        node = next((v for k, v in node.value if getattr(k, "value", None) == key), None)
        if node is None:
            return None
    return node


def _line_of(root: yaml.Node, spec_path: tuple[str, ...], field: str) -> int:
    """1-based line of the deepest existing node of ``field`` (a path from the document, through ``spec_path``)."""
    steps: list[str | int] = []
    for bracketed, plain in re.findall(r"\[([^\]]+)\]|([^.\[\]]+)", field)[len(spec_path):]:
        steps.append(int(bracketed) if bracketed.isdigit() else (bracketed or plain))
    node = _node_at(root, spec_path) or root
    for step in steps:
        if isinstance(step, int) and isinstance(node, yaml.SequenceNode) and step < len(node.value):
            node = node.value[step]
        elif isinstance(step, str) and isinstance(node, yaml.MappingNode):
            found = next((v for k, v in node.value if getattr(k, "value", None) == step), None)
            if found is None:
                break
            node = found
        else:
            break
    return node.start_mark.line + 1


def _fixed_resources(container: dict) -> str:
    resources = container.get("resources") or {}
    requests, limits = dict(resources.get("requests") or {}), dict(resources.get("limits") or {})
    for name in [n for n in {*requests, *limits} if str(n).startswith(GPU_PREFIX)]:
        wanted = limits.get(name, requests.get(name))
        limits[name] = _whole_devices(wanted)
        requests.pop(name, None)
    fixed = {"limits": limits}
    if requests:
        fixed["requests"] = requests
    return yaml.safe_dump({"resources": fixed}, sort_keys=False).rstrip()


def lint_document(document: dict, root: yaml.Node, source: str, nvidia_default: bool) -> list[LintFinding]:
    kind = document.get("kind")
    spec_path = POD_SPEC_PATHS.get(kind) if isinstance(kind, str) else None
    if spec_path is None:
        return []
    spec = lint_dra.value_at(document, spec_path)
    if not isinstance(spec, dict):
        return []
    name = (document.get("metadata") or {}).get("name", "?")
    findings = []
    by_container: dict[tuple[str, int], list[SpecError]] = {}
    for error in resource_errors(spec, ".".join(spec_path)):
        group, index = re.search(r"\.(initContainers|containers)\[(\d+)\]", error.field).groups()
        by_container.setdefault((group, int(index)), []).append(error)
    for (group, index), errors in by_container.items():  # one finding per container, as the API lists them
        line = _line_of(root, spec_path, errors[0].field)
        fix = ("GPUs are set in limits (requests default to them), as whole numbers:\n"
               f"{_fixed_resources(spec[group][index])}")
        findings.append(LintFinding(source, line, f'{kind} "{name}" is invalid: ' + ", ".join(map(str, errors)), fix))
    for group, index, resource in unknown_resources(spec):
        guess = difflib.get_close_matches(resource, ["nvidia.com/gpu", "nvidia.com/gpu.shared"], n=1, cutoff=0.6)
        line = _line_of(root, spec_path, f"{'.'.join(spec_path)}.{group}[{index}].resources")
        findings.append(LintFinding(
            source, line, f'{kind} "{name}" asks for {resource}, which no device plugin offers under that name: '
            "the API server accepts it and the pod stays Pending", f"ask for {guess[0] if guess else 'nvidia.com/gpu'}"
            + (" (or the name your plugin config renames it to)" if not guess else ""), "warning"))
    if not nvidia_default and gpu_containers(spec) and spec.get("runtimeClassName") != RUNTIME_CLASS:
        line = (_node_at(root, spec_path) or root).start_mark.line + 1
        have = spec.get("runtimeClassName")
        findings.append(LintFinding(
            source, line, f'{kind} "{name}" asks for GPUs but ' + (f"runs with runtimeClassName {have!r}" if have else
                                                                    "has no runtimeClassName") +
            ": nvidia is not the default runtime, so its containers get no GPU (CUDA_ERROR_NO_DEVICE)",
            f"add to the pod spec:\nruntimeClassName: {RUNTIME_CLASS}\n(or make nvidia the default runtime: "
            "nvidia_runtime_default = True, then lint with --nvidia-default)"))
    return findings


def parse_manifests(text: str, source: str) -> list[Manifest]:
    """Every object of one YAML/JSON stream (a List's items included) with its node; a parse error raises
    ValueError naming the file and line."""
    try:
        roots = list(yaml.compose_all(text))
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise ValueError(f"{where}: not valid YAML: {getattr(error, 'problem', error)}") from error
    manifests = []
    for document, root in zip(documents, roots, strict=True):
        if isinstance(document, dict) and document.get("kind") == "List":
            items = _node_at(root, ("items",))
            manifests += [Manifest(item, item_root, source) for item, item_root in
                          zip(document.get("items") or [], items.value if items else [], strict=False)
                          if isinstance(item, dict)]
        elif isinstance(document, dict):
            manifests.append(Manifest(document, root, source))
    return manifests


def lint_manifests(manifests: list[Manifest], nvidia_default: bool = False) -> list[LintFinding]:
    """Each workload's findings, then the DRA references across all of them (``gpunode.lint_dra``)."""
    findings = [f for m in manifests for f in lint_document(m.document, m.root, m.source, nvidia_default)]

    def report(manifest: Manifest, field: str, what: str, fix: str, level: str) -> None:
        findings.append(LintFinding(manifest.source, _line_of(manifest.root, (), field), what, fix, level))

    known = lint_dra.defined(manifests)
    for manifest in manifests:
        spec_path = POD_SPEC_PATHS.get(manifest.kind)
        if spec_path is not None:
            spec = lint_dra.value_at(manifest.document, spec_path)
            if isinstance(spec, dict):
                lint_dra.check_pod(manifest, spec, ".".join(spec_path), known, report)
        elif manifest.kind in lint_dra.CLAIM_KINDS:
            lint_dra.check_claim(manifest, known, report)
        elif manifest.kind == "DeviceClass":
            lint_dra.check_device_class(manifest, report)
    return findings


def lint_text(text: str, source: str, nvidia_default: bool = False) -> list[LintFinding]:
    """Findings for every workload document of one YAML/JSON stream; a parse error raises ValueError."""
    return lint_manifests(parse_manifests(text, source), nvidia_default)


def manifest_files(target: str) -> list[Path]:
    path = Path(target)
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
    if not path.exists():
        raise FileNotFoundError(f"{target}: no such file or directory")
    return [path]


def lint_targets(targets: list[str], nvidia_default: bool = False) -> tuple[list[LintFinding], list[str]]:
    """Findings of every file (the DRA references checked across all of them), and the files that could not be
    read or parsed (each named, the rest linted)."""
    manifests: list[Manifest] = []
    unreadable: list[str] = []
    for target in targets:
        if target == "-":
            sources = [("<stdin>", sys.stdin.read)]
        else:
            try:
                sources = [(str(path), path.read_text) for path in manifest_files(target)]
            except (OSError, ValueError) as error:
                unreadable.append(str(error))
                continue
        for source, read in sources:
            try:
                manifests += parse_manifests(read(), source)
            except (OSError, ValueError) as error:
                unreadable.append(str(error))
    return lint_manifests(manifests, nvidia_default), unreadable
