"""`infrarsi report`: the ledger read back as a Markdown report and a self-contained HTML page.

Everything shown comes from the ledger file (and the manifest beside it for the key to
trust); nothing is re-run and nothing is written to the ledger. Receipts that do not
verify are listed as such and never shown as promotions.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infrarsi._report._data import Promotion, ReportData, load_report_data
from infrarsi._report._document import Document

__all__ = ["report", "ReportOutcome", "build_document"]

PLOT_DIR = "plots"


@dataclass(frozen=True)
class ReportOutcome:
    markdown: Path
    html: Path
    plots: list[Path]
    promoted: list[dict]
    executions: int
    chain_ok: bool
    bad_receipts: list[dict]

    @property
    def ok(self) -> bool:
        """Exit 0 only when the chain verifies and every receipt found does too."""
        return self.chain_ok and not self.bad_receipts

    def to_json(self) -> dict:
        return {
            "markdown": str(self.markdown),
            "html": str(self.html),
            "plots": [str(p) for p in self.plots],
            "promoted": self.promoted,
            "executions": self.executions,
            "chain_ok": self.chain_ok,
            "bad_receipts": self.bad_receipts,
        }


def report(
    contract_path: str | Path = "infrarsi.toml", ledger: str | Path | None = None, out: str | Path | None = None
) -> ReportOutcome:
    """Write ``report.md``, ``report.html`` and ``plots/*.svg`` into ``out``.

    The ledger is ``ledger`` when given, else the contract's ``.infrarsi/ledger.db``;
    ``out`` defaults to the folder ``report`` beside the ledger.
    """
    from infrarsi.errors import UsageError

    if ledger is None:
        from infrarsi.contract import load_contract

        ledger = load_contract(contract_path).state_dir / "ledger.db"
    ledger = Path(ledger)
    if not ledger.is_file():
        raise UsageError(
            f"{ledger}: no ledger here (expected the file `infrarsi init` creates; "
            "run `infrarsi init` and `infrarsi baseline` first, or pass --ledger)"
        )
    data = load_report_data(ledger)
    folder = Path(out) if out is not None else ledger.parent / "report"
    try:
        (folder / PLOT_DIR).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{folder}: cannot create the report folder: {exc.strerror or exc}") from None
    doc = build_document(data)
    plots = []
    for name, svg in doc.plots().items():
        path = folder / PLOT_DIR / name
        path.write_text(svg)
        plots.append(path)
    md, page = folder / "report.md", folder / "report.html"
    md.write_text(doc.markdown(PLOT_DIR))
    page.write_text(doc.html())
    promoted = [
        {"receipt": p.receipt_id, "knobs": p.knobs, "patches": [x["name"] for x in p.patches], "speedup": p.speedup}
        for p in data.promotions
    ]
    return ReportOutcome(md, page, plots, promoted, len(data.rows), data.chain_ok, data.bad_receipts)


def build_document(data: ReportData) -> Document:
    doc = Document(f"InfraRSI report: {data.contract_name}")
    _summary(doc, data)
    _baseline(doc, data)
    _promotions(doc, data)
    _search(doc, data)
    _resources(doc, data)
    _limits(doc, data)
    return doc


def _summary(doc: Document, data: ReportData) -> None:
    best = data.best
    chain = "verify" if data.chain_ok else "**DO NOT VERIFY**"
    doc.para(
        f"Ledger `{data.ledger}`: {len(data.rows)} execution(s); its hash chain and signed head {chain} "
        f"({data.chain_detail})."
    )
    if best:
        sp = best.speedup
        doc.para(
            f"**Best verified candidate: {sp['median']:.3f}x** (95% CI {sp['ci_low']:.3f} to "
            f"{sp['ci_high']:.3f}), receipt `{best.receipt_id}`: {', '.join(best.changes) or 'no change'}. "
            f"Apply it with `infrarsi apply {best.receipt_id} --branch infrarsi/{best.receipt_id}`."
        )
    else:
        doc.para("No candidate holds a verified receipt: nothing is promoted.")
    if data.bad_receipts:
        doc.para(f"**{len(data.bad_receipts)} receipt(s) do not verify** and are not shown as promotions:")
        doc.bullets([f"`{b['receipt']}`: {'; '.join(b['problems'])}" for b in data.bad_receipts])


def _baseline(doc: Document, data: ReportData) -> None:
    doc.heading("Baseline diagnosis")
    base = data.baseline
    if not base:
        doc.para("No baseline is recorded: run `infrarsi baseline`.")
        return
    st = base["step_time_s"]
    runs = base.get("executions") or []
    doc.table(
        ["measure", "value"],
        [
            ["runs", f"{base.get('runs')} (executions {runs[0]}..{runs[-1]})" if runs else base.get("runs")],
            ["step time (median of run medians)", f"{st['median'] * 1e3:.2f} ms"],
            ["noise between runs", f"CV {_pct(st.get('cv'))}, MAD {_ms(st.get('mad'))}"],
            ["noise within a run", f"CV {_pct(base.get('within_run_cv'))}"],
            ["tokens/s", _num(base.get("tokens_per_s"), "{:,.0f}")],
            [
                "peak memory",
                _num(base.get("peak_mem_mb"), "{:.0f} MB")
                + (f" of a {data.memory_limit_mb:.0f} MB limit" if data.memory_limit_mb else ""),
            ],
            ["MFU", _pct(base.get("mfu"))],
        ],
    )
    if data.baseline_knobs:
        doc.para("Baseline knob settings: " + ", ".join(f"`{k}={v}`" for k, v in sorted(data.baseline_knobs.items())))


def _promotions(doc: Document, data: ReportData) -> None:
    doc.heading("Promoted candidates")
    if not data.promotions:
        doc.para(
            "None. A candidate is promoted only when every required check passes; see the search below "
            "for what was tried and why it stopped."
        )
        return
    for p in data.promotions:
        _promotion(doc, p)


def _promotion(doc: Document, p: Promotion) -> None:
    from infrarsi._report._plots import ab_looks_svg, convergence_svg

    sp = p.speedup
    doc.heading(f"Receipt {p.receipt_id}: {sp['median']:.3f}x", 3)
    doc.para("Changes from the baseline: " + (", ".join(f"`{c}`" for c in p.changes) or "none"))
    pairs = len(p.ab.get("candidate_s") or [])
    doc.table(
        ["measure", "baseline", "candidate"],
        [
            ["step time (A/B, same machine, back to back)", _ms(p.step_before_s), _ms(p.step_after_s)],
            [
                f"speedup (median, one-sided {sp.get('confidence', 0.95) * 100:.3g}% bounds)",
                "1.000x",
                f"{sp['median']:.3f}x [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]",
            ],
            ["MFU", _pct(p.mfu_before), _pct(p.mfu_after)],
            ["A/B runs", f"{len(p.ab.get('baseline_s') or [])} ({p.ab.get('order', '?')} order)", str(pairs)],
        ],
    )
    looks = p.ab.get("looks") or []
    doc.plot(
        f"ab-{p.receipt_id}.svg",
        "The A/B pairs as they accumulated: each pair's ratio (grey), and the median and bounds at each "
        + (f"look ({len(looks)}, the last decided: {looks[-1]['decision']})." if looks else "look (one, at the end)."),
        ab_looks_svg(p.ab),
    )
    claim = p.convergence
    if claim and claim.get("curves"):
        low, high = claim.get("ci90") or [float("nan")] * 2
        doc.plot(
            f"long-{p.receipt_id}.svg",
            f"Long runs ({claim.get('seeds')} seeds x {claim.get('steps')} steps): the tails differ by "
            f"{claim.get('difference', float('nan')):+.3g} (90% CI [{low:+.3g}, {high:+.3g}]) within a margin "
            f"of ±{claim.get('margin', float('nan')):.3g}; the largest gap of the smoothed curves is "
            f"{claim.get('max_gap', float('nan')):+.3g} at step {claim.get('max_gap_step')}.",
            convergence_svg(claim),
        )
    doc.para("Checks (a candidate is accepted only when every required one passes):")
    doc.table(["check", "status", "detail"], [[c.get("id"), c.get("status"), c.get("detail")] for c in p.checks])
    for patch in p.patches:
        doc.para(f"Patch `{patch['name']}` (sha256 `{(patch['sha256'] or '')[:16]}...`):")
        doc.code(patch["text"] or "(the patch text is not in this ledger)", "diff")
    doc.para(f"Executions behind this receipt: {', '.join(map(str, p.executions)) or 'none listed'}.")


def _search(doc: Document, data: ReportData) -> None:
    from infrarsi._report._plots import best_so_far_svg, memory_speed_svg
    from infrarsi._search.strategy._space import atom_label

    doc.heading("The search")
    attempts = data.attempts()
    if not attempts:
        doc.para("No candidate was run: only the baseline is in the ledger.")
    by_status: dict[str, int] = {}
    for r in attempts:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    if attempts:
        doc.para(
            f"{len(attempts)} candidate execution(s): "
            + ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
            + "."
        )
    doc.plot(
        "best-so-far.svg",
        "Best verified speedup against executions launched; grey points are single "
        "exploration runs against the baseline median, which are estimates, not receipts.",
        best_so_far_svg(data),
    )
    doc.plot(
        "memory-speed.svg",
        "Peak memory against step time. Out-of-memory runs were stopped at the limit: "
        "their real peak is at least the limit (a lower bound, drawn as an up arrow).",
        memory_speed_svg(data),
    )
    failures = data.failures()
    doc.heading("Crashes and timeouts", 3)
    if failures:
        doc.table(
            ["execution", "status", "changes", "why it stopped"],
            [
                [f["execution"], f["status"], ", ".join(f["changes"]) or "baseline", _short(f["detail"])]
                for f in failures
            ],
        )
    else:
        doc.para("None.")
    ooms = [r for r in attempts if r["status"] == "oom"]
    if ooms:
        doc.para(
            f"{len(ooms)} run(s) out of memory: "
            + "; ".join(f"execution {r['id']} ({', '.join(data.changes(r)) or 'baseline'})" for r in ooms[:12])
            + ("; ..." if len(ooms) > 12 else "")
            + "."
        )
    doc.heading("Incompatibilities found", 3)
    if data.incompatibilities:
        doc.bullets(
            [
                f"{'incompatible' if f.get('learned') else 'failed together'}: "
                f"`{' + '.join(atom_label(str(a)) for a in f['atoms'])}` ({_short(str(f.get('why') or ''))})"
                for f in data.incompatibilities
            ]
        )
    else:
        doc.para("None learned by the last search.")


def _resources(doc: Document, data: ReportData) -> None:
    doc.heading("Resource ledger")
    res = data.resources()
    doc.para("Every execution the ledger holds, failed and rejected ones included:")
    doc.table(
        ["kind", "status", "executions", "device-s"],
        [[r["kind"], r["status"], r["executions"], f"{r['device_s']:.1f}"] for r in res["table"]],
    )
    doc.bullets(
        [
            f"total: {res['executions']} execution(s), {res['device_s']:.1f} device-s",
            f"spent on candidates (search, runs, verification, A/B): {res['search_device_s']:.1f} device-s",
            f"LLM: {res['llm_tokens']} token(s), ${res['llm_cost']:.4f}",
        ]
    )
    net = data.net()
    if net is None:
        doc.para("Net: no promoted candidate, so the search cost has bought nothing yet.")
    elif net["break_even_steps"] is None:
        doc.para("Net: the best candidate saves no time per step.")
    else:
        doc.para(
            f"Net: the best candidate saves {net['saving_per_step_s'] * 1e3:.2f} ms per step "
            f"(of {net['baseline_step_s'] * 1e3:.2f} ms); the {net['search_device_s']:.1f} device-s spent "
            f"on candidates is paid back after about **{net['break_even_steps']:,.0f} training steps**."
        )


def _limits(doc: Document, data: ReportData) -> None:
    doc.heading("Honest limits")
    doc.bullets(
        [
            "Numerics are compared over a short window (the contract's measured steps): they show the job computes "
            "the same thing at the start, and say nothing about full-run convergence or final quality.",
            "Speedups are measured on this machine, with this contract's batch sizes and step counts; another "
            "machine, driver or library version needs its own receipt (`infrarsi gate` re-verifies in CI).",
            "Memory for out-of-memory runs is a lower bound: the guard stopped them at the limit.",
            "Single exploration runs are estimates; only A/B receipts (back to back against the baseline) count.",
            "This report is only as trustworthy as the ledger: `infrarsi audit` re-verifies every stored "
            "execution with today's rules." + ("" if data.chain_ok else " **This ledger's chain does not verify.**"),
        ]
    )


def _pct(value) -> str:
    if value is None:
        return "n/a"
    return f"{value * 100:.2f}%" if value >= 1e-3 or value == 0 else f"{value * 100:.2g}%"


def _ms(value) -> str:
    return "n/a" if value is None else f"{value * 1e3:.2f} ms"


def _num(value, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def _short(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
