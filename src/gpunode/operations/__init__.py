"""gpunode's pyinfra operations, one module per provisioning step."""

from __future__ import annotations

import shlex


def failing_command(message: str) -> str:
    """A command that fails the host with ``message`` when it runs.

    Operations yield this rather than raising, so a broken host fails at execution
    (the others go on) and a dry run reports it as drift instead of aborting.
    """
    return f"printf '%s\\n' {shlex.quote('gpunode: ' + message)} >&2; exit 1"
