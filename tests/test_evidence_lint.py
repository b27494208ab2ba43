"""Lint: evidence is what was read, so no evidence line in the product is a constant string.

Every ``Finding(...)``, ``proven(...)`` and ``with_proof(...)`` call in gpunode is parsed; each element of
its evidence list must carry a value read at run time (an f-string with at least one field, a variable, a
call), never fixed text that describes state it did not read (such as "(the DaemonSet's nodeSelector wants
true)" printed whatever the selector was).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import REPO

SOURCES = sorted((REPO / "src" / "gpunode").rglob("*.py"))
# the evidence argument's position per callable
EVIDENCE_AT = {"Finding": 3, "proven": 2, "with_proof": 3, "fail": 1}


def evidence_args(tree: ast.AST) -> list[tuple[ast.AST, ast.expr]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if name not in EVIDENCE_AT:
            continue
        keyword = next((k.value for k in node.keywords if k.arg == "evidence"), None)
        position = EVIDENCE_AT[name]
        if name == "fail" and len(node.args) >= 3 and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[1], ast.Constant | ast.JoinedStr):  # runtime's fail(code, what, evidence)
            position = 2
        argument = keyword or (node.args[position] if len(node.args) > position else None)
        if argument is not None:
            found.append((node, argument))
    return found


def constant_lines(expression: ast.expr) -> list[ast.expr]:
    """The list elements inside ``expression`` that are fixed text."""
    bad = []
    for node in ast.walk(expression):
        if not isinstance(node, ast.List):
            continue
        for element in node.elts:
            if isinstance(element, ast.Constant) and isinstance(element.value, str):
                bad.append(element)
            elif isinstance(element, ast.JoinedStr) and not any(isinstance(v, ast.FormattedValue)
                                                                  for v in element.values):
                bad.append(element)
    return bad


def violations(source: str, filename: str) -> list[str]:
    tree = ast.parse(source, filename)
    return [f"{filename}:{line.lineno}: {ast.unparse(line)}" for _, argument in evidence_args(tree)
            for line in constant_lines(argument)]


def test_the_rule_catches_a_constant_evidence_line() -> None:
    sample = ('Finding("s", Verdict.FINDING, "what", [f"{x}: read", "(the selector wants true)"], "fix")\n'
              'proven("s", "what", [f"plain {value}", f"no field"])\n')
    assert [v.split(": ", 1)[1] for v in violations(sample, "sample.py")] == [
        "'(the selector wants true)'", "f'no field'"]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO / "src")))
def test_no_evidence_line_in_gpunode_is_a_constant(path: Path) -> None:
    assert violations(path.read_text(), str(path.relative_to(REPO))) == []
