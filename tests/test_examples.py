"""The example CI workflow runs commands that exist and parse."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest
import yaml

from gpunode.cli import cli

WORKFLOW = Path(__file__).resolve().parents[1] / "examples" / "ci" / "gpu-nodes.yml"


def gpunode_commands() -> list[list[str]]:
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["bootstrap-and-verify"]["steps"]
    commands = []
    for step in steps:
        for line in step.get("run", "").splitlines():
            words = shlex.split(line.split("||")[0])
            if words and words[0] == "gpunode":
                commands.append(words[1:])
    return commands


def test_workflow_runs_deploy_dry_deploy_and_verify() -> None:
    names = [" ".join(c[:1] + [a for a in c if a.startswith("--")]) for c in gpunode_commands()]
    assert names == ["deploy --dry --report", "deploy --report", "verify --junit-xml --json --html"]


@pytest.mark.parametrize("args", gpunode_commands(), ids=lambda a: " ".join(a[:2]))
def test_each_gpunode_command_parses(args: list[str]) -> None:
    command = cli.get_command(click.Context(cli), args[0])
    assert command is not None, f"gpunode has no command {args[0]}"
    context = command.make_context(args[0], list(args[1:]))
    assert context.params["inventory"] == "inventories/prod.py"
    assert Path(__file__).resolve().parents[1].joinpath(context.params["inventory"]).is_file()
