"""Profiles and fleet plans: defaults, overrides and every kind of bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpunode_sim.spec.gpus import driver_state, gpu_uuid
from gpunode_sim.spec.profiles import builtin_profiles, load_profile, plan_fleet

from gpunode.errors import GpunodeError


def test_builtin_profiles_cover_the_required_fleet() -> None:
    assert {"a100x4-containerd", "v100x2-docker", "h100x8-nvswitch", "cpu-only"} <= set(builtin_profiles())


def test_default_fleet_of_three() -> None:
    specs = plan_fleet(None, None, [])
    assert [(s.name, s.address, s.profile_name, s.runtime) for s in specs] == [
        ("node01", "127.0.10.1", "a100x4-containerd", "containerd"),
        ("node02", "127.0.10.2", "v100x2-docker", "docker"),
        ("node03", "127.0.10.3", "cpu-only", "containerd"),
    ]


def test_twenty_nodes_cycle_profiles_and_addresses() -> None:
    specs = plan_fleet(20, None, ["node20=a100x4-containerd"], net_block=30)
    assert len(specs) == 20 and specs[-1].address == "127.0.30.20"
    assert specs[3].profile_name == "h100x8-nvswitch" and specs[-1].profile_name == "a100x4-containerd"
    assert len({s.netns for s in specs}) == 20


def test_fleet_file(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n  gpu-a: h100x8-nvswitch\n  cpu-a: cpu-only\n")
    specs = plan_fleet(None, str(fleet), [])
    assert [(s.name, s.index, s.profile["gpu"]["count"]) for s in specs] == [("gpu-a", 1, 8), ("cpu-a", 2, 0)]


@pytest.mark.parametrize(
    ("count", "fleet_text", "overrides", "message"),
    [
        (0, None, [], "cannot run 0 nodes"),
        (3, None, ["node02"], "is not NODE=PROFILE"),
        (3, None, ["node09=cpu-only"], "not in the fleet"),
        (3, None, ["node02=nope"], "unknown profile 'nope'"),
        (None, "nodes: []\n", [], "has no 'nodes' mapping"),
        (None, "nodes: {'bad name!': cpu-only}\n", [], "is not a valid host name"),
        (None, "nodes: [unclosed\n", [], "is not valid YAML"),
    ],
)
def test_bad_fleet_input_names_the_problem(tmp_path: Path, count: int | None, fleet_text: str | None,
                                           overrides: list[str], message: str) -> None:
    fleet_file = None
    if fleet_text is not None:
        fleet_file = tmp_path / "fleet.yaml"
        fleet_file.write_text(fleet_text)
    with pytest.raises(GpunodeError, match=message):
        plan_fleet(count, str(fleet_file) if fleet_file else None, overrides)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("runtime: crio\n", "runtime 'crio' is not simulated"),
        ("gpu: {model: a100-sxm4-40gb, count: 99}\n", "gpu.count must be an integer from 0 to 16"),
        ("gpu: {model: b200, count: 8}\n", "unknown gpu.model 'b200'"),
        ("gpu: {count: 1, modle: t4}\n", "unknown key gpu.'modle'"),
        ("gpus: 4\n", "unknown key 'gpus'"),
        ("faults: [melted]\n", "unknown fault"),
        ("os: ubuntu24.04\n", "os 'ubuntu24.04' is not simulated"),
    ],
)
def test_bad_profile_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(GpunodeError, match=message):
        load_profile(str(path))


def test_missing_profile_file() -> None:
    with pytest.raises(GpunodeError, match="profile file /nonexistent.yaml does not exist"):
        load_profile("/nonexistent.yaml")


def test_driver_state_is_stable_and_follows_the_profile() -> None:
    profile = load_profile("h100x8-nvswitch")
    first, second = driver_state("node04", profile), driver_state("node04", profile)
    assert first == second
    assert [g["uuid"] for g in first["gpus"]] == [gpu_uuid("node04", i) for i in range(8)]
    assert len({g["pci_bus_id"] for g in first["gpus"]}) == 8
    assert first["fabric"] == {"state": "Completed", "status": "Success"}
    assert first["fabricmanager"]["version"] == first["driver_version"]
    assert driver_state("node05", profile)["gpus"][0]["uuid"] != first["gpus"][0]["uuid"]


@pytest.mark.parametrize(
    ("faults", "expect"),
    [
        (["driver-not-loaded"], {"loaded": False, "installed": True}),
        (["nouveau"], {"loaded": False, "nouveau": True}),
        (["library-mismatch"], {"loaded": True, "module_version": "535.183.01", "driver_version": "550.54.15"}),
        (["no-gpu"], {"loaded": True, "no_devices": True}),
    ],
)
def test_faults_change_the_driver_state(faults: list[str], expect: dict) -> None:
    profile = dict(load_profile("a100x4-containerd"), faults=faults)
    state = driver_state("node01", profile)
    assert {key: state[key] for key in expect} == expect


def test_fabricmanager_down_fault() -> None:
    profile = dict(load_profile("h100x8-nvswitch"), faults=["fabricmanager-down"])
    state = driver_state("node01", profile)
    assert state["fabric"]["state"] == "In Progress" and not state["fabricmanager"]["running"]


def test_a_profile_names_its_node_os_and_debian_12_is_the_default(tmp_path: Path) -> None:
    specs = plan_fleet(None, None, ["node01=h100x8-containerd2", "node02=a100x4-containerd17"])
    assert [(s.name, s.os, s.runtime) for s in specs] == [
        ("node01", "debian-unstable", "containerd"), ("node02", "debian13", "containerd"),
        ("node03", "debian12", "containerd")]
    assert load_profile("a40x2-docker28")["os"] == "debian-unstable"
