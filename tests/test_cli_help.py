"""The command line's help works with the core package alone (the simulator's extra not installed)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from gpunode import cli as cli_module
from gpunode.cli import cli


@pytest.fixture
def core_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a venv with only the core wheel: no distribution adds a command group (gpunode-sim is absent)."""
    monkeypatch.setattr(cli_module.PluggedGroup, "plugged", staticmethod(lambda: {}))


@pytest.mark.parametrize("args", [["--help"], ["-h"], []])
def test_help_lists_every_command_and_what_sim_needs(core_only: None, args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code in ((0,) if args else (0, 2)), result.output
    assert "Usage: " in result.output and "verify" in result.output and "doctor" in result.output
    sim = next(line for line in result.output.splitlines() if line.strip().startswith("sim "))
    assert "not installed: needs gpunode-sim; pip install 'gpunode[sim]'" in " ".join(result.output.split()), sim


@pytest.mark.parametrize("args", [["sim", "up"], ["sim", "--help"]])
def test_sim_without_its_extra_says_what_to_install(core_only: None, args: list[str]) -> None:
    result = CliRunner().invoke(cli, args)
    if args[-1] == "--help":
        assert result.exit_code == 0 and "pip install 'gpunode[sim]'" in " ".join(result.output.split())
    else:
        assert result.exit_code == 1
        assert "gpunode sim needs the gpunode-sim package, which is not installed: pip install 'gpunode[sim]'" \
            in result.output


def test_every_subcommand_help_works(core_only: None) -> None:
    for name in cli.list_commands(None):  # type: ignore[arg-type]
        result = CliRunner().invoke(cli, [name, "--help"])
        assert result.exit_code == 0 and "Usage: " in result.output, (name, result.output)


def test_the_simulator_plugs_its_command_group_in_through_an_entry_point() -> None:
    """Installed (as setup-host does), gpunode-sim's 'sim' group is found by entry point, not hard-wired."""
    entry = cli_module.PluggedGroup.plugged()["sim"]
    assert entry.value == "gpunode_sim.cli:sim"
    result = CliRunner().invoke(cli, ["sim", "--help"])
    assert result.exit_code == 0 and "simulated GPU nodes" in result.output
