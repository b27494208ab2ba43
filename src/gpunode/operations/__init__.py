"""gpunode's pyinfra operations, one module per provisioning step."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from functools import wraps

from pyinfra import logger
from pyinfra.api import FunctionCommand, Host, State

from gpunode.errors import GpunodeError


def failing_command(message: str) -> str:
    """A command that fails the host with ``message`` when it runs.

    Operations yield this rather than raising, so a broken host fails at execution
    (the others go on) and a dry run reports it as drift instead of aborting.
    """
    return f"printf '%s\\n' {shlex.quote('gpunode: ' + message)} >&2; exit 1"


def control_command(function: Callable[..., None], *args: object) -> FunctionCommand:
    """A command running ``function(host, *args)`` on the control machine (Kubernetes API calls, waits).

    A GpunodeError fails the host with its lines (problem, fix) and no traceback,
    as a failing shell command would.
    """

    @wraps(function)
    def callback(state: State, host: Host) -> bool:
        try:
            function(host, *args)
        except GpunodeError as error:
            for line in f"gpunode: {error}".splitlines():
                host.log_styled(line, fg="red", log_func=logger.error)
            return False
        return True

    return FunctionCommand(callback, (), {})
