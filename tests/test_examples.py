"""The example CI workflow runs commands that exist and parse."""

from __future__ import annotations

import shlex
from importlib.metadata import version
from pathlib import Path

import click
import pytest
import yaml

from gpunode.cli import cli

WORKFLOW = Path(__file__).resolve().parents[1] / "examples" / "ci" / "gpu-nodes.yml"


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def gpunode_commands(job: str | None = None) -> list[list[str]]:
    jobs = workflow()["jobs"]
    commands = []
    for name in [job] if job else list(jobs):
        for step in jobs[name]["steps"]:
            for line in step.get("run", "").splitlines():
                words = shlex.split(line.split("||")[0])
                if words and words[0] == "gpunode":
                    commands.append(words[1:])
    return commands


def flags(commands: list[list[str]]) -> list[str]:
    return [" ".join(c[:1] + [a for a in c if a.startswith("--")]) for c in commands]


def test_pull_requests_get_the_preflight_and_a_plan_and_only_the_default_branch_applies_after_approval() -> None:
    assert flags(gpunode_commands("plan")) == ["check", "deploy --dry --report"]
    assert flags(gpunode_commands("apply")) == ["deploy --report", "verify --junit-xml --json --html"]
    jobs = workflow()["jobs"]
    assert jobs["apply"]["needs"] == "plan" and jobs["apply"]["environment"]
    assert "github.event.repository.default_branch" in jobs["apply"]["if"]
    assert "pull_request" in workflow()[True]  # yaml reads the key 'on' as True


def test_the_drift_plan_fails_on_could_not_tell_and_only_accepts_drift() -> None:
    plan = next(step["run"] for step in workflow()["jobs"]["plan"]["steps"] if "--dry" in step.get("run", ""))
    assert 'if [ "$code" -eq 1 ]; then exit 1; fi' in plan
    assert "|| test $? -eq 2" not in plan


def test_gpunode_is_installed_pinned() -> None:
    installs = [step["run"] for job in workflow()["jobs"].values() for step in job["steps"]
                if "pip install" in step.get("run", "")]
    assert installs and all('"gpunode==${GPUNODE_VERSION}"' in run for run in installs)
    assert workflow()["env"]["GPUNODE_VERSION"] == version("gpunode")


@pytest.mark.parametrize("args", gpunode_commands(), ids=lambda a: " ".join(a[:2]))
def test_each_gpunode_command_parses(args: list[str]) -> None:
    command = cli.get_command(click.Context(cli), args[0])
    assert command is not None, f"gpunode has no command {args[0]}"
    context = command.make_context(args[0], list(args[1:]))
    assert context.params["inventory"] == "inventories/prod.py"
    assert Path(__file__).resolve().parents[1].joinpath(context.params["inventory"]).is_file()
