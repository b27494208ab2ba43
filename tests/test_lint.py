"""gpunode lint: GPU resource specs in the API server's words, with file:line and the corrected snippet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpunode.lint import lint_text, resource_errors

DATA = Path(__file__).parent / "data" / "lint"


@pytest.mark.parametrize(("resources", "expected"), [
    ({"limits": {"nvidia.com/gpu": 1}}, []),
    ({"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": 2}}, []),
    ({"requests": {"nvidia.com/gpu": 1}},
     ["spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources"]),
    # 1.37's validateResourceRequirements reports an unequal request on the requests path itself, with the limit
    ({"requests": {"nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": 1}},
     ['spec.containers[0].resources.requests: Invalid value: "2": must be equal to nvidia.com/gpu limit of 1']),
    # quantities compare as quantities: the API server accepts these
    ({"limits": {"nvidia.com/gpu": "1.0"}}, []),
    ({"limits": {"nvidia.com/gpu": "1000m"}, "requests": {"nvidia.com/gpu": 1}}, []),
    ({"limits": {"nvidia.com/gpu": 0}}, []),
    ({"limits": {"nvidia.com/gpu": -1}},
     ['spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "-1": must be greater than or equal to 0',
      'spec.containers[0].resources.requests[nvidia.com/gpu]: Invalid value: "-1": must be greater than or equal to '
      "0"]),
    ({"limits": {"nvidia.com/gpu": "1.5"}},
     ['spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "1500m": must be an integer',
      'spec.containers[0].resources.requests[nvidia.com/gpu]: Invalid value: "1500m": must be an integer']),
    ({"limits": {"nvidia.com/gpu": "500m"}},  # the real API server's words (tests/test_whole_chain.py asks it)
     ['spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "500m": must be an integer',
      'spec.containers[0].resources.requests[nvidia.com/gpu]: Invalid value: "500m": must be an integer']),
    ({"limits": {"nvidia.com/mig-1g.10gb": 0.5}, "requests": {"nvidia.com/mig-1g.10gb": 0.5}},
     ['spec.containers[0].resources.limits[nvidia.com/mig-1g.10gb]: Invalid value: "500m": must be an integer',
      'spec.containers[0].resources.requests[nvidia.com/mig-1g.10gb]: Invalid value: "500m": must be an integer']),
    ({"requests": {"cpu": "500m"}}, []),
])
def test_resource_validation_uses_the_api_servers_messages(resources: dict, expected: list[str]) -> None:
    spec = {"containers": [{"name": "c", "resources": resources}]}
    assert [str(e) for e in resource_errors(spec)] == expected


def test_findings_point_at_the_line_and_give_the_corrected_snippet() -> None:
    findings = lint_text((DATA / "bad.yaml").read_text(), "bad.yaml")
    assert [(f.line, f.what.split(":")[0]) for f in findings] == [
        (10, 'Pod "trainer" is invalid'), (6, 'Pod "trainer" asks for GPUs but has no runtimeClassName'),
        (29, 'CronJob "nightly" is invalid'), (36, 'CronJob "nightly" is invalid')]
    snippet = yaml.safe_load(findings[0].fix.split("\n", 1)[1])
    assert snippet == {"resources": {"limits": {"nvidia.com/gpu": 1}}}
    assert "spec.jobTemplate.spec.template.spec.containers[1]" in findings[3].what
    assert yaml.safe_load(findings[3].fix.split("\n", 1)[1]) == {"resources": {"limits": {"nvidia.com/gpu": 1}}}


def test_runtime_class_is_not_required_when_nvidia_is_the_default() -> None:
    findings = lint_text((DATA / "bad.yaml").read_text(), "bad.yaml", nvidia_default=True)
    assert not any("runtimeClassName" in f.what for f in findings) and len(findings) == 3


def lint(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpunode.cli", "lint", *args], input=stdin, capture_output=True,
                          text=True, timeout=60, check=False)


def test_exit_codes_gate_ci() -> None:
    assert lint(str(DATA / "good.yaml")).returncode == 0
    bad = lint(str(DATA))
    assert bad.returncode == 1 and "4 finding(s)" in bad.stdout and "bad.yaml:10:" in bad.stdout
    piped = lint("-", stdin=(DATA / "bad.yaml").read_text())
    assert piped.returncode == 1 and "<stdin>:29:" in piped.stdout
    broken = lint("-", stdin="kind: Pod\nspec: [unclosed\n")
    assert broken.returncode == 2 and "<stdin>:" in broken.stderr and "not valid YAML" in broken.stderr
    missing = lint("/nonexistent/manifests")
    assert missing.returncode == 2 and "no such file or directory" in missing.stderr


def test_gpus_of_init_containers_and_typos_are_seen() -> None:
    text = """apiVersion: v1
kind: Pod
metadata: {name: warmup}
spec:
  initContainers:
    - name: prefetch
      resources: {limits: {nvidia.com/gpu: 1}}
  containers:
    - name: main
      resources: {limits: {nvidia.com/gpus: 8}}
"""
    findings = lint_text(text, "pod.yaml")
    assert [(f.level, f.line) for f in findings] == [("warning", 10), ("error", 5)]
    assert "asks for nvidia.com/gpus, which no device plugin offers under that name" in findings[0].what
    assert findings[0].fix == "ask for nvidia.com/gpu"
    assert "has no runtimeClassName" in findings[1].what  # the init container's GPU counts


def test_a_file_that_does_not_parse_is_named_and_the_others_are_still_linted(tmp_path: Path) -> None:
    (tmp_path / "a-broken.yaml").write_text("kind: Pod\nspec: [unclosed\n")
    (tmp_path / "b-bad.yaml").write_text((DATA / "bad.yaml").read_text())
    result = lint(str(tmp_path))
    assert result.returncode == 2
    assert "a-broken.yaml:" in result.stderr and "not valid YAML" in result.stderr
    assert "b-bad.yaml:10:" in result.stdout and "4 finding(s)" in result.stdout


def test_json_and_github_formats_and_warnings_pass_unless_strict(tmp_path: Path) -> None:
    import json

    typo = tmp_path / "typo.yaml"
    typo.write_text("kind: Pod\nmetadata: {name: p}\nspec:\n  runtimeClassName: nvidia\n  containers:\n"
                    "    - name: c\n      resources: {limits: {nvidia.com/gpus: 1}}\n")
    assert lint(str(typo)).returncode == 0
    assert lint(str(typo), "--strict").returncode == 1
    found = json.loads(lint(str(typo), "--format", "json").stdout)["findings"]
    assert [(f["file"], f["line"], f["level"]) for f in found] == [(str(typo), 7, "warning")]
    github = lint(str(DATA / "bad.yaml"), "--format", "github").stdout.splitlines()
    assert github[0].startswith(f"::error file={DATA / 'bad.yaml'},line=10::Pod \"trainer\" is invalid")
