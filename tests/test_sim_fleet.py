"""End to end: three simulated nodes, reached over real SSH by ssh, pyinfra and testinfra."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest
import testinfra
from gpunode_sim.node.simnode import KUBELET_PORT
from gpunode_sim.spec.gpus import driver_state
from gpunode_sim.spec.profiles import load_profile

from . import fleet_ssh
from .conftest import REPO, block, gpunode

pytestmark = pytest.mark.fleet


def ssh(fleet: dict, node: str, command: str, root: bool = False) -> subprocess.CompletedProcess[str]:
    return fleet_ssh.ssh(fleet, node, command, root=root, timeout=60)


def pyinfra(fleet: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / ".venv/bin/pyinfra"), "-y", "inventories/sim.py", *args], cwd=REPO,
                          env=fleet["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300, check=False)


def test_up_reports_three_nodes_with_their_profiles(fleet: dict) -> None:
    nodes = {n["name"]: n for n in fleet["nodes"]}
    assert sorted(nodes) == ["node01", "node02", "node03"]
    assert [nodes[n]["profile"] for n in sorted(nodes)] == ["a100x4-containerd", "v100x2-docker", "cpu-only"]
    assert all(n["error"] is None for n in nodes.values())
    assert nodes["node02"]["address"] == f"127.0.{block(fleet['env'])}.2"


def test_ssh_with_strict_host_keys_lists_the_profiles_gpus(fleet: dict) -> None:
    result = ssh(fleet, "node01", "nvidia-smi -L")
    assert result.returncode == 0, result.stderr
    expected = driver_state("node01", load_profile("a100x4-containerd"))["gpus"]
    lines = result.stdout.strip().splitlines()
    assert lines == [f"GPU {g['index']}: NVIDIA A100-SXM4-40GB (UUID: {g['uuid']})" for g in expected]
    config = Path(fleet["ssh_config"]).read_text()
    assert "StrictHostKeyChecking yes" in config


def test_a_wrong_host_key_is_refused(fleet: dict, tmp_path: Path) -> None:
    known = Path(fleet["ssh_config"]).parent / "known_hosts"
    forged = tmp_path / "known_hosts"
    node01_key = next(line for line in known.read_text().splitlines() if line.startswith("node01,"))
    node02_key = next(line for line in known.read_text().splitlines() if line.startswith("node02,"))
    forged.write_text(node01_key.split()[0] + " " + " ".join(node02_key.split()[1:]) + "\n")
    result = subprocess.run(["ssh", "-F", fleet["ssh_config"], "-o", f"UserKnownHostsFile={forged}", "node01",
                             "true"], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr or "Host key verification failed" in result.stderr


def test_nodes_are_isolated_from_each_other_and_the_host(fleet: dict) -> None:
    names = {ssh(fleet, n, "hostname").stdout.strip() for n in ("node01", "node02", "node03")}
    assert names == {"node01", "node02", "node03"}
    links = ssh(fleet, "node01", "ip -o link show").stdout.strip().splitlines()
    # besides lo: only the pod network inside the node (the CNI bridge, veths to its pods' namespaces)
    assert ": lo:" in links[0]
    assert all(": cni0:" in link or ("veth" in link and "link-netns cni-" in link) for link in links[1:]), links
    assert "default" not in ssh(fleet, "node01", "ip route").stdout  # no route out of the node
    pid1 = ssh(fleet, "node01", "cat /proc/1/cmdline | tr '\\0' ' '").stdout
    assert "systemctl3.py init" in pid1


def test_pyinfra_exec_runs_on_all_three(fleet: dict) -> None:
    result = pyinfra(fleet, "exec", "--", "nvidia-smi -L || echo no-driver-on-$(hostname)")
    assert result.returncode == 0, result.stdout
    assert "[node01] GPU 3: NVIDIA A100-SXM4-40GB" in result.stdout
    assert "[node02] GPU 1: Tesla V100-SXM2-32GB" in result.stdout
    assert "[node03] no-driver-on-node03" in result.stdout


def test_pyinfra_operations_change_each_node_then_nothing(fleet: dict) -> None:
    first = pyinfra(fleet, "tests/data/marker_deploy.py")
    assert first.returncode == 0, first.stdout
    for node in ("node01", "node02", "node03"):
        assert ssh(fleet, node, "cat /etc/gpunode-e2e-marker.log").stdout.strip() == f"seen {node}"
    second = pyinfra(fleet, "tests/data/marker_deploy.py")
    assert second.returncode == 0, second.stdout
    totals = next(line for line in second.stdout.splitlines() if "Grand total" in line).split()
    # columns: Grand total | hosts | success | error | no change
    assert totals[-1] == "6" and totals[-3] == "-", second.stdout


def test_testinfra_sees_services_devices_and_runtimes(fleet: dict) -> None:
    for node, runtime in (("node01", "containerd"), ("node02", "docker"), ("node03", "containerd")):
        host = testinfra.get_host(f"ssh://{node}", ssh_config=fleet["ssh_config"])
        assert host.service("ssh").is_running
        assert host.service("ssh").is_enabled
        assert host.service(runtime).is_running, node
        assert host.package("openssh-server").is_installed
    a100 = testinfra.get_host("ssh://node01", ssh_config=fleet["ssh_config"])
    assert a100.run("test -c /dev/nvidia3 && test -c /dev/nvidiactl").rc == 0
    assert a100.file("/sys/module/nvidia/version").content_string.strip() == "550.54.15"
    assert "Kernel Module  550.54.15" in a100.file("/proc/driver/nvidia/version").content_string
    cpu = testinfra.get_host("ssh://node03", ssh_config=fleet["ssh_config"])
    assert cpu.run("test -e /dev/nvidiactl").rc == 1
    assert cpu.run("nvidia-smi").rc == 127


def test_containers_really_run_on_the_runtimes(fleet: dict) -> None:
    result = ssh(fleet, "node01",
                 "ctr plugins ls | awk '$2==\"cri\"{print $4}'; ctr version >/dev/null && echo ctr-ok", root=True)
    assert result.stdout.split() == ["ok", "ctr-ok"], result.stdout + result.stderr
    info = ssh(fleet, "node02", "docker info --format '{{.ServerVersion}} {{.DefaultRuntime}}'", root=True)
    assert info.returncode == 0 and info.stdout.strip().endswith(" runc"), info.stderr


def test_toolkit_repo_is_signed_and_pinned_versions_install(fleet: dict) -> None:
    inventory = json.loads((Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "inventory.json").read_text())
    repo = inventory["toolkit_repo"]
    script = f"""set -e
