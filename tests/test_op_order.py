"""gpunode.op_order gives pyinfra's CLI operation order exactly as pyinfra's own function does, on real stacks."""

from __future__ import annotations

import importlib
import textwrap
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api import util

from gpunode import op_order

# a deploy file whose operations are called at the top level, from nested functions and from a loop
DEPLOY = textwrap.dedent("""
    def inner(results):
        results.append((original(state), ours(state)))

    def outer(results):
        for _ in range(2):
            inner(results)

    results.append((original(state), ours(state)))
    outer(results)
""")


def run_deploy(filename: str, deploy_filename: str | None) -> list[tuple[list[int], list[int]]]:
    results: list[tuple[list[int], list[int]]] = []
    state = SimpleNamespace(current_deploy_filename=deploy_filename, current_op_file_number=7)
    code = compile(DEPLOY, filename, "exec")
    exec(code, {"results": results, "state": state,  # noqa: S102 - the test's own deploy text
                "original": util.get_operation_order_from_stack, "ours": op_order.operation_order})
    return results


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_filename", ["deploys/bootstrap.py", None, "deploys/not-on-the-stack.py"])
def test_the_order_is_pyinfras_own(monkeypatch: pytest.MonkeyPatch, is_cli: bool, deploy_filename: str | None):
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    results = run_deploy("deploys/bootstrap.py", deploy_filename)
    assert len(results) == 3
    for original, ours in results:
        assert ours == original
    if deploy_filename == "deploys/bootstrap.py":  # the top-level call and a nested one differ: the test can fail
        assert results[0][1] != results[1][1]
        assert len(results[1][1]) > len(results[0][1])
    if is_cli:
        assert all(ours[0] == 7 for _, ours in results)


def test_install_replaces_only_the_function_it_reproduces(monkeypatch: pytest.MonkeyPatch):
    operation = importlib.import_module("pyinfra.api.operation")
    monkeypatch.setattr(operation, "get_operation_order_from_stack", util.get_operation_order_from_stack)
    monkeypatch.setattr(pyinfra, "__version__", "4.0.0", raising=False)
    assert op_order.install() is False
    assert operation.get_operation_order_from_stack is util.get_operation_order_from_stack
    monkeypatch.setattr(pyinfra, "__version__", "3.10.0", raising=False)
    monkeypatch.setattr(operation, "get_operation_order_from_stack", lambda state: [])
    assert op_order.install() is False  # someone else's replacement stays
    monkeypatch.setattr(operation, "get_operation_order_from_stack", util.get_operation_order_from_stack)
    assert op_order.install() is True
    assert operation.get_operation_order_from_stack is op_order.operation_order


def test_the_steps_install_it():
    importlib.import_module("gpunode.steps")
    assert importlib.import_module("pyinfra.api.operation").get_operation_order_from_stack is op_order.operation_order
