"""Reaching nodes as production fleets do: a non-root user with sudo, through the bastion, and what doctor says when
sudo asks for a password the inventory does not give or refuses the user.

The sudo policies are injected into node03's /etc/sudoers.d by the simulator's ``exec`` (no SSH: with the policy in
place root is what the test itself may not have) and put back after each test.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from gpunode_sim.access.ssh import SIM_USER
from gpunode_sim.build.kubernetes import require
from gpunode_sim.cluster.controlplane import OPERATOR_CONTEXT, OPERATOR_USER
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.images.layers import SIM_USER_PASSWORD, SUDOERS

from gpunode.cluster import rbac
from gpunode.connection import Connections, Unreachable

from .conftest import gpunode
from .fleet_ssh import ssh, ssh_ok

pytestmark = pytest.mark.fleet

INVENTORY = "inventories/sim.py"
NODE = "node03"
SUDOERS_FILE = f"/etc/sudoers.d/{SIM_USER}"
ASKS_PASSWORD = f"{SIM_USER} ALL=(ALL:ALL) ALL\n"
ONLY_NVIDIA_SMI = f"{SIM_USER} ALL=(root) NOPASSWD: /usr/bin/nvidia-smi\n"


def set_sudoers(fleet: dict, text: str) -> None:
    script = f"printf %s {shlex.quote(text)} > {SUDOERS_FILE} && chmod 440 {SUDOERS_FILE}"
    gpunode("sim", "exec", NODE, "--", "sh", "-c", script, env=fleet["env"])


@pytest.fixture
def sudo_policy(fleet: dict) -> Iterator[Callable[[str], None]]:
    yield lambda text: set_sudoers(fleet, text)
    set_sudoers(fleet, SUDOERS)


def connections(fleet: dict, **data: str) -> tuple[Connections, str]:
    """verify's connection to node03 with the inventory's data (read from the fleet's inventory.json: loading the
    inventory through pyinfra's CLI module would gevent-patch this whole test process)."""
    host = json.loads(Path(fleet["inventory"]).read_text())["hosts"][NODE]
    return Connections([(NODE, {**host, **data})]), NODE


def doctor(fleet: dict, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    result = gpunode("doctor", INVENTORY, "--limit", NODE, "--json", *args, env=fleet["env"], check=False)
    return result, json.loads(result.stdout)


def test_nodes_refuse_root_and_answer_only_through_the_bastion(fleet: dict) -> None:
    assert ssh_ok(fleet, NODE, "id -un", root=False).strip() == SIM_USER
    assert ssh_ok(fleet, NODE, "id -u").strip() == "0"  # passwordless sudo, the default policy
    as_root = ssh(fleet, NODE, "true", root=False, options=("-l", "root"))
    assert as_root.returncode == 255 and "Permission denied" in as_root.stderr, as_root.stderr
    direct = ssh(fleet, NODE, "true", root=False, options=("-o", "ProxyJump=none"))
    assert direct.returncode == 255 and "Connection refused" in direct.stderr, direct.stderr
    config = Path(fleet["ssh_config"]).read_text()
    assert f"Host {NODE}\n" in config and "ProxyJump bastion" in config


def test_verify_reads_root_only_state_through_sudo(fleet: dict) -> None:
    reach, name = connections(fleet)
    try:
        reply = reach.run(name, "id -u; ls -l /run/containerd/containerd.sock; head -c 0 /etc/shadow && echo shadow")
    finally:
        reach.close()
    assert reply.ok, reply.stderr
    lines = reply.stdout.splitlines()
    assert lines[0] == "0" and lines[1].startswith("srw") and lines[2] == "shadow"


def test_a_sudo_password_from_the_inventory_is_used_and_a_missing_one_is_named(
        fleet: dict, sudo_policy: Callable[[str], None]) -> None:
    sudo_policy(ASKS_PASSWORD)
    result, report = doctor(fleet)
    assert result.returncode == 1, result.stdout + result.stderr
    problem = report["problems"][0]
    assert (problem["link"], problem["code"]) == ("connection", "sudo-refused"), problem
    assert problem["what"].startswith(f"sudo refused for user {SIM_USER} on host {NODE}: "), problem
    assert "a password is required" in problem["what"] and "_sudo_password" in problem["fix"], problem
    reach, name = connections(fleet, _sudo_password=SIM_USER_PASSWORD)
    try:
        assert reach.run(name, "id -u").stdout == "0\n"
    finally:
        reach.close()
    result, report = doctor(fleet, "--data", f"_sudo_password={SIM_USER_PASSWORD}")
    assert not [p for p in report["problems"] if p["link"] == "connection"], report["problems"]
    assert report["links"][NODE][0]["link"] == "driver", report["links"][NODE]  # the host was read
    wrong, report = doctor(fleet, "--data", "_sudo_password=not-it")
    assert wrong.returncode == 1
    problem = report["problems"][0]
    assert problem["code"] == "sudo-refused" and "incorrect password" in problem["what"], problem
    assert "correct _sudo_password" in problem["fix"]


def check(fleet: dict, *args: str) -> tuple[int, dict[tuple[str, str], dict]]:
    result = gpunode("check", INVENTORY, "--json", *args, env=fleet["env"], check=False)
    found = json.loads(result.stdout)
    return result.returncode, {(c["subject"], c["name"]): c for c in found["checks"]}


def test_the_preflight_is_ready_on_the_fleet_and_names_the_sudo_password_it_lacks(
        fleet: dict, sudo_policy: Callable[[str], None]) -> None:
    code, checks = check(fleet)
    assert code == 0, [c for c in checks.values() if c["state"] != "ok"]
    for node in ("node01", "node02", "node03"):
        assert {name for subject, name in checks if subject == node} == {
            "ssh", "sudo", "os", "container runtime", "toolkit repository"}, node
    assert checks[("node02", "container runtime")]["detail"].startswith("container_runtime = docker: ")
    assert "/InRelease" in checks[("node01", "toolkit repository")]["detail"]
    permissions = next(c for (subject, name), c in checks.items() if name == "permissions")
    assert permissions["state"] == "ok" and "SelfSubjectAccessReview" in permissions["detail"]
    sudo_policy(ASKS_PASSWORD)
    code, checks = check(fleet)
    assert code == 1
    assert checks[(NODE, "sudo")]["state"] == "finding"
    assert "a password is required" in checks[(NODE, "sudo")]["detail"]
    assert "_sudo_password" in checks[(NODE, "sudo")]["fix"]
    assert checks[("node01", "sudo")]["state"] == "ok"  # one host's surprise is that host's alone
    code, checks = check(fleet, "--limit", NODE, "--data", f"_sudo_password={SIM_USER_PASSWORD}")
    assert code == 0, [c for c in checks.values() if c["state"] != "ok"]


def test_the_preflight_names_each_permission_the_identity_lacks(fleet: dict, without_node_patch: None) -> None:
    code, checks = check(fleet, "--limit", "node01")
    permissions = next(c for (subject, name), c in checks.items() if name == "permissions")
    assert code == 1 and permissions["state"] == "finding"
    assert permissions["detail"].startswith("1 of ") and "denied: patch nodes" in permissions["detail"], permissions


def test_sudo_refused_is_its_own_finding_never_a_runtime_one(fleet: dict, sudo_policy: Callable[[str], None]) -> None:
    sudo_policy(ONLY_NVIDIA_SMI)  # with the password given: sudo authenticates the user, then refuses the command
    password = f"_sudo_password={SIM_USER_PASSWORD}"
    result, report = doctor(fleet, "--data", password)
    assert result.returncode == 1
    # (a fleet not deployed yet also lacks the nvidia RuntimeClass: a problem of the cluster, not of node03)
    assert [p["subject"] for p in report["problems"] if p["subject"] != "cluster"] == [NODE]
    problem = report["problems"][0]
    assert problem["link"] == "connection" and problem["code"] == "sudo-refused", problem
    assert problem["what"].startswith(f"sudo refused for user {SIM_USER} on host {NODE}: Sorry, user {SIM_USER} is "
                                      "not allowed to execute"), problem
    assert problem["evidence"] and "sudoers" in problem["fix"], problem
    links = report["links"][NODE]
    assert links[0]["link"] == "connection" and all(link["state"] == "not checked" for link in links[1:]), links
    reach, name = connections(fleet, _sudo_password=SIM_USER_PASSWORD)
    try:
        with pytest.raises(Unreachable, match="not allowed to execute '/usr/bin/sh -c true' as root"):
            reach.run(name, "true")
    finally:
        reach.close()
    text = gpunode("doctor", INVENTORY, "--limit", NODE, "--data", password, env=fleet["env"], check=False).stdout
    assert "sudo refused" in text and "does not answer" not in text, text
    sudo_policy("# the user has no sudo at all\n")
    _, report = doctor(fleet, "--data", password)
    assert report["problems"][0]["what"] == \
        f"sudo refused for user {SIM_USER} on host {NODE}: {SIM_USER} is not in the sudoers file.", report


def kubectl(fleet: dict, *args: str, context: str = OPERATOR_CONTEXT,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    binary = require(SimPaths.from_env().cache) / "kubectl"
    kubeconfig = Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "kubeconfig"
    return subprocess.run([str(binary), "--kubeconfig", str(kubeconfig), "--context", context, *args],
                          input=stdin, capture_output=True, text=True, timeout=60, check=False)


def test_gpunode_runs_as_exactly_the_rules_render_rbac_prints(fleet: dict) -> None:
    inventory = json.loads(Path(fleet["inventory"]).read_text())
    assert inventory["kube_context"] == OPERATOR_CONTEXT
    everything = kubectl(fleet, "auth", "can-i", "*", "*")
    assert everything.returncode == 1 and everything.stdout.strip() == "no", everything.stdout + everything.stderr
    assert kubectl(fleet, "auth", "can-i", "create", "pods").stdout.strip() == "no"
    assert kubectl(fleet, "auth", "can-i", "patch", "nodes").stdout.strip() == "yes"
    printed = list(yaml.safe_load_all(gpunode("render", INVENTORY, "--rbac", "--subject", f"User:{OPERATOR_USER}",
                                              env=fleet["env"]).stdout))
    # gpunode's own rules, then the node checker's (its ServiceAccount's rights and its own-node policy), then the
    # DRA driver's
    assert [d["kind"] for d in printed] == ["Namespace", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                                            "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Role",
                                            "RoleBinding", "ValidatingAdmissionPolicy",
                                            "ValidatingAdmissionPolicyBinding", "ClusterRole", "ClusterRoleBinding"]
    for document in printed:
        if document["kind"] not in ("ClusterRole", "Role"):
            continue
        namespace = document["metadata"].get("namespace")
        bound = json.loads(kubectl(fleet, "get", document["kind"].lower(), document["metadata"]["name"], "-o", "json",
                                   *(["-n", namespace] if namespace else []), context="gpunode-sim").stdout)
        assert bound["rules"] == document["rules"], document["metadata"]["name"]


@pytest.fixture
def without_node_patch(fleet: dict) -> Iterator[None]:
    rules = [r for r in rbac.cluster_rules("gpunode-system") if r.resource != "nodes"]
    rules.append(rbac.Rule("", "nodes", ("get", "list")))
    patch = json.dumps({"rules": [r.as_dict() for r in rules]})
    changed = kubectl(fleet, "patch", "clusterrole", "gpunode", "--type", "merge", "-p", patch, context="gpunode-sim")
    assert changed.returncode == 0, changed.stderr
    yield
    restored = kubectl(fleet, "apply", "--server-side", "--force-conflicts", "--field-manager", "gpunode-sim", "-f",
                       "-", context="gpunode-sim", stdin=rbac.render("gpunode-system", f"User:{OPERATOR_USER}"))
    assert restored.returncode == 0, restored.stderr


def test_a_missing_rbac_rule_is_named_with_the_rule_to_add(fleet: dict, without_node_patch: None) -> None:
    result = gpunode("deploy", INVENTORY, "labels", "--limit", "node01", "--data", "label_model_prefix=gpu-",
                     env=fleet["env"], check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert 'RBAC denied: nodes "node01" is forbidden: User "gpunode" cannot patch resource "nodes"' in output, \
        output[-3000:]
    assert ('add to the ClusterRole gpunode: {apiGroups: [""], resources: ["nodes"], verbs: ["patch"]} for user '
            "gpunode") in output, output[-3000:]
    assert "Traceback" not in output
