"""GPU profiles of simulated nodes: built-in ones, files, and fleet files.

A profile says what a node has: its container runtime, its GPUs (model from
:data:`gpunode_sim.spec.gpus.MODELS`, count, MIG), its driver (user-space and loaded
module versions), NVSwitches, and injected faults. A fleet file maps node names
to profiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from gpunode.errors import GpunodeError
from gpunode_sim.spec.gpus import FAULTS, MODELS

RUNTIMES = ("containerd", "docker")
# The Debian release a node's image is built from, by the name a profile gives it.
# "rpm-standin" is Debian 12's userspace with the real dnf and rpm and an os-release of the RHEL family (no RHEL
# userspace can be downloaded here): the toolkit goes through dnf on it, all else is Debian 12's.
OPERATING_SYSTEMS = {"debian12": "bookworm", "debian13": "trixie", "debian-unstable": "sid", "rpm-standin": "bookworm"}
DEFAULT_OS = "debian12"
PROFILE_KEYS = {"os", "runtime", "gpu", "driver", "nvswitch", "faults"}
GPU_KEYS = {"model", "count", "mig"}
DRIVER_KEYS = {"version", "module_version", "cuda_version", "kernel_module", "previous_version"}
NVSWITCH_KEYS = {"count", "fabricmanager_version"}
DEFAULT_FLEET = ("a100x4-containerd", "v100x2-docker", "cpu-only", "h100x8-nvswitch")


@dataclass(frozen=True)
class NodeSpec:
    """One node of a fleet: its name, its loopback address index and its profile."""

    name: str
    index: int
    profile_name: str
    profile: dict
    net_block: int = 10

    @property
    def runtime(self) -> str:
        return self.profile["runtime"]

    @property
    def os(self) -> str:
        return self.profile.get("os", DEFAULT_OS)

    @property
    def address(self) -> str:
        return f"127.0.{self.net_block}.{self.index}"

    @property
    def netns(self) -> str:
        return f"gpunode{self.net_block}-{self.name}"


def builtin_profiles() -> list[str]:
    folder = resources.files("gpunode_sim.spec") / "profile_files"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_profile(ref: str) -> dict:
    """A validated profile from a built-in name or a YAML/JSON file path."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        if not path.is_file():
            raise GpunodeError(f"profile file {ref} does not exist",
                               "give a built-in profile name or the path of a YAML profile")
        text = path.read_text()
    else:
        if ref not in builtin_profiles():
            raise GpunodeError(f"unknown profile {ref!r}",
                               f"use one of: {', '.join(builtin_profiles())}, or a YAML file path")
        text = (resources.files("gpunode_sim.spec") / "profile_files" / f"{ref}.yaml").read_text()
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise GpunodeError(f"profile {ref} is not valid YAML: {error}") from error
    return validate_profile(ref, data)


def _check_keys(ref: str, where: str, data: object, allowed: set[str]) -> dict:
    if not isinstance(data, dict):
        raise GpunodeError(f"profile {ref}: {where} must be a mapping, got {type(data).__name__}")
    unknown = set(data) - allowed
    if unknown:
        raise GpunodeError(f"profile {ref}: unknown key {where}{sorted(unknown)[0]!r}",
                           f"allowed keys there: {', '.join(sorted(allowed))}")
    return data


def validate_profile(ref: str, data: dict) -> dict:
    data = dict(_check_keys(ref, "", data, PROFILE_KEYS))
    os_name = data.setdefault("os", DEFAULT_OS)
    if os_name not in OPERATING_SYSTEMS:
        raise GpunodeError(f"profile {ref}: os {os_name!r} is not simulated",
                           f"use one of: {', '.join(OPERATING_SYSTEMS)}")
    runtime = data.setdefault("runtime", "containerd")
    if runtime not in RUNTIMES:
        raise GpunodeError(f"profile {ref}: runtime {runtime!r} is not simulated",
                           f"use one of: {', '.join(RUNTIMES)}")
    if os_name == "rpm-standin" and runtime != "containerd":
        raise GpunodeError(f"profile {ref}: os rpm-standin is simulated with containerd only, not {runtime}",
                           "use runtime: containerd")
    gpu = dict(_check_keys(ref, "gpu.", data.get("gpu") or {}, GPU_KEYS))
    count = gpu.setdefault("count", 0)
    if not isinstance(count, int) or count < 0 or count > 16:
        raise GpunodeError(f"profile {ref}: gpu.count must be an integer from 0 to 16, got {count!r}")
    if count and gpu.get("model") not in MODELS:
        raise GpunodeError(f"profile {ref}: unknown gpu.model {gpu.get('model')!r}",
                           f"use one of: {', '.join(MODELS)}")
    data["gpu"] = gpu
    data["driver"] = dict(_check_keys(ref, "driver.", data.get("driver") or {}, DRIVER_KEYS))
    data["nvswitch"] = dict(_check_keys(ref, "nvswitch.", data.get("nvswitch") or {}, NVSWITCH_KEYS))
    faults = data.get("faults") or []
    if not isinstance(faults, list) or any(f not in FAULTS for f in faults):
        raise GpunodeError(f"profile {ref}: unknown fault in {faults!r}",
                           f"known faults: {', '.join(FAULTS)}")
    data["faults"] = faults
    return data


def node_name(index: int) -> str:
    return f"node{index:02d}"


def plan_fleet(count: int | None, fleet_file: str | None, overrides: list[str],
               net_block: int = 10) -> list[NodeSpec]:
    """Node specs from a fleet file, or ``count`` nodes cycling the default profiles.

    ``overrides`` are ``NODE=PROFILE`` strings from the command line.
    """
    chosen: dict[str, str] = {}
    if fleet_file:
        path = Path(fleet_file)
        if not path.is_file():
            raise GpunodeError(f"fleet file {fleet_file} does not exist")
        try:
            fleet = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise GpunodeError(f"fleet file {fleet_file} is not valid YAML: {error}") from error
        nodes = fleet.get("nodes") if isinstance(fleet, dict) else None
        if not isinstance(nodes, dict) or not nodes:
            raise GpunodeError(f"fleet file {fleet_file} has no 'nodes' mapping",
                               "write it as:  nodes: {node01: a100x4-containerd, node02: cpu-only}")
        chosen = {str(name): str(profile) for name, profile in nodes.items()}
    else:
        total = 3 if count is None else count
        if total < 1 or total > 250:
            raise GpunodeError(f"cannot run {total} nodes", "choose from 1 to 250 nodes")
        chosen = {node_name(i + 1): DEFAULT_FLEET[i % len(DEFAULT_FLEET)] for i in range(total)}
    for override in overrides:
        name, sep, profile = override.partition("=")
        if not sep or not name or not profile:
            raise GpunodeError(f"--profile {override!r} is not NODE=PROFILE",
                               "for example: --profile node02=h100x8-nvswitch")
        if name not in chosen:
            raise GpunodeError(f"--profile names {name!r}, which is not in the fleet",
                               f"nodes: {', '.join(chosen)}")
        chosen[name] = profile
    specs = []
    for index, (name, profile) in enumerate(chosen.items(), start=1):
        if not name.replace("-", "").isalnum() or len(name) > 40:
            raise GpunodeError(f"node name {name!r} is not a valid host name",
                               "use letters, digits and '-' (at most 40)")
        specs.append(NodeSpec(name, index, profile, load_profile(profile), net_block))
    return specs
