"""The human output of `init` and `baseline`: what a person reads; `--json` carries the same facts."""

from __future__ import annotations

from infrarsi.cli._output import num, pct

__all__ = ["revision_lines", "baseline_lines", "detectable"]


def revision_lines(result) -> str:
    rev = result.revision
    if not rev["changed"]:
        return f"unchanged: the contract and protected files are as revision {rev['number']} pinned them"
    lines = [f"contract revision {rev['number']} pinned in {result.manifest} (same ledger, same key)"]
    lines += [f"  changed  {change}" for change in rev["changes"]]
    if rev["baseline_required"]:
        lines.append("  baseline a new one is required (the change alters what it measured)")
        lines.append("next: infrarsi baseline")
    else:
        lines.append("  baseline kept: nothing it measured changed")
    return "\n".join(lines)


def _mfu_line(summary) -> str:
    peak = summary.mfu_peak
    if summary.mfu is None or not peak:
        return "n/a (no peak known for this device and no [resources] peak_tflops, or no flops_per_token declared)"
    where = "[resources] peak_tflops" if peak["source"] == "contract" else f"{peak['device']}, {peak['precision']}"
    line = f"{pct(summary.mfu)} of {peak['tflops']:g} TFLOPS ({where})"
    return line + (f"\n  warning     {summary.mfu_warning}" if summary.mfu_warning else "")


def baseline_lines(summary, detectable: list[str] = ()) -> str:
    st = summary.step_time_s
    lines = [
        f"baseline over {summary.runs} run(s) (executions {summary.executions[0]}..{summary.executions[-1]})",
        f"  step time   {st['median'] * 1e3:.2f} ms median, CV {pct(st['cv'])}, MAD {st['mad'] * 1e3:.3f} ms",
        f"  within-run  CV {pct(summary.within_run_cv)}",
        f"  tokens/s    {num(summary.tokens_per_s, '{:,.0f}')}" + _tokens_from(summary.tokens_source),
        f"  peak memory {num(summary.peak_mem_mb, '{:.0f} MB')}",
        f"  MFU         {_mfu_line(summary)}",
        f"  reference   loss and grad-norm trajectories over {len(summary.reference['loss'])} steps stored",
        *detectable,
        *_calibration_lines(summary.calibration),
    ]
    checked = summary.self_check or {}
    problems, notes = checked.get("problems") or [], checked.get("notes") or []
    if not problems:
        lines.append("  self-check  passed: every required check has evidence and holds on the baseline itself")
    elif checked.get("forced"):
        lines.append(f"  self-check  {len(problems)} problem(s), stored anyway (--force): candidates will fail")
    else:
        lines.append(f"  self-check  {len(problems)} problem(s): NOT stored as the reference")
    lines += [f"    problem: {p['check']} [{p['key'] or 'the script'}]: {p['message']}" for p in problems]
    lines += [f"    note: {note}" for note in notes]
    return "\n".join(lines)


def _calibration_lines(calibration: dict | None) -> list[str]:
    """The calibration's proposals and the largest difference each rests on."""
    if not calibration:
        return []
    seen = calibration.get("observed") or {}
    lines = [
        f"  calibrated  loss_rtol = {calibration['loss_rtol']:g} "
        f"(largest difference seen {num(seen.get('loss'), '{:.2e}')}), "
        f"grad_norm_rtol = {calibration['grad_norm_rtol']:g} (seen {num(seen.get('grad_norm'), '{:.2e}')} per step, "
        f"{num(seen.get('param_grad_norms'), '{:.2e}')} per parameter); {calibration['factor']:g}x what was seen, "
        f"at least {calibration['floor']:g}"
    ]
    if calibration.get("convergence"):
        margin = calibration.get("margin")
        lines.append(
            "  calibrated  convergence margin = "
            + (f"{margin:.3g} of the tail loss (the seeds' spread)" if margin else "none: the seeds did not spread")
        )
    for name, found in (calibration.get("perturbations") or {}).items():
        if isinstance(found, dict) and found.get("skipped"):
            lines.append(f"    note: calibration {name}: {found['skipped']}")
    lines.append('    use them: loss_rtol = "calibrated" (and grad_norm_rtol, margin) in the contract')
    return lines


def _tokens_from(source: str | None) -> str:
    return {
        "receipts": " (tokens counted in the job)",
        "contract": " (tokens from the contract's tokens_per_step)",
    }.get(source, " (tokens unknown: set [task] tokens_per_step)")


def detectable(contract_path, cv) -> list[str]:
    """The smallest speedup `verify` can see at this noise (docs/verification.md)."""
    if not cv:
        return []
    from infrarsi.contract import load_contract
    from infrarsi.verifiers import min_detectable_speedup

    search = load_contract(contract_path).search
    smallest = min_detectable_speedup(cv, search.ab_pairs, search.min_speedup)
    return [f"  detectable  speedups above about {smallest:.3f}x with ab_pairs = {search.ab_pairs} at this noise"]
