"""Rendering verification results: the host x step table, and a self-contained HTML page."""

from __future__ import annotations

import html
from datetime import UTC, datetime

SYMBOL = {"ok": "ok", "finding": "FINDING", "not checked": "not checked"}  # the verdict, a finding shouting
CSS = {"ok": "ok", "finding": "finding", "not checked": "not-checked"}


def table(results: dict) -> str:
    """A plain-text grid, hosts down, steps across, then one line per finding, per driver not checked and per
    warning (a finding that does not break its step)."""
    steps = results["steps"]
    hosts = results["hosts"]
    width = max([4] + [len(h) for h in hosts])
    lines = ["HOST".ljust(width) + "  " + "  ".join(s.ljust(12) for s in steps)]
    for host, per_step in hosts.items():
        lines.append(host.ljust(width) + "  " + "  ".join(SYMBOL[per_step[s]["state"]].ljust(12) for s in steps))
    notes = []
    for host, per_step in hosts.items():
        for step in steps:
            result = per_step[step]
            if result["state"] == "finding":
                notes.append(f"FINDING {host} {step}: {result['reason']}")
            elif result["state"] == "not checked" and step == "driver":
                notes.append(f"not checked {host} {step}: {result['reason']}")
            notes += [f"warning {host} {step}: {f['what']}" for f in result["findings"] if not f.get("breaks", True)]
    return "\n".join(lines + ([""] + notes if notes else []))


def html_page(results: dict, inventory: str) -> str:
    """One page, no external assets: the grid, and each failure expanded with evidence and fix."""
    steps = results["steps"]
    rows = []
    for host, per_step in results["hosts"].items():
        cells = "".join(
            f'<td class="{CSS[r["state"]]}" title="{html.escape(r["reason"])}">{SYMBOL[r["state"]]}</td>'
            for r in (per_step[s] for s in steps))
        rows.append(f"<tr><th>{html.escape(host)}</th>{cells}</tr>")
    details = []
    for host, per_step in results["hosts"].items():
        for step in steps:
            result = per_step[step]
            if result["state"] != "finding":
                continue
            items = []
            for finding in result["findings"] or [{"what": result["reason"], "evidence": [], "fix": ""}]:
                evidence = "".join(f"<li><code>{html.escape(e)}</code></li>" for e in finding["evidence"])
                fix = f"<p><b>fix:</b> {html.escape(finding['fix'])}</p>" if finding["fix"] else ""
                items.append(f"<p>{html.escape(finding['what'])}</p><ul>{evidence}</ul>{fix}")
            details.append(f"<details open><summary>{html.escape(host)}: {html.escape(step)}</summary>"
                           f"{''.join(items)}</details>")
    failed = sum(1 for p in results["hosts"].values() for r in p.values() if r["state"] == "finding")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = "".join(f"<th>{html.escape(s)}</th>" for s in steps)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>gpunode verify: {html.escape(inventory)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #999; padding: .3em .8em; text-align: center; }}
td.ok {{ background: #c8efc8; }} td.finding {{ background: #f5b5b5; font-weight: bold; }}
td.not-checked {{ background: #e6e6e6; color: #555; }}
details {{ margin: 1em 0; border-left: 4px solid #d33; padding-left: .8em; }}
summary {{ font-weight: bold; }} code {{ white-space: pre-wrap; }}
</style></head><body>
<h1>gpunode verify</h1>
<p>Inventory <code>{html.escape(inventory)}</code>, {stamp}: {len(results["hosts"])} host(s),
{failed} step(s) with a finding.</p>
<table><tr><th>host</th>{head}</tr>
{chr(10).join(rows)}
</table>
{"".join(details) or "<p>No finding: every step ok or not checked (with why).</p>"}
</body></html>
"""
