"""pyinfra's CLI operation order, read from the call stack without ``inspect.stack()``.

In CLI mode pyinfra orders operations by the line numbers of the call stack from
the deploy file down (``pyinfra.api.util.get_operation_order_from_stack``). It
builds them with ``inspect.stack()``, which also looks up every frame's module
and source line: measured on a 20-node no-op of the bootstrap, 0.65 s of the
controller's 1.35 s of CPU, and it grows with every host. The line numbers need
only each frame's file name and current line, which the frames carry.

``install()`` puts ``operation_order`` in pyinfra's place only for the pyinfra
release line it was checked against (3.x, whose function it reproduces: same
frames, same file test, same numbers; ``tests/test_op_order.py`` compares them on
real stacks); for any other pyinfra it leaves pyinfra's own function.
"""

from __future__ import annotations

import sys
from importlib import import_module

import pyinfra
from pyinfra.api import util

CHECKED_MAJOR = "3."


def _frames_outermost_first() -> list[tuple[str, int]]:
    """(file name, line) of the frames ``reversed(inspect.stack())`` would list inside pyinfra's function.

    The innermost is that function's own frame, a pyinfra file that is never counted: ``operation_order`` stands in
    for it under pyinfra's folder, so that a search for the deploy file that finds nothing ends on it as pyinfra's does.
    """
    frames = [(util.PYINFRA_INSTALL_DIR, 0)]
    frame = sys._getframe(2)  # the caller of operation_order
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno))
        frame = frame.f_back
    frames.reverse()
    return frames


def operation_order(state: object) -> list[int]:
    """The line numbers pyinfra's ``get_operation_order_from_stack`` returns for the same stack."""
    frames = _frames_outermost_first()
    start = 0
    deploy_file = getattr(state, "current_deploy_filename", None)
    if deploy_file:
        # pyinfra keeps the loop index where the search ends: the deploy file's frame, or the last frame
        for start, (filename, _) in enumerate(frames):  # noqa: B007 - the index after the loop is the point
            if filename == deploy_file:
                break
    line_numbers = []
    if pyinfra.is_cli:
        line_numbers.append(state.current_op_file_number)  # type: ignore[attr-defined]
    line_numbers.extend(line for filename, line in frames[start:]
                        if not filename.startswith(util.PYINFRA_INSTALL_DIR))
    return line_numbers


def install() -> bool:
    """Use ``operation_order`` for pyinfra's CLI ordering; False (pyinfra's own kept) on an unchecked pyinfra."""
    operation = import_module("pyinfra.api.operation")  # the package re-exports the decorator under this name
    current = getattr(operation, "get_operation_order_from_stack", None)
    if current is operation_order:
        return True
    version = getattr(pyinfra, "__version__", "") or _installed_version()
    if current is not util.get_operation_order_from_stack or not version.startswith(CHECKED_MAJOR):
        return False
    operation.get_operation_order_from_stack = operation_order
    return True


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pyinfra")
    except PackageNotFoundError:
        return ""
