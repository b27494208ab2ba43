"""End to end on the nodes users run: containerd 1.6, 1.7 and 2.x, docker 28, Debian 12, 13 and unstable.

One fleet mixes every generation: each containerd release gets the toolkit's in-place layout (1.17.8)
on one node and its drop-in layout (1.20.0) on another, where both are simulated. Bootstrap, a
no-op re-run, verify, a GPU pod on every node and doctor's healthy verdict, per pin.
"""

from __future__ import annotations

import json
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import fleet_ssh
from .conftest import block, gpunode
from .fleet_ssh import ssh_ok
from .test_provisioning import INVENTORY, failing
from .test_upgrades import NEW_DRIVER

pytestmark = pytest.mark.fleet

# node -> (profile, toolkit pin, what runs there); the README's distribution table is these rows
NODES = {
    "node01": ("a100x4-containerd17", "1.17.8-1", "Debian 13, containerd 1.7.24"),
    "node02": ("h100x8-containerd2", "1.17.8-1", "Debian unstable, containerd 2.1.9"),
    "node03": ("a40x2-docker28", "1.17.8-1", "Debian unstable, docker 28.5.2"),
    "node04": ("a100x4-containerd", "1.20.0-1", "Debian 12, containerd 1.6.20"),
    "node05": ("a100x4-containerd17", "1.20.0-1", "Debian 13, containerd 1.7.24"),
    "node06": ("h100x8-containerd2", "1.20.0-1", "Debian unstable, containerd 2.1.9"),
    "node07": ("a40x2-docker28", "1.20.0-1", "Debian unstable, docker 28.5.2"),
    "node08": ("v100x2-docker", "1.20.0-1", "Debian 12, docker 20.10.24"),
    "node09": ("a100x4-rpm", "1.17.8-1", "rpm stand-in, containerd 1.6.20"),
}
RPM_NODE = "node09"
TOOLKIT = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
           "libnvidia-container1")
PINS = sorted({pin for _, pin, _ in NODES.values()})


# what gpunode may change on a node, as bytes: its config files, the toolkit's repository files, the packages
# and their holds (``gpunode undo --packages`` must leave every one as it was before the first deploy)
SNAPSHOT = "; ".join([
    "for f in /etc/containerd/config.toml /etc/docker/daemon.json /etc/nvidia-container-runtime/config.toml"
    " /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg /etc/apt/sources.list.d/nvidia-container-toolkit.list"
    " /etc/yum.repos.d/nvidia-container-toolkit.repo /etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-container-toolkit"
    " /etc/dnf/plugins/versionlock.list; do if [ -e $f ]; then sha256sum $f; else echo absent $f; fi; done",
    "find /etc/containerd /etc/docker /etc/apt/sources.list.d /etc/yum.repos.d /etc/nvidia-container-runtime"
    " /etc/cdi /var/run/cdi -type f 2>/dev/null | LC_ALL=C sort | xargs -r sha256sum",
    "(dpkg-query -W -f='${Status} ${Package}\\n' 2>/dev/null | grep '^install ok installed' | grep -i nvidia) || true",
    "(rpm -qa 2>/dev/null | grep -i nvidia | sort) || true",
    "(apt-mark showhold 2>/dev/null) || true",
])


def pinned(pin: str) -> list[str]:
    """The command-line arguments that address the nodes at ``pin`` with that pin."""
    limits = [arg for node, (_, at, _) in NODES.items() if at == pin for arg in ("--limit", node)]
    return [*limits, "--data", f"toolkit_version={pin}"]


