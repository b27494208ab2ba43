"""Node labels from a host's GPU facts: the short model label SREs select on, and GFD's names.

Compatible with NVIDIA's GPU Feature Discovery (``nvidia.com/gpu.product`` sanitised
as GFD does, ``gpu.memory`` in MiB, ``gpu.family`` from the compute capability,
``cuda.driver.*`` from the driver version), so workloads written for GFD labels
keep working. A host whose driver check fails gets no GPU labels at all.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from gpunode.gpu_generations import gpu_family
from gpunode.inventory_data import BY_NAME, read

GFD = "nvidia.com/"
PLUGIN_LABEL = "gpunode.io/device-plugin"  # "true": gpunode's device plugin serves this node (its DaemonSet selects it)
DRA_LABEL = "gpunode.io/dra-driver"  # "true": gpunode's DRA driver serves it instead (gpu_allocation = dra)
METHOD_LABELS = {"device-plugin": PLUGIN_LABEL, "dra": DRA_LABEL}  # gpu_allocation: the label that places it
# (pattern in the product name, short model) -- first match wins, longer names first
SHORT_MODELS = (
    ("GH200", "gh200"), ("GB200", "gb200"), ("B200", "b200"), ("B100", "b100"), ("H200", "h200"), ("H100", "h100"),
    ("H800", "h800"), ("A100", "a100"), ("A800", "a800"), ("A40", "a40"), ("A30", "a30"), ("A10G", "a10g"),
    ("A10", "a10"), ("L40S", "l40s"), ("L40", "l40"), ("L4", "l4"), ("V100", "v100"), ("T4", "t4"), ("P100", "p100"),
)


@dataclass(frozen=True)
class LabelSettings:
    """Inventory data for labels: ``label_model_key``, ``label_model_prefix``, and ``gpu_allocation`` (which of
    gpunode's DaemonSets the node's labels place there)."""

    model_key: str = BY_NAME["label_model_key"].default
    model_prefix: str = BY_NAME["label_model_prefix"].default
    allocation: str = BY_NAME["gpu_allocation"].default

    @classmethod
    def from_data(cls, data: dict) -> LabelSettings:
        return cls(read(data, "label_model_key"), read(data, "label_model_prefix"), read(data, "gpu_allocation"))


@dataclass
class NodeLabels:
    labels: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def sanitise_product(name: str) -> str:
    """GFD's product label value: spaces to '-', characters outside [A-Za-z0-9-_.] dropped."""
    return re.sub(r"[^A-Za-z0-9\-_.]", "", name.replace(" ", "-"))


def short_model(name: str) -> str | None:
    for marker, model in SHORT_MODELS:
        if re.search(rf"\b{marker}\b", name):
            return model
    return None


def family(compute_cap: str | None, name: str) -> str | None:
    """GFD's ``gpu.family`` value: the driver check's family, spelt as GFD spells Ada."""
    found = gpu_family(name, compute_cap)
    return "ada-lovelace" if found == "ada" else found


def gpu_labels(gpus: list[dict], settings: LabelSettings | None = None) -> NodeLabels:
    """The labels of a node with ``gpus`` (DriverState's parsed nvidia-smi rows); {} when there are none.

    Mixed models: the most common model labels the node (ties: the model of the lowest GPU index), with a warning.
    """
    settings = settings or LabelSettings()
    result = NodeLabels()
    if not gpus:
        return result
    counts = Counter(g["name"] for g in gpus)
    chosen_name = max(counts, key=lambda n: (counts[n], -min(g["index"] for g in gpus if g["name"] == n)))
    if len(counts) > 1:
        mix = ", ".join(f"{c}x {n}" for n, c in counts.items())
        result.warnings.append(f"GPUs of {len(counts)} models on one node ({mix}): labelled as {chosen_name} "
                               "(most GPUs, then lowest index)")
    chosen = [g for g in gpus if g["name"] == chosen_name]
    first = min(chosen, key=lambda g: g["index"])
    labels = result.labels
    model = short_model(chosen_name)
    if model:
        labels[settings.model_key] = f"{settings.model_prefix}{model}"
    labels[f"{GFD}gpu.present"] = "true"
    labels[f"{GFD}gpu.product"] = sanitise_product(chosen_name)
    labels[f"{GFD}gpu.count"] = str(len(chosen))
    if first.get("memory_mib"):
        labels[f"{GFD}gpu.memory"] = str(first["memory_mib"])
    arch = family(first.get("compute_cap"), chosen_name)
    if arch:
        labels[f"{GFD}gpu.family"] = arch
    if first.get("compute_cap"):
        major, minor = first["compute_cap"].split(".")
        labels[f"{GFD}gpu.compute.major"], labels[f"{GFD}gpu.compute.minor"] = major, minor
    parts = first["driver_version"].split(".")
    labels[f"{GFD}cuda.driver.major"] = parts[0]
    labels[f"{GFD}cuda.driver.minor"] = parts[1] if len(parts) > 1 else ""
    labels[f"{GFD}cuda.driver.rev"] = parts[2] if len(parts) > 2 else ""
    labels[f"{GFD}mig.capable"] = "true" if first.get("mig_mode") else "false"
    labels[METHOD_LABELS[settings.allocation]] = "true"
    return result


def driver_version_of(labels: dict[str, str]) -> str | None:
    """The driver version a node's ``cuda.driver.major|minor|rev`` labels say; None without them."""
    parts = [labels.get(f"{GFD}cuda.driver.{part}") for part in ("major", "minor", "rev")]
    return ".".join(p for p in parts if p) if parts[0] else None
