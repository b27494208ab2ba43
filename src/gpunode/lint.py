"""GPU resource specs in workload manifests, checked before the API server or the scheduler sees them.

Class 5 of the runbook (wrong resource spec) in the API server's own words: a
GPU request without a limit (``Limit must be set for non overcommitable
resources``), a request unequal to its limit (``must be equal to nvidia.com/gpu
limit``), a fractional count (``must be an integer``); and class 1's missing
``runtimeClassName: nvidia`` when nvidia is not the cluster's default runtime.
Each finding carries the file, the line and the corrected snippet.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from pathlib import Path

import yaml

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


SUFFIX_EXPONENTS = {"": 0, "m": 3, "u": 6, "n": 9}  # the decimal suffixes a device count can carry


def _decimal(value: object) -> Decimal | None:
    """A quantity as a number of devices (``500m`` is 0.5), None when it is not one."""
    match = re.fullmatch(r"([0-9.]+)([mun]?)", str(value).strip())
    try:
        return Decimal(match.group(1)).scaleb(-SUFFIX_EXPONENTS[match.group(2)]) if match else None
    except InvalidOperation:
        return None


def _quantity(value: object) -> tuple[str, bool]:
    """(the value as the API server prints it, whether it is a whole number of devices).

    A plain decimal is shown in the quantity's canonical form, as the API server
    does once it has parsed it: ``0.5`` is ``500m``, ``0.0005`` is ``500u``.
    """
    text = str(value).strip()
    if re.fullmatch(r"[0-9]+", text):
        return text, True
    number = _decimal(text) if re.fullmatch(r"[0-9.]+", text) else None
    if number is not None and number > 0:
        for suffix, exponent in list(SUFFIX_EXPONENTS.items())[1:]:
            scaled = number.scaleb(exponent)
            if scaled == scaled.to_integral_value():
                return f"{int(scaled)}{suffix}", False
    return text, False


def _whole_devices(value: object) -> int:
    """The count a fractional GPU quantity rounds up to (at least 1): ``0.5`` and ``500m`` are 1."""
    number = _decimal(value)
    return max(1, int(number.to_integral_value(rounding=ROUND_CEILING))) if number is not None else 1


def resource_errors(pod_spec: dict, field_prefix: str = "spec") -> list[SpecError]:
    """The API server's validation of extended (GPU) resources in a pod spec."""
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
                for where, values in (("limits", limits), ("requests", {**limits, **requests})):
                    if name in values:
                        text, whole = _quantity(values[name])
                        if not whole:
                            errors.append(SpecError(f"{base}.{where}[{name}]", "Invalid value", text,
                                                    "must be an integer"))
                if name in requests and name not in limits:
                    errors.append(SpecError(f"{base}.limits", "Required value", "",
                                            "Limit must be set for non overcommitable resources"))
                elif name in requests and str(requests[name]).strip() != str(limits[name]).strip():
                    errors.append(SpecError(f"{base}.requests[{name}]", "Invalid value",
                                            str(requests[name]).strip(), f"must be equal to {name} limit"))
    return errors


def gpu_containers(pod_spec: dict) -> list[int]:
    return [i for i, c in enumerate(pod_spec.get("containers") or []) if isinstance(c, dict) and any(
        str(k).startswith(GPU_PREFIX) for part in ("requests", "limits")
        for k in ((c.get("resources") or {}).get(part) or {}))]


@dataclass(frozen=True)
class LintFinding:
    source: str
    line: int
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.what}\n  fix:\n" + "\n".join(f"    {line}" for line in
                                                                            self.fix.splitlines())


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
    spec: object = document
    for key in spec_path:
        spec = spec.get(key) if isinstance(spec, dict) else None
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


def lint_text(text: str, source: str, nvidia_default: bool = False) -> list[LintFinding]:
    """Findings for every workload document of one YAML/JSON stream; a parse error raises ValueError."""
    try:
        roots = list(yaml.compose_all(text))
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise ValueError(f"{where}: not valid YAML: {getattr(error, 'problem', error)}") from error
    findings = []
    for document, root in zip(documents, roots, strict=True):
        if isinstance(document, dict) and document.get("kind") == "List":
            items = _node_at(root, ("items",))
            for item, item_root in zip(document.get("items") or [], items.value if items else [], strict=False):
                if isinstance(item, dict):
                    findings += lint_document(item, item_root, source, nvidia_default)
        elif isinstance(document, dict):
            findings += lint_document(document, root, source, nvidia_default)
    return findings


def manifest_files(target: str) -> list[Path]:
    path = Path(target)
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in MANIFEST_SUFFIXES)
    if not path.exists():
        raise FileNotFoundError(f"{target}: no such file or directory")
    return [path]


def lint_targets(targets: list[str], nvidia_default: bool = False) -> list[LintFinding]:
    findings = []
    for target in targets:
        if target == "-":
            findings += lint_text(sys.stdin.read(), "<stdin>", nvidia_default)
            continue
        for path in manifest_files(target):
            findings += lint_text(path.read_text(), str(path), nvidia_default)
    return findings
