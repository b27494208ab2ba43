"""End to end: bootstrap, re-run, verify, break and repair, on three simulated nodes.

The fleet (A100/containerd, V100/docker, CPU-only) is the session's; these tests
run in file order and leave every node bootstrapped at the default pin.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CONTAINERD_DEFAULT, REPO, block, gpunode
from .fleet_ssh import ssh_ok

pytestmark = pytest.mark.fleet
INVENTORY = "inventories/sim.py"


def ssh(fleet: dict, node: str, command: str) -> str:
    return ssh_ok(fleet, node, command)


def deploy(fleet: dict, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = tmp_path / "deploy.json"
    if report.exists():
        report.unlink()
    result = gpunode("deploy", INVENTORY, *args, "--report", str(report), env=fleet["env"], check=False)
    return result, (json.loads(report.read_text())["hosts"] if report.exists() else {})


def verify(fleet: dict, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "verify.json"
    result = gpunode("verify", INVENTORY, "--json", str(out), *args, env=fleet["env"], check=False)
    assert out.is_file(), f"verify wrote no report (exit {result.returncode}): {result.stdout[-2000:]}" \
                          f"{result.stderr[-3000:]}"
    return result, json.loads(out.read_text())


def failing(results: dict) -> dict[tuple[str, str], str]:
    return {(host, step): r["reason"] for host, steps in results["hosts"].items() for step, r in steps.items()
            if r["state"] == "finding"}


def test_bootstrap_configures_gpu_nodes_and_reports_the_cpu_node(fleet: dict, tmp_path: Path) -> None:
    result, report = deploy(fleet, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    # nothing changed on the CPU node itself; the cluster-wide, run-once operations may land on any host
    assert [c for c in report["node03"]["changed"] if not c.startswith("Device plugin |")] == []
    assert report["node03"]["failed"] == [] and report["node03"]["unchanged"] >= 6
    for node in ("node01", "node02"):
        changed = " | ".join(report[node]["changed"])
        assert "apt repository" in changed and "pinned version" in changed and "Restart" in changed, changed
    assert int(ssh(fleet, "node01", "containerd config dump | grep -c 'runtimes.nvidia'")) >= 1
    daemon = json.loads(ssh(fleet, "node02", "cat /etc/docker/daemon.json"))
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert "default-runtime" not in daemon  # RuntimeClass, not default, unless the inventory says so
    assert ssh(fleet, "node01", "ls /var/backups/gpunode/*/etc/containerd/").strip()


def test_second_run_changes_nothing_and_restarts_nothing(fleet: dict, tmp_path: Path) -> None:
    pids = {n: ssh(fleet, n, f"pidof {d}").strip() for n, d in (("node01", "containerd"), ("node02", "dockerd"))}
    result, report = deploy(fleet, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(not r["changed"] and not r["failed"] for r in report.values()), report
    assert {n: ssh(fleet, n, f"pidof {d}").strip() for n, d in (("node01", "containerd"),
                                                               ("node02", "dockerd"))} == pids


def test_a_no_op_asks_each_host_one_question(fleet: dict) -> None:
    """Every step's facts come in one round trip per host (they took five on a GPU host, two on a CPU host)."""
    result = subprocess.run([sys.executable, "-m", "pyinfra", "-y", "-vv", INVENTORY, "deploys/bootstrap.py"],
                            cwd=REPO, env=fleet["env"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    asked = re.findall(r"^\[(node\d+)\] >>> ", result.stdout + result.stderr, re.M)
    assert {node: asked.count(node) for node in ("node01", "node02", "node03")} == {
        "node01": 1, "node02": 1, "node03": 1}, asked


def test_dry_run_reports_no_drift(fleet: dict, tmp_path: Path) -> None:
    result, report = deploy(fleet, tmp_path, "--dry")
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert all(not r["changed"] for r in report.values())


def test_dry_run_finds_drift_and_exits_2(fleet: dict, tmp_path: Path) -> None:
    ssh(fleet, "node02", "rm /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg")
    result, report = deploy(fleet, tmp_path, "--dry")
    assert result.returncode == 2, result.stdout + result.stderr[-2000:]
    assert any("apt repository" in name for name in report["node02"]["changed"]), report
    assert not report["node01"]["changed"] and not report["node03"]["changed"]
    assert ssh(fleet, "node02", "ls /usr/share/keyrings/").count("nvidia") == 0  # --dry changed nothing
    assert deploy(fleet, tmp_path)[0].returncode == 0


def test_plain_pytest_runs_the_suites(fleet: dict, tmp_path: Path) -> None:
    result = subprocess.run([str(REPO / ".venv/bin/python"), "-m", "pytest", "-p", "gpunode.verify.plugin",
                             "--pyargs", "gpunode.verify.suites",
                             "--inventory", INVENTORY, "--limit", "node0[12]", "-q", "-p", "no:cacheprovider",
                             "--junit-xml", str(tmp_path / "suites.xml")], cwd=REPO,
                            env=fleet["env"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "12 passed" in result.stdout  # 2 hosts x 6 steps
    assert 'tests="12"' in (tmp_path / "suites.xml").read_text()


def test_verify_passes_with_junit_json_and_html(fleet: dict, tmp_path: Path) -> None:
    junit, html = tmp_path / "verify.xml", tmp_path / "verify.html"
    result, results = verify(fleet, tmp_path, "--junit-xml", str(junit), "--html", str(html))
    assert result.returncode == 0, result.stdout + result.stderr
    assert failing(results) == {}
    assert results["hosts"]["node03"]["driver"]["state"] == "not checked"
    assert 'tests="18"' in junit.read_text() and 'failures="0"' in junit.read_text()
    assert "node01" in html.read_text() and "<table>" in html.read_text()
    assert "node01  " + "  ".join(["ok".ljust(12)] * 6) in result.stdout


READ_ONLY_TREES = "/etc /usr/share/keyrings /var/lib/dpkg /var/cache/apt"


# a broken fleet for the read-only test: node01's runtime without nvidia (restarted), node02's keyring gone
BROKEN = {"node01": f"{CONTAINERD_DEFAULT} > /etc/containerd/config.toml && systemctl restart containerd",
          "node02": "rm /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"}


@pytest.mark.parametrize("broken", [False, True], ids=["healthy", "broken"])
def test_verify_and_doctor_change_nothing_on_a_node_or_in_the_cluster(fleet: dict, tmp_path: Path,
                                                                      broken: bool) -> None:
    # apt's binary cache made stale, as any dpkg run leaves it: 'apt-mark showhold' (what the toolkit fact once
    # ran) rebuilds /var/cache/apt/pkgcache.bin then, a write by a read-only command
    ssh(fleet, "node01", "test -f /var/cache/apt/pkgcache.bin && touch -d '1 hour ago' /var/cache/apt/pkgcache.bin "
                         "&& touch /var/lib/dpkg/status")
    if broken:
        for node, breakage in BROKEN.items():
            ssh(fleet, node, breakage)
    try:
        read_only_run(fleet, tmp_path, 1 if broken else 0)
    finally:
        if broken:
            assert deploy(fleet, tmp_path)[0].returncode == 0


def read_only_run(fleet: dict, tmp_path: Path, code: int) -> None:
    """verify and doctor, with every file of the nodes' read-only trees and the API's writes compared around."""
    snapshot = (f"find {READ_ONLY_TREES} -xdev -type f -printf '%p %T@ %s\\n' | sort | md5sum; "
                f"find {READ_ONLY_TREES} -xdev -type f -exec sha256sum {{}} + | sort | sha256sum")
    before = {node: ssh(fleet, node, snapshot) for node in ("node01", "node02")}
    audit = Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "run" / "kube-apiserver-audit.log"
    writes_before = audit.read_text().count('"username":"gpunode"')
    result, _ = verify(fleet, tmp_path)
    assert result.returncode == code
    doctor = gpunode("doctor", INVENTORY, env=fleet["env"], check=False)
    assert doctor.returncode == code, doctor.stdout + doctor.stderr
    assert {node: ssh(fleet, node, snapshot) for node in ("node01", "node02")} == before
    assert audit.read_text().count('"username":"gpunode"') == writes_before  # the audit log keeps writes only


BREAKAGES = [
    ("node01", "runtime", f"{CONTAINERD_DEFAULT} > /etc/containerd/config.toml",
     "containerd's effective config has no nvidia runtime"),
    ("node02", "toolkit_repo", "rm /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg",
     "nvidia-container-toolkit-keyring.gpg is missing"),
    ("node01", "toolkit", "apt-get install -y -qq --allow-change-held-packages libnvidia-container1=1.20.0-1",
     "toolkit packages are not all at the pinned 1.17.8-1"),
    ("node01", "runtime", "systemctl stop containerd", "containerd is not running"),
    ("node02", "runtime", "systemctl stop docker", "docker is not running"),
]


@pytest.mark.parametrize(("node", "step", "breakage", "reason"), BREAKAGES,
                         ids=[f"{b[0]}-{b[1]}-{b[2].split()[0]}" for b in BREAKAGES])
def test_breaking_one_step_fails_exactly_there_and_bootstrap_repairs_it(
        fleet: dict, tmp_path: Path, node: str, step: str, breakage: str, reason: str) -> None:
    ssh(fleet, node, breakage)
    result, results = verify(fleet, tmp_path)
    assert result.returncode == 1
    # docker stopped takes the plugin's container with it (containerd's shims outlive containerd): the plugin
    # step fails there too once the node's kubelet noticed, as it would on a real docker node without live-restore
    also = {(node, "device_plugin")} if breakage == "systemctl stop docker" else set()
    assert (node, step) in failing(results) and set(failing(results)) - {(node, step)} <= also, failing(results)
    assert reason in failing(results)[(node, step)]
    assert any(line.startswith(f"FINDING {node} {step}: ") and reason in line for line in result.stdout.splitlines())
    repaired, _ = deploy(fleet, tmp_path)
    assert repaired.returncode == 0, repaired.stderr[-3000:]
    again, results = verify(fleet, tmp_path)
    assert again.returncode == 0 and failing(results) == {}


def test_pin_upgrade_and_both_toolkit_layouts_converge(fleet: dict, tmp_path: Path) -> None:
    pin = "toolkit_version=1.20.0-1"
    result, _ = deploy(fleet, tmp_path, "--data", pin)
    assert result.returncode == 0, result.stderr[-3000:]
    versions = ssh(fleet, "node01", "dpkg-query -W -f='${Version}\\n' nvidia-container-toolkit "
                   "nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1")
    assert versions.split() == ["1.20.0-1"] * 4
    ok, _ = verify(fleet, tmp_path, "--data", pin)
    assert ok.returncode == 0, ok.stdout  # the 1.17 in-place config still reads as configured
    # a node configured by 1.20 from scratch: drop-in plus imports
    ssh(fleet, "node01", f"{CONTAINERD_DEFAULT} > /etc/containerd/config.toml")
    result, report = deploy(fleet, tmp_path, "--data", pin)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ssh(fleet, "node01", "cat /etc/containerd/conf.d/99-nvidia.toml").count("runtimes.nvidia") >= 1
    assert 'imports = ["/etc/containerd/conf.d/*.toml"]' in ssh(fleet, "node01", "cat /etc/containerd/config.toml")
    ok, _ = verify(fleet, tmp_path, "--data", pin)
    assert ok.returncode == 0, ok.stdout
    again, report = deploy(fleet, tmp_path, "--data", pin)
    assert all(not r["changed"] for r in report.values()), report
    # and back to the default pin: all four downgrade together, the drop-in layout keeps reading as configured
    result, _ = deploy(fleet, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ok, results = verify(fleet, tmp_path)
    assert ok.returncode == 0, failing(results)


def checksum(fleet: dict, node: str, path: str) -> str:
    return ssh(fleet, node, f"sha256sum {path}").split()[0]


def test_wrong_key_fingerprint_fails_the_host_before_trusting_the_key(fleet: dict, tmp_path: Path) -> None:
    ssh(fleet, "node01", "rm /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg")
    config = checksum(fleet, "node01", "/etc/containerd/config.toml")
    result, report = deploy(fleet, tmp_path, "--limit", "node01", "--data", "toolkit_key_fingerprint=" + "DEADBEEF" * 5)
    assert result.returncode == 1
    assert "refusing to trust it" in result.stderr and "DEADBEEF" * 5 in result.stderr
    assert report["node01"]["failed"]
    assert ssh(fleet, "node01", "ls /usr/share/keyrings/").count("nvidia") == 0
    assert checksum(fleet, "node01", "/etc/containerd/config.toml") == config
    assert deploy(fleet, tmp_path)[0].returncode == 0


def test_unreachable_repository_fails_the_host_and_leaves_the_runtime_alone(fleet: dict, tmp_path: Path) -> None:
    config = checksum(fleet, "node02", "/etc/docker/daemon.json")
    result, report = deploy(fleet, tmp_path, "--limit", "node02", "--data",
                            "toolkit_repository_url=http://127.0.0.1:9/libnvidia-container/stable/deb/$(ARCH)")
    assert result.returncode == 1
    assert "127.0.0.1:9" in result.stderr and ("Failed to fetch" in result.stderr or "Could not" in result.stderr)
    assert report["node02"]["failed"]
    assert checksum(fleet, "node02", "/etc/docker/daemon.json") == config
    assert deploy(fleet, tmp_path)[0].returncode == 0


def test_a_pinned_version_that_does_not_exist(fleet: dict, tmp_path: Path) -> None:
    config = checksum(fleet, "node01", "/etc/containerd/config.toml")
    result, _ = deploy(fleet, tmp_path, "--limit", "node01", "--data", "toolkit_version=9.9.9-1")
    assert result.returncode == 1
    assert "toolkit version 9.9.9-1 is not in the configured repository (available: 1.20.0-1 1.17.8-1" \
        in result.stderr
    assert checksum(fleet, "node01", "/etc/containerd/config.toml") == config


def test_invalid_containerd_toml_is_refused_and_left_as_it_is(fleet: dict, tmp_path: Path) -> None:
    ssh(fleet, "node01", f"cp /etc/containerd/config.toml /root/config.good; {CONTAINERD_DEFAULT}"
        " > /etc/containerd/config.toml; printf '[plugins\\n' >> /etc/containerd/config.toml")
    broken = checksum(fleet, "node01", "/etc/containerd/config.toml")
    result, _ = deploy(fleet, tmp_path, "--limit", "node01")
    assert result.returncode == 1
    assert "/etc/containerd/config.toml is not valid TOML: gpunode will not touch it" in result.stderr
    assert "line " in result.stderr
    assert checksum(fleet, "node01", "/etc/containerd/config.toml") == broken
    ssh(fleet, "node01", "cp /root/config.good /etc/containerd/config.toml")
    assert deploy(fleet, tmp_path)[0].returncode == 0


def test_runtime_that_does_not_come_back_is_restored(fleet: dict, tmp_path: Path) -> None:
    ssh(fleet, "node01", f"{CONTAINERD_DEFAULT} > /etc/containerd/config.toml;"
        " mv /usr/bin/ctr /usr/bin/ctr.real; printf '#!/bin/sh\\nexit 1\\n' > /usr/bin/ctr; chmod +x /usr/bin/ctr")
    before = checksum(fleet, "node01", "/etc/containerd/config.toml")
    try:
        result, _ = deploy(fleet, tmp_path, "--limit", "node01", "--data", "runtime_restart_timeout=5")
        assert result.returncode == 1
        assert "containerd did not answer 'ctr version' within 5 s after the restart; restoring" in result.stderr
        assert checksum(fleet, "node01", "/etc/containerd/config.toml") == before
    finally:
        ssh(fleet, "node01", "mv /usr/bin/ctr.real /usr/bin/ctr")
    assert deploy(fleet, tmp_path)[0].returncode == 0


def test_unreachable_host_is_named_and_the_others_finish(fleet: dict, tmp_path: Path) -> None:
    inventory = tmp_path / "with_dead_host.py"
    inventory.write_text(
        f"exec(open({str(REPO / INVENTORY)!r}).read())\n"
        f"gpu_nodes = gpu_nodes + [('ghost', dict(gpu_nodes[0][1], ssh_hostname='127.0.{block(fleet['env'])}.99'))]\n")
    report_file = tmp_path / "report.json"
    result = gpunode("deploy", str(inventory), "--report", str(report_file), env=fleet["env"], check=False)
    report = json.loads(report_file.read_text())["hosts"]
    assert result.returncode == 1
    assert report["ghost"]["failed"] and "unreachable" in report["ghost"]["failed"][0]
    assert not report["node01"]["failed"] and not report["node02"]["failed"]


@pytest.mark.parametrize(("args", "message"), [
    (("deploy", "inventories/typo.py"), "inventory inventories/typo.py does not exist"),
    (("deploy", INVENTORY, "--limit", "nosuchnode"), "no host of inventories/sim.py matches --limit nosuchnode"),
    (("verify", INVENTORY, "--limit", "nosuchnode"), "no host of inventories/sim.py matches --limit nosuchnode"),
    (("deploy", INVENTORY, "toolkits"), "unknown step 'toolkits'"),
    (("deploy", INVENTORY, "--data", "toolkit_version"), "--data 'toolkit_version' is not KEY=VALUE"),
])
def test_bad_invocations_fail_clearly(fleet: dict, args: tuple[str, ...], message: str) -> None:
    result = gpunode(*args, env=fleet["env"], check=False)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
