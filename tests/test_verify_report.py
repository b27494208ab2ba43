"""verify's text table: the grid in the verdict's words, then a line per finding, per driver not checked and per
warning."""

from __future__ import annotations

from gpunode.verify.report import table


def step(state: str, reason: str = "", findings: list[dict] | None = None) -> dict:
    return {"state": state, "reason": reason, "proof": [], "findings": findings or []}


def test_the_table_names_findings_and_warnings() -> None:
    warning = {"state": "finding", "breaks": False, "what": "persistence mode is off on GPU(s) 1", "evidence": [],
               "fix": "", "code": "persistence-mode-off"}
    results = {"steps": ["driver", "toolkit"], "hosts": {
        "node01": {"driver": step("ok", "driver OK", [warning]), "toolkit": step("finding", "toolkit missing")},
        "node03": {"driver": step("not checked", "CPU-only host"), "toolkit": step("not checked", "CPU-only host")}}}
    lines = table(results).splitlines()
    assert lines[1] == "node01  " + "  ".join(["ok".ljust(12), "FINDING".ljust(12)])
    assert lines[2] == "node03  " + "  ".join(["not checked".ljust(12)] * 2)
    assert lines[4:] == ["warning node01 driver: persistence mode is off on GPU(s) 1",
                         "FINDING node01 toolkit: toolkit missing", "not checked node03 driver: CPU-only host"]
