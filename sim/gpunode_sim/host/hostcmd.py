"""Running host commands for the simulator, with failures that say what broke."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence

from gpunode.errors import GpunodeError


def run(argv: Sequence[str], *, what: str, env: Mapping[str, str] | None = None,
        input_text: str | None = None, cwd: str | None = None, timeout: float = 600) -> str:
    """Run ``argv``; return stdout, or raise naming ``what`` failed with the command's own error."""
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, env=dict(env) if env else None,
                                input=input_text, cwd=cwd, timeout=timeout, check=False)
    except FileNotFoundError as error:
        raise GpunodeError(f"{what}: {argv[0]} is not installed") from error
    except subprocess.TimeoutExpired as error:
        raise GpunodeError(f"{what}: {argv[0]} did not finish within {timeout:.0f} s") from error
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise GpunodeError(f"{what} failed (exit {result.returncode}): {' '.join(argv)}\n{tail}")
    return result.stdout
