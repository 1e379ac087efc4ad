"""One function per verb: parse what is left of the options, call the library once, report, return the exit code.

Nothing heavy is imported until a verb runs: each imports the stage it calls.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext

from infrarsi.cli._output import EXIT_OK, EXIT_REJECTED, emit, progress_bar
from infrarsi.cli._texts import baseline_lines, detectable, revision_lines

__all__ = ["COMMANDS"]


def executor_flags(args) -> dict | None:
    """The [executor] keys the command line set (`--partition gpu` -> {"partition": "gpu"}); None: none."""
    from infrarsi.contract import EXECUTOR_FLAGS

    given = {key: getattr(args, f"executor_{key}") for key in EXECUTOR_FLAGS.values()}
    return {key: value for key, value in given.items() if value is not None} or None


def _cmd_init(args) -> int:
    from infrarsi import init

    result = init(args.contract, force=args.force, update=args.update)
    if result.revision is not None:
        emit(args, result.to_json(), revision_lines(result))
        return EXIT_OK
    lines = [
        f"initialised {result.state_dir}",
        f"  ledger    {result.ledger}",
        f"  manifest  {result.manifest} (sha256 {result.manifest_sha256[:16]}...)",
        f"  pinned    {len(result.pinned)} file(s): {', '.join(sorted(result.pinned))}",
    ]
    if result.archived:
        lines.append(f"  previous state archived in {result.archived}")
    lines.append("next: infrarsi baseline")
    emit(args, result.to_json(), "\n".join(lines))
    return EXIT_OK


def _cmd_draft(args) -> int:
    from infrarsi._draft import draft

    result = draft(args.command, out=args.out, force=args.force)
    lines = [f"drafted {result.contract} (arguments read as: {result.style}); what was guessed, and why:"]
    lines += [f"  - {line}" for line in result.why]
    lines += [f"  ! {note}" for note in result.notes]
    off = [k.name for k in result.knobs if k.disabled]
    if off:
        lines.append(f"  commented out (they change precision): {', '.join(off)}")
    lines.append(f"next: review it, then infrarsi init --contract {result.contract}")
    emit(args, result.to_json(), "\n".join(lines))
    return EXIT_OK


def _cmd_baseline(args) -> int:
    from infrarsi._baseline import baseline
    from infrarsi.errors import BaselineFailed, BaselineRejected

    bar = progress_bar(args, "baseline")
    try:
        with bar or nullcontext():
            summary = baseline(
                args.contract,
                runs=args.runs,
                progress=bar.update if bar else None,
                force=args.force,
                calibrate=args.calibrate,
                executor_flags=executor_flags(args),
            )
    except BaselineRejected as exc:
        print(f"infrarsi: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({**exc.summary.to_json(), "error": str(exc).splitlines()[0], **_self_check(exc.summary)}))
        else:
            print(baseline_lines(exc.summary))
        return EXIT_REJECTED
    except BaselineFailed as exc:
        print(f"infrarsi: baseline failed: {exc}", file=sys.stderr)
        if args.json:
            # The DESIGN.md keys, null where nothing was measured, and why.
            print(
                json.dumps(
                    {
                        "runs": 0,
                        "step_time_s": None,
                        "tokens_per_s": None,
                        "peak_mem_mb": None,
                        "mfu": None,
                        "mfu_peak": None,
                        "mfu_warning": None,
                        "error": str(exc).splitlines()[0],
                    }
                )
            )
        return EXIT_REJECTED
    human = baseline_lines(summary, detectable(args.contract, summary.step_time_s["cv"]))
    # A clean self-check keeps the DESIGN.md shape; a forced one says what it overrode.
    forced = (summary.self_check or {}).get("forced")
    emit(args, {**summary.to_json(), **(_self_check(summary) if forced else {})}, human)
    return EXIT_OK


def _self_check(summary) -> dict:
    return {"self_check": summary.self_check}


def _cmd_run(args) -> int:
    from infrarsi import run

    outcome = run(args.contract, sets=args.sets, patches=args.patches, executor_flags=executor_flags(args))
    human = (
        f"execution {outcome.execution}: {outcome.status}"
        + (f", step {outcome.step_time_s * 1e3:.2f} ms" if outcome.step_time_s else "")
        + (f", peak {outcome.peak_mem_mb:.0f} MB" if outcome.peak_mem_mb else "")
        + (f"\n  {outcome.detail}" if outcome.detail else "")
    )
    emit(args, outcome.to_json(), human)
    return EXIT_OK if outcome.status == "ok" else EXIT_REJECTED


def _cmd_verify(args) -> int:
    from infrarsi._verify import verify

    bar = progress_bar(args, "verify")
    with bar or nullcontext():
        outcome = verify(
            args.contract,
            sets=args.sets,
            patches=args.patches,
            pairs=args.pairs,
            progress=bar.update if bar else None,
            keep_going=args.keep_going,
            max_pairs=args.max_pairs,
            executor_flags=executor_flags(args),
        )
    width = max(len(c.id) for c in outcome.checks)
    lines = [
        f"{'ACCEPTED' if outcome.accepted else 'REJECTED'}: knobs {outcome.candidate['knobs']}, "
        f"patches {outcome.candidate['patches'] or 'none'}"
    ]
    lines += [f"  {c.status:9} {c.id:{width}}  {c.detail}" for c in outcome.checks]
    if outcome.speedup:
        sp = outcome.speedup
        lines.append(f"  speedup {sp['median']:.3f}x, 95% CI [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]")
    if outcome.receipt:
        lines.append(f"  receipt {outcome.receipt}")
    for step in outcome.next:
        lines.append(f"  next ({step['check']}): {step['next']}")
    emit(args, outcome.to_json(), "\n".join(lines))
    return EXIT_OK if outcome.accepted else EXIT_REJECTED


def _cmd_search(args) -> int:
    from infrarsi._search import search, search_summary

    if args.budget is not None and args.budget < 1:
        raise _usage(f"--budget {args.budget}: expected a positive number of executions")
    from infrarsi.cli._progress import SearchProgress

    bar = None if args.json or not sys.stderr.isatty() else SearchProgress()
    with bar or nullcontext():
        outcome = search(
            args.contract,
            budget=args.budget,
            resume=args.resume,
            pack=args.pack,
            seed=args.seed,
            progress=bar.update if bar else None,
            workers=args.workers,
            devices=args.devices,
            executor_flags=executor_flags(args),
        )
    emit(args, outcome.to_json(), search_summary(outcome))
    return EXIT_OK if outcome.best else EXIT_REJECTED


def _cmd_pack(args) -> int:
    from infrarsi._search import export_pack

    path, pack = export_pack(args.contract, args.out)
    human = (
        f"pack {path}: {len(pack['findings'])} verified finding(s), {len(pack['runs'])} run(s), "
        f"measured on {pack['hardware'].get('cpu') or pack['hardware'].get('device') or 'this machine'}"
    )
    emit(args, {"pack": str(path), "findings": len(pack["findings"]), "runs": len(pack["runs"])}, human)
    return EXIT_OK


def _usage(message: str):
    from infrarsi.errors import UsageError

    return UsageError(message)


def _cmd_receipt(args) -> int:
    from infrarsi._receipt import verify_receipt

    key, source = _receipt_key(args.path, args.key)
    check = verify_receipt(args.path, trusted_public_hex=key)
    trust = {
        "--key": "the key given with --key",
        "manifest": "the key the manifest beside it pins",
        "receipt": "its own key only (no manifest beside it: pass --key to pin one)",
    }[source]
    human = (
        f"receipt {check.receipt_id}: valid, signed by {trust}"
        if check.ok
        else "receipt INVALID:\n" + "\n".join(f"  {p}" for p in check.problems)
    )
    emit(args, {**check.to_json(), "trusted_key": key, "key_source": source}, human)
    return EXIT_OK if check.ok else EXIT_REJECTED


def _receipt_key(path: str, given: str | None) -> tuple[str | None, str]:
    """The key a receipt must be signed by: --key, else the manifest of the workspace it sits in
    (``.infrarsi/receipts/ID.json``), else none (the receipt is checked against its own key)."""
    from pathlib import Path

    from infrarsi._manifest import trusted_key
    from infrarsi.errors import ManifestError

    found = trusted_key(Path(path).resolve().parent.parent, given)
    if found.problem:
        raise ManifestError(found.problem)
    return found.key, {"given": "--key", "manifest": "manifest", "none": "receipt"}[found.source]


def _cmd_lint(args) -> int:
    from infrarsi._lint import lint

    report = lint(args.file, against=args.against, contract=args.contract)
    lines = [str(f) for f in report.findings]
    rules = f"against {report.against}" if report.against else "standalone"
    lines.append(
        f"{len(report.findings)} finding(s) in {report.file} ({rules}; contract: "
        f"{report.contract or 'none, fp32 only'})"
    )
    emit(args, report.to_json(), "\n".join(lines))
    return EXIT_OK if report.clean else EXIT_REJECTED


def _cmd_audit(args) -> int:
    from infrarsi._audit import audit_ledger

    bar = progress_bar(args, "audit")
    with bar or nullcontext():
        report = audit_ledger(
            args.ledger,
            contract_path=args.contract,
            trusted_key=args.key,
            reuse=not args.rejudge_all,
            progress=(lambda done, total: bar.update(done, total, None)) if bar else None,
        )
    if args.json:
        print(json.dumps(report.to_json(), sort_keys=True))
    else:
        from infrarsi.cli._tables import print_report

        print_report(report)
    return EXIT_OK if report.clean else EXIT_REJECTED


def _cmd_report(args) -> int:
    from infrarsi._report import report

    outcome = report(args.contract, ledger=args.ledger, out=args.out)
    lines = [
        f"report {outcome.html}",
        f"  markdown  {outcome.markdown} (plots beside it: {len(outcome.plots)})",
        f"  ledger    {outcome.executions} execution(s), chain {'ok' if outcome.chain_ok else 'BROKEN'}",
    ]
    for p in outcome.promoted:
        lines.append(f"  promoted  {p['speedup']['median']:.3f}x  receipt {p['receipt']}")
    if not outcome.promoted:
        lines.append("  promoted  none")
    lines += [f"  INVALID receipt {b['receipt']}: {'; '.join(b['problems'])}" for b in outcome.bad_receipts]
    emit(args, outcome.to_json(), "\n".join(lines))
    return EXIT_OK if outcome.ok else EXIT_REJECTED


def _cmd_apply(args) -> int:
    from infrarsi._apply import apply
    from infrarsi.errors import ApplyRefused

    try:
        outcome = apply(args.contract, receipt=args.receipt, branch=args.branch, patch_file=args.patch_file)
    except ApplyRefused as exc:
        print(f"infrarsi apply: refused: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(exc), "exit_code": EXIT_REJECTED, "applied": False}, sort_keys=True))
        return EXIT_REJECTED
    sp = outcome.speedup
    lines = [
        f"applied receipt {outcome.receipt}: {sp['median']:.3f}x (95% CI {sp['ci_low']:.3f}-{sp['ci_high']:.3f})",
        f"  changes   {', '.join(outcome.changes) or 'none'}",
    ]
    if outcome.branch:
        lines += [
            f"  branch    {outcome.branch} (commit {outcome.commit[:12]}, receipt bundle {outcome.bundle})",
            f"  next      git switch {outcome.branch}   (your checkout was not touched)",
        ]
    else:
        lines += [f"  patch     {outcome.patch_file}", f"  next      {outcome.apply_command}"]
    lines.append(f"  launch    {outcome.launch['shell']}")
    emit(args, {**outcome.to_json(), "applied": True}, "\n".join(lines))
    return EXIT_OK


def _cmd_gate(args) -> int:
    from infrarsi._gate import gate
    from infrarsi.contract import parse_sets

    if args.runs < 1:
        raise _usage(f"--runs {args.runs}: expected at least 1")
    bar = progress_bar(args, "gate")
    with bar or nullcontext():
        outcome = gate(
            args.contract,
            base=args.base,
            head=args.head,
            patch=args.patch,
            trusted_keys=args.trusted_keys,
            rerun=args.rerun,
            runs=args.runs,
            pairs=args.pairs,
            sets=parse_sets(args.sets),
            out=args.out,
            progress=bar.update if bar else None,
        )
    text = outcome.markdown()
    if args.summary:
        try:
            with open(args.summary, "a", encoding="utf-8") as handle:
                handle.write(text + "\n")
        except OSError as exc:
            raise _usage(f"--summary {args.summary}: cannot write it: {exc.strerror or exc}") from None
    emit(args, outcome.to_json(), text.rstrip())
    return EXIT_OK if outcome.passed else EXIT_REJECTED


def _cmd_demo(args) -> int:
    from infrarsi import demo

    bars = {}
    if not args.json and sys.stderr.isatty():
        from infrarsi.cli._progress import ProgressBar, SearchProgress

        bars = {"baseline_bar": ProgressBar("baseline"), "search_bar": SearchProgress()}
    report = demo(args.dir, quiet=args.json, **bars)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    return EXIT_OK if report.get("ok") else EXIT_REJECTED


COMMANDS = {
    "init": _cmd_init,
    "baseline": _cmd_baseline,
    "run": _cmd_run,
    "verify": _cmd_verify,
    "search": _cmd_search,
    "pack": _cmd_pack,
    "receipt": _cmd_receipt,
    "lint": _cmd_lint,
    "draft": _cmd_draft,
    "audit": _cmd_audit,
    "report": _cmd_report,
    "apply": _cmd_apply,
    "gate": _cmd_gate,
    "demo": _cmd_demo,
}
