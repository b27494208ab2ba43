"""Live faults: the GPU state a running driver changes, injected without a reboot; the others are refused live."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpunode_sim import fleet
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.spec.gpus import LIVE_FAULTS, LIVE_FIELDS, driver_state
from gpunode_sim.spec.profiles import load_profile

from gpunode.errors import GpunodeError


@pytest.mark.parametrize(("faults", "message"), [
    (["uvm-missing"], "fault 'uvm-missing' changes what the node's /dev or /proc hold: it needs a reboot"),
    (["ecc-uncorrectable", "mig-caps-missing"], "fault 'mig-caps-missing' changes what the node's /dev or /proc"),
    (["no-such-fault"], "unknown fault 'no-such-fault'"),
])
def test_a_fault_that_needs_a_reboot_is_refused_live(tmp_path: Path, faults: list[str], message: str) -> None:
    with pytest.raises(GpunodeError, match=message):
        fleet.set_live_faults(SimPaths(tmp_path, tmp_path), "node01", faults, print)


@pytest.mark.parametrize("fault", LIVE_FAULTS)
def test_each_live_fault_changes_only_the_live_fields(fault: str) -> None:
    """What a live injection copies into the running node's state is all its fault changes."""
    profile = load_profile("a100x4-containerd")
    clean, faulty = driver_state("node01", profile), driver_state("node01", dict(profile, faults=[fault]))
    changed = {key for old, new in zip(clean["gpus"], faulty["gpus"], strict=True)
               for key in old if old[key] != new[key]}
    assert changed and changed <= set(LIVE_FIELDS), changed
    assert {k for k in clean if k not in ("gpus", "faults") and clean[k] != faulty[k]} == set()
