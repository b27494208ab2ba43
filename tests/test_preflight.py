"""gpunode check, judged from replies: each line ok with its proof, a problem with its fix, or not checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpunode.cluster.client import ClusterSettings
from gpunode.cluster.rbac import Rule
from gpunode.connection import Reply, Unreachable
from gpunode.errors import GpunodeError
from gpunode.preflight import (
    FINDING,
    NOT_CHECKED,
    OK,
    PROBE_MARK,
    Preflight,
    check_cluster,
    check_plugin_image,
    judge_host,
    probe_script,
    render,
)
from gpunode.verify.targets import Target

DEBIAN = {"uid": "0", "os": "debian 12", "like": "", "apt-get": "/usr/bin/apt-get", "dnf": "",
          "containerd": "/usr/bin/containerd", "dockerd": "", "curl": "/usr/bin/curl", "arch": "amd64",
          "key_url": "", "index": "http://127.0.0.1:8080/stable/deb/amd64/InRelease", "index_url": ""}


def reply(**changes: str) -> Reply:
    found = {**DEBIAN, **changes}
    return Reply(True, "".join(f"{PROBE_MARK}{key}={value}\n" for key, value in found.items()), "")


def judged(answer: Reply | Unreachable, **data: object) -> dict[str, tuple[str, str, str]]:
    report = Preflight()
    judge_host(report, Target("gpu-1", dict(data), []), answer)
    return {c.name: (c.state, c.detail, c.fix) for c in report.checks}


def test_a_ready_debian_host_is_ok_with_what_proved_each_line() -> None:
    lines = judged(reply())
    assert {name: state for name, (state, _, _) in lines.items()} == {
        "ssh": OK, "sudo": OK, "os": OK, "container runtime": OK, "toolkit repository": OK}
    assert "id -u printed 0" in lines["sudo"][1]
    assert "/etc/os-release: debian 12" in lines["os"][1]
    assert "container_runtime = auto: containerd (/usr/bin/containerd)" == lines["container runtime"][1]
    assert "/stable/deb/amd64/InRelease" in lines["toolkit repository"][1]


@pytest.mark.parametrize(("changes", "data", "name", "words"), [
    ({"uid": "1000"}, {}, "sudo", "commands run as uid 1000, not root"),
    ({"apt-get": ""}, {}, "os", "neither apt-get nor dnf found"),
    ({"containerd": ""}, {}, "container runtime", "neither containerd nor dockerd is installed on gpu-1"),
    ({}, {"container_runtime": "docker"}, "container runtime", "container_runtime = docker but dockerd is not "
                                                               "installed on gpu-1"),
    ({"curl": ""}, {}, "toolkit repository", "curl is not installed on gpu-1"),
    ({"index_url": "curl: (22) The requested URL returned error: 404"}, {}, "toolkit repository",
     "gpu-1 cannot download http://127.0.0.1:8080/stable/deb/amd64/InRelease: curl: (22) The requested URL "
     "returned error: 404"),
    ({"key_url": "curl: (6) Could not resolve host: nvidia.github.io"}, {}, "toolkit repository",
     "gpu-1 cannot download https://nvidia.github.io/libnvidia-container/gpgkey: curl: (6) Could not resolve host"),
])
def test_each_host_problem_is_named_with_its_fix(changes: dict, data: dict, name: str, words: str) -> None:
    state, detail, fix = judged(reply(**changes), **data)[name]
    assert state == FINDING and words in detail and fix, (detail, fix)


def test_an_unreachable_host_is_one_line_and_sudo_refused_is_sudo() -> None:
    lines = judged(Unreachable("cannot reach gpu-1: timed out", "check SSH", "unreachable"))
    assert list(lines) == ["ssh"] and lines["ssh"][0] == FINDING
    lines = judged(Unreachable("sudo refused for user sre on host gpu-1: sudo: a password is required",
                               "give _sudo_password", "sudo-refused"))
    assert list(lines) == ["sudo"] and "a password is required" in lines["sudo"][1]


def test_the_probe_reads_the_repository_the_host_would_use() -> None:
    script = probe_script(Target("h", {"toolkit_repository_url": "http://mirror.example/deb/$(ARCH)"}, []).settings)
    assert "'http://mirror.example/deb/$(ARCH)'" in script and "/InRelease" in script
    assert "/repodata/repomd.xml" in script


def cluster(tmp_path: Path) -> ClusterSettings:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    return ClusterSettings(kubeconfig=str(kubeconfig))


def test_every_permission_is_asked_and_the_denied_ones_are_named(tmp_path: Path) -> None:
    asked: list[tuple[str, str, str | None]] = []

    def review(rule: Rule, verb: str, namespace: str | None) -> bool:
        asked.append((rule.resource, verb, namespace))
        return not (rule.resource == "pods/eviction" or (rule.resource == "daemonsets" and verb == "patch"))

    report = Preflight()
    check_cluster(report, cluster(tmp_path), "gpunode-system", review)
    lines = {c.name: c for c in report.checks}
    assert lines["api"].state == OK
    assert ("pods/eviction", "create", None) in asked and ("daemonsets", "patch", "gpunode-system") in asked
    assert lines["permissions"].state == FINDING
    assert "2 of" in lines["permissions"].detail
    assert "create pods/eviction, patch daemonsets in gpunode-system" in lines["permissions"].detail
    assert "--rbac" in lines["permissions"].fix


def test_no_kubeconfig_and_a_dead_api_are_problems_and_permissions_not_checked(tmp_path: Path) -> None:
    from gpunode.errors import GpunodeError

    report = Preflight()
    check_cluster(report, ClusterSettings(kubeconfig=str(tmp_path / "missing")), "ns")
    assert [(c.name, c.state) for c in report.checks] == [("kubeconfig", FINDING), ("permissions", NOT_CHECKED)]

    def down(rule: Rule, verb: str, namespace: str | None) -> bool:
        raise GpunodeError("ask the API: cannot reach the Kubernetes API at https://127.0.0.1:6443", "start it")

    report = Preflight()
    check_cluster(report, cluster(tmp_path), "ns", down)
    assert [(c.name, c.state) for c in report.checks] == [("api", FINDING), ("permissions", NOT_CHECKED)]
    assert not report.ready and "not ready: 1 finding(s)" in render(report)


@pytest.mark.parametrize(("image", "answer", "state", "words"), [
    ("gpunode-device-plugin:0.1.0", None, FINDING, "names no registry"),
    ("registry.example/gpu/plugin:1", "sha256:" + "0" * 64, OK, "the registry has it: sha256:000"),
    ("registry.example/gpu/plugin:1", GpunodeError("reading registry.example/gpu/plugin:1 from its registry failed: "
                                                   "reading manifest 1 in registry.example/gpu/plugin: manifest "
                                                   "unknown: manifest unknown", "push it"),
     FINDING, "manifest unknown"),
    ("registry.example/gpu/plugin:1", GpunodeError("reading registry.example/gpu/plugin:1 from its registry failed: "
                                                   "dial tcp: lookup registry.example: no such host"),
     NOT_CHECKED, "cannot be read from this machine"),
])
def test_the_plugin_image_is_checked_in_its_registry(monkeypatch: pytest.MonkeyPatch, image: str,
                                                      answer: object, state: str, words: str) -> None:
    def resolve(reference: str, registry: object) -> str:
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    monkeypatch.setattr("gpunode.image.push.resolve", resolve)
    report = Preflight()
    check_plugin_image(report, image, {})
    [line] = report.checks
    assert (line.subject, line.name, line.state) == ("plugin image", image, state) and words in line.detail
    assert line.fix or state != FINDING


def test_the_node_checker_image_is_checked_as_the_plugins_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpunode.image.push.resolve", lambda reference, registry: "sha256:" + "c" * 64)
    report = Preflight()
    check_plugin_image(report, "gpunode-node-checker:0.1.0", {}, "checker_image")
    check_plugin_image(report, "registry.internal/gpu/checker:0.1.0", {}, "checker_image")
    unnamed, there = report.checks
    assert (unnamed.subject, unnamed.state) == ("node checker image", FINDING)
    assert unnamed.detail.startswith("checker_image gpunode-node-checker:0.1.0 names no registry")
    assert "gpunode image build --node-checker" in unnamed.fix
    assert (there.state, there.detail) == (OK, "the registry has it: sha256:" + "c" * 64)


def test_a_link_not_checked_is_said_and_does_not_stop_a_deploy_by_itself() -> None:
    report = Preflight()
    report.add("node01", "ssh", OK, "answered")
    report.add("plugin image", "registry.internal/gpu/plugin:1", NOT_CHECKED,
               "its registry cannot be read from this machine: no such host")
    assert report.ready
    assert render(report).splitlines()[-1] == "ready for a deploy; 1 not checked from here (above, with why)"
    report.add("node02", "ssh", FINDING, "cannot reach node02", "check SSH")
    assert not report.ready and render(report).splitlines()[-1].startswith("not ready: 1 finding(s); 1 not checked")
