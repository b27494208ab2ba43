"""GPU generations: the architecture family of a GPU (as GPU Feature Discovery names it) and the oldest driver
each family needs. Read by the driver's diagnosis (too old for this GPU?) and by the node labels
(nvidia.com/gpu.family), so it sits below both."""

from __future__ import annotations

import re

# Minimum drivers per GPU generation (NVIDIA's support matrix; see the shared node facts).
GENERATION_MINIMUM = {"ampere": "450.51.05", "ada": "520.61.05", "hopper": "520.61.05", "blackwell": "570.26"}
FAMILY_BY_NAME = (("H100", "hopper"), ("H200", "hopper"), ("H800", "hopper"), ("GH200", "hopper"),
                  ("B200", "blackwell"), ("B100", "blackwell"), ("A100", "ampere"), ("A800", "ampere"),
                  ("A40", "ampere"), ("A30", "ampere"), ("A10", "ampere"), ("L40", "ada"), ("L4", "ada"),
                  ("V100", "volta"), ("T4", "turing"))


def family_from_compute_cap(compute_cap: str | None) -> str | None:
    """The family GFD derives from a compute capability (its getArchFamily ranges), None if unknown."""
    if not compute_cap or not re.fullmatch(r"\d+\.\d+", compute_cap):
        return None
    major, minor = (int(x) for x in compute_cap.split("."))
    if major == 6:
        return "pascal"
    if major == 7:
        return "turing" if minor >= 5 else "volta"
    if major == 8:
        return "ada" if minor >= 9 else "ampere"
    return {9: "hopper", 10: "blackwell", 12: "blackwell"}.get(major)


def gpu_family(name: str, compute_cap: str | None) -> str | None:
    """The architecture family of a GPU, from its compute capability or else its product name."""
    found = family_from_compute_cap(compute_cap)
    if found:
        return found
    for marker, family in FAMILY_BY_NAME:
        if re.search(rf"\b{marker}\b", name):
            return family
    return None