@pytest.fixture(scope="module")
def mixed(sim_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    folder = tmp_path_factory.mktemp("kinds")
    fleet_file = folder / "fleet.yaml"
    fleet_file.write_text(json.dumps({"nodes": {name: profile for name, (profile, _, _) in NODES.items()}}))
    env = {**sim_env, "GPUNODE_SIM_DIR": str(folder / "sim"), "GPUNODE_SIM_NET": block(sim_env, 3)}
    try:  # a fleet that came up only in part is torn down too
        info = json.loads(gpunode("sim", "up", "--fleet", str(fleet_file), "--json", env=env, timeout=1800).stdout)
        info["env"] = env
        info["before_deploy"] = {node: ssh_ok(info, node, SNAPSHOT) for node in NODES}  # for gpunode undo's test
        yield info
    finally:
        gpunode("sim", "down", env=env, check=False)


def ssh(fleet: dict, node: str, command: str) -> str:
    return ssh_ok(fleet, node, command)


def deploy(fleet: dict, tmp_path: Path, pin: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = tmp_path / f"deploy-{pin}.json"
    report.unlink(missing_ok=True)
    result = gpunode("deploy", INVENTORY, *pinned(pin), "--report", str(report), env=fleet["env"], check=False)
    return result, (json.loads(report.read_text())["hosts"] if report.exists() else {})


def test_every_node_kind_comes_up_with_its_release(mixed: dict) -> None:
    runtimes = {node["name"]: node for node in mixed["nodes"]}
    assert all(node["error"] is None for node in runtimes.values()), runtimes
    kubectl = gpunode("sim", "kubectl", "get", "nodes", "-o", "json", env=mixed["env"]).stdout
    seen = {item["metadata"]["name"]: item["status"]["nodeInfo"] for item in json.loads(kubectl)["items"]}
    for name, (_, _, what) in NODES.items():
        release, runtime = what.split(", ")
        expected = {"Debian 12": "Debian GNU/Linux 12 (bookworm)", "Debian 13": "Debian GNU/Linux 13 (trixie)",
                    "Debian unstable": "Debian GNU/Linux forky/sid", "rpm stand-in": "gpunode rpm stand-in"}[release]
        assert expected in seen[name]["osImage"], (name, seen[name]["osImage"])
        kind, version = runtime.split(" ")
        assert seen[name]["containerRuntimeVersion"].startswith(f"{kind}://{version}"), (name, seen[name])


@pytest.mark.parametrize("pin", PINS)
def test_bootstrap_then_no_op_on_every_generation(mixed: dict, tmp_path: Path, pin: str) -> None:
    result, report = deploy(mixed, tmp_path, pin)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    nodes = [n for n, (_, p, _) in NODES.items() if p == pin]
    for node in nodes:
        changed = " | ".join(report[node]["changed"])
        assert "pinned version" in changed and "Restart the container runtime" in changed, (node, changed)
    again, report = deploy(mixed, tmp_path, pin)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {node: report[node]["changed"] for node in nodes} == {node: [] for node in nodes}


def test_the_nvidia_runtime_sits_under_each_generations_cri_plugin(mixed: dict) -> None:
    """NVIDIA's own runtime (built from NVIDIA's module at the node's pin) under each runtime's nvidia handler."""
    for node, (profile, pin, what) in NODES.items():
        version = ssh(mixed, node, "nvidia-container-runtime --version 2>/dev/null | head -1").strip()
        assert version == f"NVIDIA Container Runtime version {pin.split('-')[0]}", (node, version)
        if "docker" in profile:
            daemon = json.loads(ssh(mixed, node, "cat /etc/docker/daemon.json"))
            assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime", (node, daemon)
            continue
        effective = tomllib.loads(ssh(mixed, node, "containerd config dump"))
        plugin = "io.containerd.cri.v1.runtime" if "containerd 2." in what else "io.containerd.grpc.v1.cri"
        runtimes = effective["plugins"][plugin]["containerd"]["runtimes"]
        assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime", (node, runtimes)
        dropin = ssh(mixed, node, "ls /etc/containerd/conf.d/ 2>/dev/null || true").split()
        assert ("99-nvidia.toml" in dropin) == (pin == "1.20.0-1"), (node, pin, dropin)


def test_on_containerd_2_the_admins_schema_2_settings_survive_the_base_config(mixed: dict) -> None:
    """Debian unstable packages a schema-2 config; the base config is containerd's own migration of it."""
    for node in ("node02", "node06"):
        written = tomllib.loads(ssh(mixed, node, "cat /etc/containerd/config.toml"))
        assert written["version"] == 3
        images = written["plugins"]["io.containerd.cri.v1.images"]
        assert images["pinned_images"]["sandbox"] == "registry.k8s.io/pause:3.10.1", (node, images)
        runtime = written["plugins"]["io.containerd.cri.v1.runtime"]
        assert runtime["restrict_oom_score_adj"] is True and runtime["cni"]["bin_dirs"] == ["/usr/lib/cni"]
        kept = ssh(mixed, node, "ls /var/backups/gpunode/*/etc/containerd/config.toml | head -1").strip()
        assert tomllib.loads(ssh(mixed, node, f"cat {kept}"))["version"] == 2  # the packaged file, backed up


@pytest.mark.parametrize("pin", PINS)
def test_verify_and_doctor_pass_on_every_generation(mixed: dict, tmp_path: Path, pin: str) -> None:
    out = tmp_path / "verify.json"
    result = gpunode("verify", INVENTORY, "--json", str(out), *pinned(pin), env=mixed["env"], check=False)
    assert out.exists(), (f"gpunode verify wrote no JSON (exit {result.returncode}):\n"
                          f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    results = json.loads(out.read_text())
    assert result.returncode == 0 and failing(results) == {}, failing(results)
    nodes = [n for n, (_, p, _) in NODES.items() if p == pin]
    assert sorted(results["hosts"]) == sorted(nodes)
    doctor = gpunode("doctor", INVENTORY, "--json", *pinned(pin), env=mixed["env"], check=False)
    report = json.loads(doctor.stdout)
    assert doctor.returncode == 0 and report["problems"] == [], report["problems"]
    assert {node: report["nodes"][node] for node in nodes} == dict.fromkeys(
        nodes, "ok: every link from the driver to allocatable GPUs holds"), report["nodes"]


def test_a_gpu_pod_runs_on_every_node(mixed: dict) -> None:
    models = {"a100x4": "NVIDIA A100-SXM4-40GB", "h100x8": "NVIDIA H100 80GB HBM3", "a40x2": "NVIDIA A40",
              "v100x2": "Tesla V100-SXM2-32GB"}
    for node, (profile, _, _) in NODES.items():
        result = gpunode("sim", "run", f"gpu-{node}", "--node-selector", f"kubernetes.io/hostname={node}", "--",
                         "nvidia-smi", "-L", env=mixed["env"], check=False, timeout=180)
        output = result.stdout + result.stderr
        assert result.returncode == 0 and f"on {node}: Succeeded" in output, (node, output)
        assert f"GPU 0: {models[profile.split('-')[0]]} (UUID: GPU-" in output, (node, output)


def allocatable_gpus(fleet: dict, node: str) -> str:
    item = json.loads(gpunode("sim", "kubectl", "get", "node", node, "-o", "json", env=fleet["env"]).stdout)
    return item["status"]["allocatable"].get("nvidia.com/gpu", "0")


def wait_allocatable(fleet: dict, node: str, count: int, timeout: float) -> float:
    """Seconds until ``node`` offers ``count`` GPUs; the test fails with what it offers after ``timeout``."""
    started = time.monotonic()
    while (found := allocatable_gpus(fleet, node)) != str(count):
        assert time.monotonic() - started < timeout, f"{node} offers {found} GPUs, not {count}, after {timeout} s"
        time.sleep(0.5)
    return time.monotonic() - started


def test_an_xid_reaches_the_plugin_where_the_runtime_gives_it_the_driver_by_jit_cdi(mixed: dict) -> None:
    """On the 1.20 containerd nodes NVIDIA's runtime gives the plugin's container the driver's files by its
    just-in-time CDI spec (no cli): the simulated driver's health events reach the plugin's NVML event set through
    the link in the driver's firmware folder that the spec mounts. An Xid 79 takes the GPU out of the node's
    allocatable; a new plugin pod (a fresh view of the GPUs) offers it again."""
    for node in ("node05", "node06"):
        gpus = json.loads(ssh(mixed, node, "cat /etc/gpunode-sim/gpu.json"))["gpus"]
        wait_allocatable(mixed, node, len(gpus), 60)
        ssh(mixed, node, f"echo '{gpus[1]['uuid']} 79' >> /run/gpunode-sim/events/health-events")
        took = wait_allocatable(mixed, node, len(gpus) - 1, 30)
        print(f"{node}: Xid 79 to allocatable {len(gpus) - 1} in {took:.2f} s")
        pods = json.loads(gpunode("sim", "kubectl", "get", "pods", "-n", "gpunode-system", "-o", "json",
                                  "--field-selector", f"spec.nodeName={node}", env=mixed["env"]).stdout)["items"]
        plugin = [p["metadata"]["name"] for p in pods if p["metadata"]["name"].startswith("gpunode-device-plugin-")]
        assert len(plugin) == 1, [p["metadata"]["name"] for p in pods]
        gpunode("sim", "kubectl", "delete", "pod", "-n", "gpunode-system", plugin[0], env=mixed["env"])
        wait_allocatable(mixed, node, len(gpus), 90)


def rpm_state(fleet: dict) -> tuple[list[str], dict[str, str]]:
    """What rpm has installed of the toolkit, and the versions dnf's versionlock list holds them at."""
    installed = ssh(fleet, RPM_NODE, f"rpm -q --qf '%{{NAME}}-%{{VERSION}}-%{{RELEASE}}\\n' {' '.join(TOOLKIT)}")
    locks = {}
    for line in ssh(fleet, RPM_NODE, "cat /etc/dnf/plugins/versionlock.list").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().removesuffix(".*").rpartition("-0:")
            locks[name] = version
    return installed.split(), locks


def test_the_rpm_node_takes_the_toolkit_from_dnf_with_signatures_checked_and_locks_it(mixed: dict) -> None:
    installed, locks = rpm_state(mixed)
    assert installed == [f"{name}-1.17.8-1" for name in TOOLKIT]
    assert locks == dict.fromkeys(TOOLKIT, "1.17.8-1")
    repo = ssh(mixed, RPM_NODE, "cat /etc/yum.repos.d/nvidia-container-toolkit.repo").splitlines()
    assert "gpgcheck=1" in repo and "repo_gpgcheck=1" in repo
    assert "gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-container-toolkit" in repo
    fingerprint = json.loads(Path(mixed["inventory"]).read_text())["toolkit_repo"]["key_fingerprint"]
    assert fingerprint[-8:].lower() in ssh(mixed, RPM_NODE, "rpm -q gpg-pubkey --qf '%{VERSION}\\n'").split()
    signature = ssh(mixed, RPM_NODE, "rpm -qi nvidia-container-toolkit | grep '^Signature'")
    assert fingerprint[-16:].lower() in signature.lower(), signature  # installed as signed by the repository's key
    # apt is not how this node installs packages: the toolkit never went through dpkg
    refused = fleet_ssh.ssh(mixed, RPM_NODE, "apt-get update", timeout=60)
    assert refused.returncode == 100 and "installs packages with dnf" in refused.stderr
    assert "no packages found" in fleet_ssh.ssh(mixed, RPM_NODE, "dpkg-query -W nvidia-container-toolkit",
                                                timeout=60).stderr


def test_the_rpm_pin_moves_up_and_down_with_its_locks(mixed: dict, tmp_path: Path) -> None:
    for pin in ("1.20.0-1", "1.17.8-1"):
        args = ["--limit", RPM_NODE, "--data", f"toolkit_version={pin}"]
        result = gpunode("deploy", INVENTORY, *args, env=mixed["env"], check=False)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        installed, locks = rpm_state(mixed)
        assert installed == [f"{name}-{pin}" for name in TOOLKIT] and locks == dict.fromkeys(TOOLKIT, pin)
        out = tmp_path / f"verify-{pin}.json"
        verified = gpunode("verify", INVENTORY, "--json", str(out), *args, env=mixed["env"], check=False)
        assert verified.returncode == 0, failing(json.loads(out.read_text()))
        report = tmp_path / f"again-{pin}.json"
        again = gpunode("deploy", INVENTORY, *args, "--report", str(report), env=mixed["env"], check=False)
        assert again.returncode == 0 and json.loads(report.read_text())["hosts"][RPM_NODE]["changed"] == []


def test_a_wrong_key_fingerprint_is_refused_before_rpm_trusts_the_key(mixed: dict) -> None:
    fingerprint = json.loads(Path(mixed["inventory"]).read_text())["toolkit_repo"]["key_fingerprint"]
    key_id = fingerprint[-8:].lower()
    ssh(mixed, RPM_NODE, f"rm /etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-container-toolkit && rpm -e gpg-pubkey-{key_id}")
    wrong = "DEADBEEF" * 5
    result = gpunode("deploy", INVENTORY, "--limit", RPM_NODE, "--data", f"toolkit_key_fingerprint={wrong}",
                     env=mixed["env"], check=False)
    assert result.returncode == 1 and "refusing to trust it" in result.stderr and wrong in result.stderr
    assert ssh(mixed, RPM_NODE, "ls /etc/pki/rpm-gpg/").split() == []
    assert key_id not in ssh(mixed, RPM_NODE, "rpm -q gpg-pubkey --qf '%{VERSION}\\n' || true").split()
    doctor = json.loads(gpunode("doctor", INVENTORY, "--json", "--limit", RPM_NODE, env=mixed["env"],
                                check=False).stdout)
    assert [(p["link"], p["what"]) for p in doctor["problems"]][:1] == [
        ("toolkit_repo", "the toolkit key file /etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-container-toolkit is missing")]
    assert gpunode("deploy", INVENTORY, "--limit", RPM_NODE, env=mixed["env"], check=False).returncode == 0
    assert key_id in ssh(mixed, RPM_NODE, "rpm -q gpg-pubkey --qf '%{VERSION}\\n'").split()


def test_a_driver_upgrade_reboots_and_rejoins_every_generation(mixed: dict) -> None:
    """reboot_on_mismatch on containerd 1.7 and 2.1, docker 28 and the rpm node: cordon, reboot, check, uncordon."""
    upgraded = {"node05": 4, "node06": 8, "node07": 2, "node09": 4}  # node -> its GPUs
    for node in upgraded:
        gpunode("sim", "driver", node, "--version", NEW_DRIVER, "--no-reboot", env=mixed["env"])
    for pin in PINS:
        result = gpunode("deploy", INVENTORY, *pinned(pin), "--data", "reboot_on_mismatch=true", "--report",
                         str(Path(mixed["inventory"]).with_name(f"upgrade-{pin}.json")), env=mixed["env"],
                         check=False, timeout=1200)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        report = json.loads(Path(mixed["inventory"]).with_name(f"upgrade-{pin}.json").read_text())["hosts"]
        for node in upgraded:
            if NODES[node][1] != pin:
                continue
            changed = " | ".join(report[node]["changed"])
            assert "Reboot the node" in changed and "Uncordon the node" in changed, (node, changed)
    seen = {item["metadata"]["name"]: item for item in json.loads(gpunode(
        "sim", "kubectl", "get", "nodes", "-o", "json", env=mixed["env"]).stdout)["items"]}
    for node, gpus in upgraded.items():
        assert seen[node]["metadata"]["labels"]["nvidia.com/cuda.driver.major"] == NEW_DRIVER.split(".")[0], node
        assert not seen[node]["spec"].get("unschedulable"), node
        assert seen[node]["status"]["allocatable"]["nvidia.com/gpu"] == str(gpus), (node, seen[node]["status"])
    for node in upgraded:
        result = gpunode("sim", "run", f"after-upgrade-{node}", "--node-selector", f"kubernetes.io/hostname={node}",
                         "--", "nvidia-smi", "-L", env=mixed["env"], check=False, timeout=180)
        assert result.returncode == 0 and "GPU 0: NVIDIA " in result.stdout, (node, result.stdout)
        assert ssh(mixed, node, "nvidia-smi --query-gpu=driver_version --format=csv,noheader").split()[0] == NEW_DRIVER


def test_undo_leaves_every_node_as_it_was_before_the_first_deploy(mixed: dict, tmp_path: Path) -> None:
    """deploy (above, and upgrades), then undo --packages: every node's files byte-identical to the snapshot
    taken before the first deploy; only gpunode's labels and objects gone; a second undo changes nothing."""
    env = mixed["env"]
    gpunode("sim", "kubectl", "label", "node", "node01", "team=ml", env=env)  # another manager's label
    dry = gpunode("undo", INVENTORY, "--packages", "--dry", "--report", str(tmp_path / "dry.json"), env=env,
                  check=False)
    assert dry.returncode == 2, dry.stdout[-3000:] + dry.stderr[-3000:]
    result = gpunode("undo", INVENTORY, "--packages", "--report", str(tmp_path / "undo.json"), env=env,
                     check=False, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    after = {node: ssh_ok(mixed, node, SNAPSHOT) for node in NODES}
    for node in NODES:
        assert after[node] == mixed["before_deploy"][node], node
    nodes = {item["metadata"]["name"]: item["metadata"]["labels"] for item in json.loads(gpunode(
        "sim", "kubectl", "get", "nodes", "-o", "json", env=env).stdout)["items"]}
    assert nodes["node01"]["team"] == "ml" and nodes["node01"]["kubernetes.io/hostname"] == "node01"
    assert not [key for labels in nodes.values() for key in labels
                if key.startswith(("nvidia.com/", "gpunode.io/")) or key == "accelerator"], nodes
    leftovers = gpunode("sim", "kubectl", "get", "daemonsets,configmaps,serviceaccounts", "-n", "gpunode-system",
                        "-o", "name", env=env).stdout
    assert "gpunode-device-plugin" not in leftovers, leftovers
    assert "NotFound" in gpunode("sim", "kubectl", "get", "runtimeclass", "nvidia", env=env, check=False).stderr
    again = gpunode("undo", INVENTORY, "--packages", "--report", str(tmp_path / "again.json"), env=env, check=False)
    assert again.returncode == 0, again.stdout[-3000:]
    report = json.loads((tmp_path / "again.json").read_text())["hosts"]
    assert {node: r["changed"] for node, r in report.items()} == {node: [] for node in report}
