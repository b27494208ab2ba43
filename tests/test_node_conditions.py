"""The node checker's conditions and record, and how --in-cluster reads them back (no cluster needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpunode import chain
from gpunode.diagnosis import Finding, Verdict
from gpunode.facts.labels import NodeLabelsState, api_time
from gpunode.verify.checks import NODE_STEPS, StepResult
from gpunode.verify.in_cluster import record_problem
from gpunode.verify.node_conditions import (
    CONDITIONS,
    camel,
    changed,
    conditions,
    heartbeat,
    reason_of,
    record,
    results_of,
)

NOW = datetime(2026, 12, 3, 21, 0, 0, tzinfo=UTC)
BROKEN = Finding("runtime", Verdict.FINDING, "containerd on node01 has no nvidia runtime",
                 ["/etc/containerd/config.toml on node01: no runtimes.nvidia"], "gpunode deploy INVENTORY runtime",
                 "nvidia-runtime-missing")
WARNING = Finding("driver", Verdict.FINDING, "persistence mode is off on GPU 0", ["nvidia-smi on node01: Disabled"],
                  "systemctl enable --now nvidia-persistenced", "persistence-mode-off", breaks=False)
PROOF = Finding("driver", Verdict.OK, "driver 550.54.15 answers", ["nvidia-smi on node01: 550.54.15"], code="ok")


def healthy(host: str = "node01") -> dict[str, StepResult]:
    results = {step: StepResult(host, step, Verdict.OK, f"{step} holds",
                                [Finding(step, Verdict.OK, f"{step} holds", [f"read {step} on {host}"], code="ok")])
               for step in chain.NAMES}
    results["driver"] = StepResult(host, "driver", Verdict.OK, PROOF.what, [WARNING, PROOF])
    return results


def test_every_link_has_one_condition_type_in_node_problem_detectors_style() -> None:
    assert list(CONDITIONS) == list(chain.NAMES)
    kinds = [step.condition for step in chain.STEPS]
    assert len(set(kinds)) == len(kinds) == len(chain.STEPS)
    assert all(kind.endswith("Ready") and kind[0].isupper() and kind.isalnum() for kind in kinds)


@pytest.mark.parametrize(("code", "reason"), [("nvidia-runtime-missing", "NvidiaRuntimeMissing"),
                                              ("mig-caps-missing", "MigCapsMissing"),
                                              ("driver_mismatch", "DriverMismatch"), ("", "")])
def test_a_finding_code_becomes_a_camelcase_reason(code: str, reason: str) -> None:
    assert camel(code) == reason


def test_status_and_reason_follow_the_verdict() -> None:
    results = healthy()
    results["runtime"] = StepResult("node01", "runtime", Verdict.FINDING, BROKEN.what, [BROKEN])
    results["toolkit"] = StepResult("node01", "toolkit", Verdict.NOT_CHECKED, "not checked: CPU-only host")
    out = {c["type"]: c for c in conditions(results, {}, NOW)}
    assert out["NvidiaRuntimeReady"]["status"] == "False"
    assert out["NvidiaRuntimeReady"]["reason"] == "NvidiaRuntimeMissing"
    assert out["NvidiaRuntimeReady"]["message"] == BROKEN.what
    assert out["NvidiaContainerToolkitReady"]["status"] == "Unknown"
    assert out["GPUDriverReady"] == {"type": "GPUDriverReady", "status": "True", "reason": "Verified",
                                     "message": PROOF.what, "lastHeartbeatTime": "2026-12-03T21:00:00Z",
                                     "lastTransitionTime": "2026-12-03T21:00:00Z"}
    assert reason_of(results["driver"]) == "Verified"  # a warning does not break the link


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    first = {c["type"]: c for c in conditions(healthy(), {}, NOW)}
    later = NOW + timedelta(minutes=5)
    again = conditions(healthy(), first, later)
    assert all(c["lastTransitionTime"] == api_time(NOW) and c["lastHeartbeatTime"] == api_time(later)
               for c in again)
    assert changed(first, again) == []
    broken = healthy()
    broken["runtime"] = StepResult("node01", "runtime", Verdict.FINDING, BROKEN.what, [BROKEN])
    moved = changed(first, conditions(broken, first, later))
    assert [(c["type"], c["status"], c["lastTransitionTime"]) for c in moved] == [
        ("NvidiaRuntimeReady", "False", api_time(later))]


def test_the_record_gives_back_every_verdict_with_its_evidence_fix_and_proof() -> None:
    results = healthy()
    results["runtime"] = StepResult("node01", "runtime", Verdict.FINDING, BROKEN.what, [BROKEN])
    facts = {"driver": {"nvidia_smi": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}, "health": [], "other": 1},
             "hostname": "node01"}
    data = record("node01", results, facts, 30)
    assert data["facts"] == {"driver": {"nvidia_smi": {"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}, "health": []},
                             "hostname": "node01"}
    back = results_of("gpu-a", data)
    assert back["runtime"].state is Verdict.FINDING and back["runtime"].findings == [BROKEN]
    assert back["driver"].state is Verdict.OK and back["driver"].proof == PROOF.evidence
    assert back["driver"].findings[0] == WARNING
    assert {step: r.as_json() for step, r in back.items()} == {step: r.as_json() for step, r in results.items()
                                                              if step in NODE_STEPS}  # the reader judges the rest
    assert all(r.host == "gpu-a" for r in back.values())


def state_with(beat: datetime | None, kinds: tuple[str, ...] = tuple(CONDITIONS.values())) -> NodeLabelsState:
    conds = {kind: {"status": "True", "lastHeartbeatTime": api_time(beat) if beat else ""} for kind in kinds}
    return NodeLabelsState("node01", True, conditions=conds)


def test_results_that_are_missing_unreadable_or_stale_are_said_with_the_fix() -> None:
    data = record("node01", healthy(), {}, 30)
    assert record_problem("node01", "node01", "gpunode", data, state_with(NOW - timedelta(seconds=59)), NOW) is None
    stale = record_problem("node01", "node01", "gpunode", data, state_with(NOW - timedelta(seconds=61)), NOW)
    assert stale is not None and stale.code == "checker-stale" and "61 s ago, every 30 s expected" in stale.what
    assert "2026-12-03T20:58:59Z" in stale.evidence[0]
    assert "--field-selector spec.nodeName=node01" in stale.fix
    missing = record_problem("node01", "node01", "gpunode", None, state_with(NOW), NOW)
    assert missing is not None and missing.code == "checker-missing"
    assert missing.evidence == ["no ConfigMap gpunode/gpunode-node-node01"]
    unreadable = record_problem("node01", "node01", "gpunode", "key results.json is not JSON", state_with(NOW), NOW)
    assert unreadable is not None and unreadable.code == "checker-record-unreadable"
    no_condition = record_problem("node01", "node01", "gpunode", data, state_with(NOW, ("GPUDriverReady",)), NOW)
    assert no_condition is not None and "NvidiaRuntimeReady" in no_condition.what
    gone = record_problem("gpu-a", "node09", "gpunode", data, NodeLabelsState("node09", False), NOW)
    assert gone is not None and gone.code == "node-missing" and "k8s_node_name for gpu-a" in gone.fix


def test_results_are_stale_after_two_heartbeats_when_the_checker_writes_only_on_change() -> None:
    """A checker that writes its conditions once per heartbeat (300 s) is not stale after two intervals (60 s)."""
    data = record("node01", healthy(), {}, 60, 300)
    assert data["heartbeat_s"] == 300
    assert record_problem("node01", "node01", "gpunode", data, state_with(NOW - timedelta(seconds=590)), NOW) is None
    stale = record_problem("node01", "node01", "gpunode", data, state_with(NOW - timedelta(seconds=601)), NOW)
    assert stale is not None and "601 s ago, every 300 s expected" in stale.what
    older = {key: value for key, value in data.items() if key != "heartbeat_s"}  # a checker from before heartbeats
    assert record_problem("node01", "node01", "gpunode", older, state_with(NOW - timedelta(seconds=121)), NOW)


def test_the_checker_writes_its_conditions_on_a_change_or_a_due_heartbeat_and_its_record_on_a_new_verdict(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The API cost of a fleet whose chain holds: no write per check, one status patch per heartbeat."""
    from gpunode import node_checker
    from gpunode.cluster import node_status

    writes: list[str] = []
    monkeypatch.setattr(node_status, "patch_conditions", lambda settings, node, conds: writes.append("status"))
    monkeypatch.setattr(node_status, "apply_record", lambda *args: writes.append("record"))
    monkeypatch.setattr(node_status, "emit_event", lambda settings, node, ns, cond, *_: writes.append(cond["type"]))
    target = node_checker.local_target("node01", "/", {"kubeconfig": "/dev/null"})
    state = node_checker.CheckerState(conditions={}, record="")

    def check(results: dict[str, StepResult], seconds: int, force: bool = False) -> list[str]:
        writes.clear()
        node_checker.publish(target, "node01", results, {}, 60, state, NOW + timedelta(seconds=seconds),
                             heartbeat=300, force=force)
        return list(writes)

    assert check(healthy(), 0) == ["status", "record", *CONDITIONS.values()]  # the first: all new
    assert check(healthy(), 60) == check(healthy(), 240) == []  # nothing changed, the heartbeat not due
    assert check(healthy(), 299) == ["status"]  # due (a second's slack): the conditions' lastHeartbeatTime moves
    assert check(healthy(), 359) == []
    broken = {**healthy(), "runtime": StepResult("node01", "runtime", Verdict.FINDING, BROKEN.what, [BROKEN])}
    assert check(broken, 360) == ["status", "record", "NvidiaRuntimeReady"]  # a change: written at once
    assert check(broken, 420, force=True) == ["status"]  # --once
    worded = {**broken, "runtime": StepResult("node01", "runtime", Verdict.FINDING, "other words", [BROKEN])}
    assert check(worded, 480) == ["status", "record"]  # a new message: no Event (same status and reason)


