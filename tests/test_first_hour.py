"""The first hour on a real fleet, without a fleet: dead hosts, no cluster, bad data, an inventory that breaks.

The host is a loopback port nothing listens on (connection refused at once); the kubeconfig does not exist.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import gpunode


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "dead.py"
    path.write_text(
        'gpu_nodes = [("dead-node", {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "ssh_user": "sre", "_sudo": True,\n'
        f'                            "ssh_connect_retries": 0, "kubeconfig": "{tmp_path}/no-kubeconfig"}})]\n')
    return path


def env() -> dict[str, str]:
    return {**os.environ, "HOME": os.environ.get("HOME", "/root")}


def test_verify_prints_one_line_for_an_unreachable_host(inventory: Path, tmp_path: Path) -> None:
    result = gpunode("verify", str(inventory), "--json", str(tmp_path / "v.json"), "--junit-xml",
                     str(tmp_path / "v.xml"), env=env(), check=False)
    assert result.returncode == 1
    failures = [line for line in result.stdout.splitlines() if line.startswith("FINDING ")]
    assert failures == ["FINDING dead-node driver: cannot reach dead-node: Could not connect ([Errno None] Unable to "
                        "connect to port 1 on 127.0.0.1)"], result.stdout + result.stderr[-3000:]
    assert len(result.stdout) < 800, result.stdout  # was 39 KB: testinfra's repr once per step
    steps = json.loads((tmp_path / "v.json").read_text())["hosts"]["dead-node"]
    assert [s["state"] for s in steps.values()] == ["finding"] + ["not checked"] * 5
    assert (tmp_path / "v.xml").read_text().count("<failure") == 1


def test_doctor_names_the_dead_host_and_the_missing_cluster_once_each(inventory: Path, tmp_path: Path) -> None:
    result = gpunode("doctor", str(inventory), "--json", env=env(), check=False)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    problems = {p["subject"]: p for p in report["problems"]}
    assert set(problems) == {"dead-node", "cluster"}
    assert problems["dead-node"]["code"] == "unreachable"
    assert problems["dead-node"]["evidence"] == ["ssh sre@127.0.0.1:1: Could not connect ([Errno None] Unable to "
                                                 "connect to port 1 on 127.0.0.1)"]
    assert problems["cluster"]["link"] == "api" and problems["cluster"]["what"].startswith("no kubeconfig at ")
    assert len(result.stdout) < 3000


def test_doctor_json_is_json_even_for_a_configuration_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text('hosts = ["a"]\nport = undefined_name\n')
    result = gpunode("doctor", str(broken), "--json", env=env(), check=False)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["error"] == (f"inventory {broken} does not load: {broken}, line 2: NameError: name "
                               "'undefined_name' is not defined")


def test_an_inventory_that_does_not_load_is_one_line_with_file_and_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text('hosts = ["a"]\nx = 1 +\n')
    for command in ("verify", "check", "deploy"):
        result = gpunode(command, str(broken), env=env(), check=False)
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        assert f"{broken}, line 2: SyntaxError: invalid syntax" in output, output
        assert "Traceback" not in output


def test_check_stops_at_a_typo_before_connecting(inventory: Path) -> None:
    result = gpunode("check", str(inventory), "--data", "toolkit_verison=1.17.8-1", "--json", env=env(),
                     check=False)
    assert result.returncode == 1
    checks = json.loads(result.stdout)["checks"]
    typo = next(c for c in checks if c["name"] == "data toolkit_verison")
    assert typo["fix"] == "did you mean 'toolkit_version'?"
    assert not [c for c in checks if c["subject"] == "dead-node"]  # nothing connected
    assert checks[-1] == {"subject": "hosts", "name": "reachable", "state": "not checked",
                          "detail": "the inventory data has problems: fix them first", "fix": ""}


def test_check_names_the_dead_host_and_the_missing_kubeconfig(inventory: Path) -> None:
    result = gpunode("check", str(inventory), env=env(), check=False)
    assert result.returncode == 1
    assert "FINDING      dead-node: ssh: cannot reach dead-node: Could not connect" in result.stdout
    assert "FINDING      cluster " in result.stdout and "kubeconfig: no kubeconfig at" in result.stdout


def test_deploy_refuses_bad_data_before_connecting(inventory: Path) -> None:
    result = gpunode("deploy", str(inventory), "--data", "rollout_timeout=abc", "--data", "cluster_steps=nope",
                     env=env(), check=False)
    assert result.returncode == 1
    assert "the inventory data has problems, nothing was changed" in result.stderr
    assert "cluster_steps = 'nope' is not accepted: expected true or false" in result.stderr
    assert "rollout_timeout = 'abc' is not accepted: expected a whole number" in result.stderr
    assert "Traceback" not in result.stderr


def test_deploy_dry_against_no_cluster_cannot_tell(inventory: Path) -> None:
    """A dead host in a dry run: exit 1 (could not tell), never 2 (drift)."""
    result = gpunode("deploy", str(inventory), "--dry", "--report", "/dev/null", env=env(), check=False)
    assert result.returncode == 1, result.stdout + result.stderr


def test_a_verification_that_writes_no_results_says_so(inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: exit 1 with nothing printed at all (the inner test run's own output is off)."""
    from gpunode.errors import GpunodeError
    from gpunode.verify import run

    monkeypatch.setattr(run, "load_inventory", lambda *args: None)  # in-process pyinfra state is the suites' own
    monkeypatch.setattr(pytest, "main", lambda args, plugins=(): pytest.ExitCode.INTERNAL_ERROR)
    with pytest.raises(GpunodeError) as caught:  # the suites run under pytest for a JUnit report
        run.verify(str(inventory), [], str(inventory.parent / "verify.xml"), None, None)
    assert caught.value.problem == ("the verification did not finish: its test run exited 3 (INTERNAL_ERROR) and "
                                    "wrote no results")
    assert "--pyargs gpunode.verify.suites" in (caught.value.fix or "")