curl -fsSL {repo['key_url']} | gpg --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
gpg --show-keys --with-colons /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg \
  | awk -F: '$1=="fpr"{{print $10; exit}}'
echo 'deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] {repo['repository_url']} /' \
  > /etc/apt/sources.list.d/nvidia-container-toolkit.list
apt-get update -qq
v=1.17.8-1
apt-get install -y -qq nvidia-container-toolkit=$v nvidia-container-toolkit-base=$v libnvidia-container-tools=$v \
  libnvidia-container1=$v >/dev/null
nvidia-ctk --version
apt-cache policy nvidia-container-toolkit | awk '/Candidate/{{print $2}}'
"""
    result = ssh(fleet, "node03", script, root=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[0] == repo["key_fingerprint"]
    assert "NVIDIA Container Toolkit CLI version 1.17.8" in result.stdout
    assert "1.20.0-1" in lines  # the newer version is the candidate, as in NVIDIA's repository
    unsigned = ssh(fleet, "node03",
                   "sed -i 's/signed-by=[^]]*/trusted=no/' /etc/apt/sources.list.d/nvidia-container-toolkit.list;"
                   " apt-get update 2>&1; echo rc=$?", root=True)
    # without signed-by, apt checks the system keyrings only and refuses the repository's signature
    assert f"NO_PUBKEY {repo['key_fingerprint'][-16:]}" in unsigned.stdout, unsigned.stdout


def test_status_lists_running_nodes(fleet: dict) -> None:
    result = gpunode("sim", "status", "--json", env=fleet["env"])
    rows = json.loads(result.stdout)
    assert [(r["name"], r["gpus"], r["state"]) for r in rows] == [
        ("node01", 4, "running"), ("node02", 2, "running"), ("node03", 0, "running")]


def test_exec_enters_a_node_without_ssh(fleet: dict) -> None:
    result = gpunode("sim", "exec", "node02", "--", "nvidia-smi", "--query-gpu=name", "--format=csv,noheader",
                     env=fleet["env"])
    assert result.stdout.splitlines() == ["Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB"]


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def test_a_failing_node_is_reported_by_name_and_the_others_come_up(tmp_path: Path, sim_env: dict) -> None:
    env = {**sim_env, "GPUNODE_SIM_DIR": str(tmp_path / "sim"), "GPUNODE_SIM_NET": block(sim_env, 1)}
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind((f"127.0.{env['GPUNODE_SIM_NET']}.2", KUBELET_PORT))
    squatter.listen()
    try:
        result = gpunode("sim", "up", "-n", "2", env=env, check=False)
    finally:
        squatter.close()
    try:
        assert result.returncode == 1
        assert "node02 failed: kubelet-host exited" in result.stderr
        assert "Address already in use" in result.stderr  # node02's console log is shown
        assert result.stdout.count(" up") >= 1 and f"node01   127.0.{env['GPUNODE_SIM_NET']}.1" in result.stdout
        assert _listening(f"127.0.{env['GPUNODE_SIM_NET']}.1", KUBELET_PORT)
        assert _listening(f"127.0.{env['GPUNODE_SIM_NET']}.253", 22)  # the bastion
    finally:
        # without GPUNODE_SIM_NET: down must find the fleet's block in its state, not in the environment
        down = gpunode("sim", "down", env={k: v for k, v in env.items() if k != "GPUNODE_SIM_NET"}, check=False)
    assert down.returncode == 0, down.stderr
    assert not _listening(f"127.0.{env['GPUNODE_SIM_NET']}.1", KUBELET_PORT)
    assert not _listening(f"127.0.{env['GPUNODE_SIM_NET']}.253", 22)
    assert not [ns for ns in ("node01", "node02", "bastion") if Path(f"/run/netns/gpunode21-{ns}").exists()]


def test_interrupted_up_then_down_leaves_the_machine_clean(tmp_path: Path, sim_env: dict) -> None:
    env = {**sim_env, "GPUNODE_SIM_DIR": str(tmp_path / "sim"), "GPUNODE_SIM_NET": block(sim_env, 2)}
    proc = subprocess.Popen([str(REPO / ".venv/bin/gpunode"), "sim", "up", "-n", "2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fleet_file = tmp_path / "sim" / "fleet.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (fleet_file.exists() and '"init"' in fleet_file.read_text()):
        time.sleep(0.05)
    proc.send_signal(2)  # SIGINT, as Ctrl-C sends
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode in (0, 130), err
    down = gpunode("sim", "down", env=env, check=False)
    assert down.returncode == 0, down.stderr
    from gpunode_sim.fleet import leftovers
    from gpunode_sim.host.paths import SimPaths

    assert leftovers(SimPaths(tmp_path / "sim", Path("/var/cache/gpunode"), 22)) == []
    assert not Path("/run/netns/gpunode22-node01").exists() and not Path("/run/netns/gpunode22-bastion").exists()
    assert not _listening(f"127.0.{env['GPUNODE_SIM_NET']}.1", KUBELET_PORT)
