"""What one deploy run read and decided, kept on pyinfra's own objects: per host on the Host, per run on the State.

An operation records here what a later operation acts on (the driver check's verdict and the reboot it asked
for, labels changed, the plugin pod restarted, the DaemonSet applied), and reads here what an earlier one
recorded, so no operation imports another to read its flags and no module keeps run state of its own. A new run
(a new State with new Hosts: the CLI, a test, a bench) starts empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyinfra.api import Host, State

ATTRIBUTE = "gpunode_run"  # the attribute of pyinfra's Host and State objects that holds the record


@dataclass
class HostRun:
    """One host in one run."""

    node_facts: dict | None = None  # every step's facts from the run's one read (None: no step asked for it)
    driver_facts: dict | None = None  # the driver's facts as the check read them (shared by later steps)
    gpu: bool = True  # False where the driver check found no working driver: GPU steps skip themselves
    reboot: str | None = None  # why this run reboots the host (the driver check's finding), or None
    fresh_driver: dict | None = None  # the driver's facts read again after this run rebooted the host
    relabelled: bool = False  # this run changed the node's labels
    labelled_driver: str | None = None  # the driver version the node's labels carried when read
    replugged: bool = False  # this run restarted the node's plugin pod
    replaced: str | None = None  # the plugin pod this run deleted (its numbers must not count)
    hostname: str | None = None  # the Kubernetes node name read from the host
    switching: str | None = None  # why this run moves the node to another allocation method (gpu_allocation)


@dataclass
class Run:
    """The whole run: what is shared by its hosts."""

    rolling: bool = False  # this run applied the device plugin's objects: wait for the rollout
    foreign: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # NVIDIA's DaemonSets, per cluster
    nodes: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # the Nodes, per cluster
    pinned: dict[str, tuple[str, str]] = field(default_factory=dict)  # plugin_image -> (pinned, what was done)


def _record(holder: object, kind: type) -> Any:
    """The record of ``kind`` kept on ``holder`` (a pyinfra Host or State), made on first use."""
    record = getattr(holder, ATTRIBUTE, None)
    if record is None:
        record = kind()
        setattr(holder, ATTRIBUTE, record)
    return record


def host_run(target: Host) -> HostRun:
    return _record(target, HostRun)


def run_of(current: State) -> Run:
    return _record(current, Run)
