"""The command line's help works with the core package alone (the simulator's extra not installed)."""

from __future__ import annotations

import importlib.util

import pytest
from click.testing import CliRunner

from gpunode.cli import cli


@pytest.fixture
def core_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a venv with only the core wheel: the plugin package (needed by 'sim') cannot be found."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name.split(".")[0] == "gpunode_plugin" else real(name, *args))


@pytest.mark.parametrize("args", [["--help"], ["-h"], []])
def test_help_lists_every_command_and_what_sim_needs(core_only: None, args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code in ((0,) if args else (0, 2)), result.output
    assert "Usage: " in result.output and "verify" in result.output and "doctor" in result.output
    sim = next(line for line in result.output.splitlines() if line.strip().startswith("sim "))
    assert "not installed: needs gpunode_plugin; pip install 'gpunode[sim]'" in " ".join(result.output.split()), sim


@pytest.mark.parametrize("args", [["sim", "up"], ["sim", "--help"]])
def test_sim_without_its_extra_says_what_to_install(core_only: None, args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    if args[-1] == "--help":
        assert result.exit_code == 0 and "pip install 'gpunode[sim]'" in " ".join(result.output.split())
    else:
        assert result.exit_code == 1
        assert "gpunode sim needs the gpunode_plugin package, which is not installed: pip install 'gpunode[sim]'" \
            in result.output


def test_every_subcommand_help_works(core_only: None) -> None:
    for name in cli.list_commands(None):  # type: ignore[arg-type]
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0 and "Usage: " in result.output, (name, result.output)
