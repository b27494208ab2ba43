"""The ``gpunode`` command line."""

from __future__ import annotations

import sys

import click

from gpunode import __version__
from gpunode.errors import GpunodeError


class LazyGroup(click.Group):
    """Loads a subcommand's module only when it is used (the simulator is not imported otherwise)."""

    lazy = {"sim": ("gpunode.sim.cli", "sim")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module_name, attribute = self.lazy[name]
            module = __import__(module_name, fromlist=[attribute])
            return getattr(module, attribute)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpunode")
def cli() -> None:
    """Take NVIDIA GPU machines to Kubernetes nodes whose pods get working GPUs.

    \b
    Examples:
      gpunode sim up                 # three simulated GPU nodes on this machine
      gpunode sim ssh node01 nvidia-smi -L
      pyinfra inventories/sim.py exec -- nvidia-smi -L
      gpunode sim down
    """


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except GpunodeError as error:
        click.echo(f"gpunode: {error}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("gpunode: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)


if __name__ == "__main__":
    main()