def test_heartbeat_is_the_oldest_of_the_chains_conditions() -> None:
    conds = {kind: {"lastHeartbeatTime": api_time(NOW)} for kind in CONDITIONS.values()}
    conds["NvidiaRuntimeReady"] = {"lastHeartbeatTime": api_time(NOW - timedelta(seconds=90))}
    assert heartbeat(conds) == NOW - timedelta(seconds=90)
    del conds["GPUDriverReady"]
    assert heartbeat(conds) is None


@pytest.mark.parametrize("api_server", ["", "127.0.20.254:6443"])
def test_the_checker_daemonset_has_least_privilege_and_passes_schema_validation(api_server: str) -> None:
    import kubernetes_validate

    from gpunode.cluster.manifests import ManifestSettings, documents, render

    docs = documents(render(ManifestSettings(checker_image="registry.example/gpunode-node-checker:0.1.0",
                                             checker_interval=30, checker_api_server=api_server,
                                             pull_secret="gpunode-registry")))
    assert [d["kind"] for d in docs][-2:] == ["ServiceAccount", "DaemonSet"]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.33", strict=True)
    pod = docs[-1]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"] == {"runAsUser": 0, "readOnlyRootFilesystem": True,
                                            "allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"], "add": ["SYS_CHROOT"]}}
    assert {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]} == {
        "/host": True, "/etc/gpunode/node-settings": True, "/tmp": False}
    assert container["args"] == ["--interval=30", "--heartbeat=300", "--settings=/etc/gpunode/node-settings"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["imagePullSecrets"] == [{"name": "gpunode-registry"}]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert pod.get("hostNetwork", False) is bool(api_server)
    assert (env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")) == (
        ("127.0.20.254", "6443") if api_server else (None, None))
    without = documents(render(ManifestSettings()))
    assert "gpunode-node-checker" not in [d["metadata"]["name"] for d in without]


def test_the_checkers_rights_are_printed_with_gpunodes_own_and_limited_to_its_node() -> None:
    import yaml

    from gpunode.cluster.rbac import render

    docs = list(yaml.safe_load_all(render("gpunode-system")))
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    role = by_name[("ClusterRole", "gpunode-node-checker")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                             {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                             {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
                             # a DRA node's own slice, by name (NODE-gpu.gpunode.io): never a list
                             {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["get"]}]
    assert {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in
            by_name[("Role", "gpunode-node-checker")]["rules"]} == {
        ("", "configmaps"): ["get", "create", "patch"], ("apps", "daemonsets"): ["get"], ("", "pods/log"): ["get"],
        ("", "events"): ["list"]}
    assert by_name[("Role", "gpunode-node-checker")]["metadata"]["namespace"] == "gpunode-system"
    policy = by_name[("ValidatingAdmissionPolicy", "gpunode-node-checker-own-node")]
    assert "system:serviceaccount:gpunode-system:gpunode-node-checker" in \
        policy["spec"]["matchConditions"][0]["expression"]
    assert by_name[("ValidatingAdmissionPolicyBinding", "gpunode-node-checker-own-node")]["spec"][
        "validationActions"] == ["Deny"]


def test_each_nodes_settings_are_the_inventory_data_that_differ_from_the_defaults() -> None:
    import yaml

    from gpunode.cluster.manifests import node_settings_document
    from gpunode.steps.device_plugin import checker_settings
    from gpunode.verify.targets import Target

    hosts = [Target("node01", {"toolkit_version": "1.20.0-1", "containerd_systemd_cgroup": False}, []),
             Target("10.0.0.7", {"k8s_node_name": "gpu-b", "container_runtime": "docker"}, []),
             Target("bad", {"toolkit_version": 17}, []), Target("plain", {}, [])]
    per_node = checker_settings(hosts)
    assert per_node == {"node01": {"toolkit_version": "1.20.0-1", "containerd_systemd_cgroup": False},
                        "gpu-b": {"container_runtime": "docker"}, "plain": {}}
    document = node_settings_document("gpunode-system", per_node)
    assert document["metadata"]["name"] == "gpunode-node-settings"
    assert yaml.safe_load(document["data"]["node01.yaml"]) == per_node["node01"]
    assert sorted(document["data"]) == ["gpu-b.yaml", "node01.yaml", "plain.yaml"]


def test_the_checker_image_holds_gpunodes_package_with_its_templates_and_readme() -> None:
    from pathlib import Path

    from gpunode.image.build import CHECKER, source_files

    root = Path(__file__).parents[1]
    names = {str(p.relative_to(root)) for p in source_files(root, CHECKER)}
    assert {"pyproject.toml", "README.md", "src/gpunode/cli.py", "src/gpunode/templates/node-checker.yaml.j2",
            "src/gpunode/templates/device-plugin.yaml.j2", "src/gpunode/node_checker.py"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert CHECKER.entrypoint[-4:] == ("gpunode.cli", "node-check", "--root", "/host")


def test_a_host_root_the_checker_cannot_enter_fails_the_driver_link_with_the_fix(tmp_path) -> None:
    from gpunode import node_checker

    target = node_checker.local_target("node01", str(tmp_path / "no-such-root"), {})
    assert target.name == f"@chroot/{tmp_path / 'no-such-root'}" and target.data["kubeconfig"] == "in-cluster"
    results, facts = node_checker.judge_own(target)
    driver = results["driver"]
    assert driver.state is Verdict.FINDING and facts == {}
    assert driver.reason.startswith(f"cannot read the host's root at {tmp_path / 'no-such-root'}: ")
    assert "SYS_CHROOT" in driver.findings[0].fix
    assert all(results[step].state is Verdict.NOT_CHECKED for step in NODE_STEPS[1:])
    assert node_checker.local_target("node01", "/", {}).name == "@local"


def test_the_checkers_view_reads_its_own_node_never_a_list_of_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per check on every node, a list of all nodes or all plugin pods would cost the API the square of the
    fleet: the checker reads its Node, the plugin's DaemonSet and the pods bound to it, each once."""
    from gpunode.facts.device_plugin import RolloutState
    from gpunode.host_settings import HostSettings
    from gpunode.verify import checks, own_node

    reads: list[str] = []

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cluster-wide list")

    monkeypatch.setattr(checks, "read_nodes", forbidden)
    monkeypatch.setattr(checks, "read_plugin_pods", forbidden)
    monkeypatch.setattr(checks, "read_foreign", forbidden)
    monkeypatch.setattr(checks, "read_node_warnings", forbidden)
    monkeypatch.setattr(checks, "read_rollout", lambda settings, ns: reads.append(f"rollout {ns}") or RolloutState(
        True, generation=1, observed=1, desired=1, ready=1, updated=1))
    monkeypatch.setattr(own_node, "read_node", lambda settings, name: reads.append(f"node {name}") or NodeLabelsState(
        name, True, {"nvidia.com/gpu.present": "true"}, allocatable={"nvidia.com/gpu": "1"}))
    monkeypatch.setattr(own_node, "read_foreign_on", lambda settings, name: reads.append(f"pods on {name}") or [])
    monkeypatch.setattr(own_node, "read_plugin_pod_on",
                        lambda settings, ns, name: reads.append(f"plugin pod on {name}") or None)
    view = own_node.OwnNodeView("node01")
    gpus = [{"index": 0, "name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "driver_version": "550.54.15",
             "compute_cap": "8.0", "mig_mode": None, "uuid": "GPU-1", "pci_bus_id": "00000000:07:00.0"}]
    results = view.judge("node01", HostSettings.from_data({}), {"driver": {"nvidia_smi": {"gpus": gpus}},
                                                                "hostname": "node01"}, True)
    assert set(results) == {"labels", "device_plugin"}
    assert sorted(reads) == ["node node01", "plugin pod on node01", "pods on node01", "rollout gpunode-system"]


def test_the_checkers_settings_are_read_from_its_nodes_file_and_bad_ones_are_named(tmp_path) -> None:
    from gpunode.errors import GpunodeError
    from gpunode.node_checker import node_settings

    folder = tmp_path / "node-settings"
    folder.mkdir()
    (folder / "node01.yaml").write_text("toolkit_version: 1.17.8-1\ncontainer_runtime: docker\n")
    (folder / "node02.yaml").write_text("- not a mapping\n")
    (folder / "node03.yaml").write_text("toolkit_version: [unclosed\n")
    assert node_settings(str(folder), "node01") == ({"toolkit_version": "1.17.8-1", "container_runtime": "docker"},
                                                    None)
    assert node_settings(str(folder), "node09") == ({}, f"node node09: no {folder / 'node09.yaml'}: the "
                                                        "inventory's defaults are expected")
    assert node_settings(None, "node01") == ({}, None)
    with pytest.raises(GpunodeError, match=r"node02.yaml is not a mapping"):
        node_settings(str(folder), "node02")
    with pytest.raises(GpunodeError, match=r"node03.yaml cannot be read: "):
        node_settings(str(folder), "node03")


def test_the_checker_takes_its_settings_anew_for_every_check_and_says_when_it_cannot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A deploy that changes the expected toolkit version updates the settings ConfigMap in place: the next check
    judges against it, without a restart of the checker's pod. Settings it cannot read are said; the loop goes on."""
    import signal

    from gpunode import node_checker
    from gpunode.errors import GpunodeError
    from gpunode.verify.targets import Target

    versions = iter(["1.17.8-1", "1.18.0-1", None])
    checked: list[str] = []
    said: list[str] = []

    def target_of() -> Target:
        version = next(versions)
        if version is None:
            raise GpunodeError("--settings /etc/gpunode/node-settings/node01.yaml is not a mapping", "give a mapping")
        return node_checker.local_target("node01", "/host", {"toolkit_version": version})

    def check_once(target: Target, node: str, interval: float, state: node_checker.CheckerState,
                   heartbeat: float = 0) -> list[dict]:
        checked.append(target.data["toolkit_version"])
        return []

    def say(line: str) -> None:
        said.append(line)
        if len(said) == 3:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(node_checker, "check_once", check_once)
    previous = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    try:
        node_checker.run(target_of, "node01", 0.01, say)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    assert checked == ["1.17.8-1", "1.18.0-1"]
    assert said == ["node node01 checked: no change", "node node01 checked: no change",
                    "node node01: not checked: --settings /etc/gpunode/node-settings/node01.yaml is not a mapping "
                    "(fix: give a mapping)"]
