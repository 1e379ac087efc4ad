"""The human form of `infrarsi audit`: the verdict, a table by check, the first findings."""

from __future__ import annotations

import sys

__all__ = ["print_report"]

_SHOWN = 20


def _lines(report) -> list[str]:
    out = [
        f"{'CLEAN' if report.clean else 'FINDINGS'}: {report.executions} executions "
        f"({', '.join(f'{n} {s}' for s, n in sorted(report.by_status.items())) or 'none'}); "
        f"chain {'ok' if report.chain_ok else 'BROKEN'}",
        f"  previously accepted {report.previously_accepted}, now rejected {report.now_rejected} "
        f"({report.rejected_only_by_numerics} only by numerics), still rejected {report.still_rejected}; "
        f"{len(report.findings)} finding(s), {len(report.changed)} verdict(s) changed since they were stored",
        f"  sources: {report.rejudged} judged afresh, {report.reused} stored by today's exact rules",
        f"  receipts checked {report.receipts['checked']}, bad {len(report.receipts['bad'])}",
    ]
    out += [f"  chain: {line}" for line in report.chain]
    out += [
        f"  incomplete: verify batch {b['batch']} (execution {b['execution']}) stopped after {b['runs']} of "
        f"{b['planned']} planned runs; it decided nothing and claims nothing"
        for b in report.incomplete
    ]
    return out


def print_report(report) -> None:
    """A rich table on a TTY, plain aligned text otherwise."""
    for line in _lines(report):
        print(line)
    rows = [
        (
            check,
            counts.get("pass", 0),
            counts.get("fail", 0),
            counts.get("unchecked", 0),
            counts.get("skipped", 0),
            sum(1 for c in report.changed if c["check"] == check),
        )
        for check, counts in sorted(report.by_check.items())
    ]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table("check", "pass", "fail", "unchecked", "skipped", "changed")
        for row in rows:
            table.add_row(row[0], *(str(v) for v in row[1:]))
        Console().print(table)
    else:
        width = max([len(r[0]) for r in rows] + [5])
        print(f"  {'check':{width}}  {'pass':>6} {'fail':>6} {'unchecked':>9} {'skipped':>7} {'changed':>7}")
        for check, *counts in rows:
            print(f"  {check:{width}}  {counts[0]:>6} {counts[1]:>6} {counts[2]:>9} {counts[3]:>7} {counts[4]:>7}")
    for finding in report.findings[:_SHOWN]:
        print(f"  execution {finding['execution']}: {finding['status']} {finding['check']}: {finding['detail']}")
    if len(report.findings) > _SHOWN:
        print(f"  ... {len(report.findings) - _SHOWN} more (--json lists them all)")
