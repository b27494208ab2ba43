"""Every provisioning step's facts from a host in one command: one round trip per host.

Each step keeps its own fact class (``facts/driver.py``, ``facts/runtime.py``,
...), which parses its own part; this fact only runs their commands together,
each behind a marker, and hands each part to its class. The deploy asks it once
per host (``gpunode.operations.step_fact``) and the verification reads it over
its own connection; a step run alone asks its own fact.
"""

from __future__ import annotations

from pyinfra.api import FactBase
from pyinfra.facts.server import Hostname

from gpunode import chain

# the facts in the order the steps use them; "hostname" names the Kubernetes node when k8s_node_name is unset
FACTS: dict[str, type[FactBase]] = {**{step.name: chain.load(step.fact) for step in chain.STEPS if step.fact},
                                    "hostname": Hostname}
FACT_MARK = "##gpunode-fact:"


# the steps after the driver check matter only where an NVIDIA driver left a trace; elsewhere (CPU nodes) the
# check skips them, so a host without one is not asked for them (their parts are absent, never read)
GPU_STEPS = tuple(step.name for step in chain.STEPS if step.needs_nvidia)
NVIDIA_TRACE = ("command -v nvidia-smi >/dev/null 2>&1 || [ -e /proc/driver/nvidia ] || [ -e /sys/module/nvidia ]"
                " || [ -e /dev/nvidiactl ]")


def facts_command(steps: tuple[str, ...] = tuple(FACTS)) -> str:
    """One shell command printing every step's fact output, each behind its own marker."""
    parts, gpu = [], []
    for step in steps:
        part = f"echo '{FACT_MARK}{step}'; ( {FACTS[step]().command()} ) 2>/dev/null"
        if step not in GPU_STEPS:
            parts.append(part)
            continue
        if not gpu:  # the GPU steps' parts go together, where the first of them stands
            parts.append("")
        gpu.append(part)
    return "; ".join(f"if {NVIDIA_TRACE}; then {'; '.join(gpu)}; fi" if not part else part for part in parts)


def split_facts(stdout: str | list[str]) -> dict[str, object]:
    """Each step's part of the output, parsed by that step's fact class; a step whose marker is missing is absent."""
    chunks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines() if isinstance(stdout, str) else stdout:
        if line.startswith(FACT_MARK):
            current = chunks.setdefault(line[len(FACT_MARK):], [])
        elif current is not None:
            current.append(line)
    return {step: FACTS[step]().process(lines) for step, lines in chunks.items() if step in FACTS}


class NodeFacts(FactBase):
    """``{"driver": DriverState's dict, "toolkit_repo": ..., "toolkit": ..., "runtime": ..., "hostname": "node01"}``.

    A host without any trace of an NVIDIA driver (no nvidia-smi, module, /proc entry or device node) answers only
    "driver" and "hostname": its driver check skips the GPU steps.

    Read with the steps' default arguments (the toolkit keyring and list paths of gpunode's settings).
    """

    def command(self) -> str:
        return facts_command()

    def process(self, output: list[str]) -> dict:
        return split_facts(output)
