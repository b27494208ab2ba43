"""gpunode's pyinfra operations, one module per provisioning step."""

from __future__ import annotations

import inspect
import json
import os
import shlex
from collections.abc import Callable
from functools import wraps
from typing import Any

from pyinfra import logger
from pyinfra.api import FactBase, FunctionCommand, Host, State

from gpunode.errors import GpunodeError
from gpunode.facts.node import NodeFacts
from gpunode.operations.run_state import host_run


def read_node_facts(target: Host) -> None:
    """Ask the host every step's facts in one command, once per run (the bootstrap's driver check does).

    pyinfra reads a fact again for each operation that asks; a no-op bootstrap then cost one round trip per
    step and host. The parts are what each step's own fact would have read at the same moment: pyinfra reads
    every fact before it executes any operation.
    """
    run = host_run(target)
    if run.node_facts is None:
        run.node_facts = target.get_fact(NodeFacts)


def step_fact(target: Host, step: str, fact: type[FactBase], **kwargs: Any) -> Any:
    """The step's fact from the run's one read when there was one (and with the fact's default arguments),
    else read by its own command (a step deployed alone, an operation test)."""
    facts = host_run(target).node_facts
    defaults = inspect.signature(fact.command).parameters
    if facts is not None and step in facts and all(defaults[k].default == v for k, v in kwargs.items()):
        return facts[step]
    return target.get_fact(fact, **kwargs)


PLANNED_FAILURES = "GPUNODE_PLANNED_FAILURES"  # env: a file where a dry run notes the hosts it cannot plan


def failing_command(message: str) -> str:
    """A command that fails the host with ``message`` when it runs.

    Operations yield this rather than raising, so a broken host fails at execution (the others go on). A dry
    run never executes it, so the host and ``message`` are also noted (one JSON line) in the file that
    ``$GPUNODE_PLANNED_FAILURES`` names, when it names one: ``gpunode deploy --dry`` reads it, and a host it
    could not plan (the API down, RBAC, a broken driver) is "could not tell", never drift.
    """
    note_planned_failure(message)
    return f"printf '%s\\n' {shlex.quote('gpunode: ' + message)} >&2; exit 1"


def note_planned_failure(message: str) -> None:
    path = os.environ.get(PLANNED_FAILURES)
    if not path:
        return
    from pyinfra.context import ctx_host

    current = ctx_host.get()
    name = current.name if current is not None else "?"
    with open(path, "a", encoding="utf-8") as notes:
        notes.write(json.dumps({"host": name, "message": message}) + "\n")


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
