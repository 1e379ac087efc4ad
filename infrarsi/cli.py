"""`infrarsi`: a thin command line over the library. Each verb parses, calls one function, reports.

Exit codes (DESIGN.md): 0 success / accepted / clean, 1 rejected / findings /
a run that did not succeed, 2 bad input. Nothing heavy is imported until a verb runs.
"""

from __future__ import annotations

import argparse
import json
import sys

from infrarsi import __version__

__all__ = ["main", "build_parser"]

EXIT_OK, EXIT_REJECTED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    argv: list[str] = []  # what main() was given, for --json on argparse's own errors

    def error(self, message: str) -> None:  # argparse's own errors exit 2 too, without a traceback
        if "--json" in _Parser.argv:
            print(json.dumps({"error": message, "exit_code": EXIT_USAGE}, sort_keys=True))
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"infrarsi: error: {message}\n")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contract", default="infrarsi.toml",
                        help="the task contract (default: ./infrarsi.toml); its folder is the workspace")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="infrarsi", description="Make training jobs faster without cheating: "
                     "every promoted speedup comes with a full, signed receipt.")
    parser.add_argument("--version", action="version", version=f"infrarsi {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    p = verbs.add_parser("init", help="validate the contract, pin protected files, create key and ledger")
    _common(p)
    p.add_argument("--force", action="store_true", help="start a new ledger; the old state is archived")

    p = verbs.add_parser("baseline", help="measure the original setup N times")
    _common(p)
    p.add_argument("--runs", type=int, default=5, help="number of runs (default 5)")

    p = verbs.add_parser("run", help="one execution with knob settings and patches")
    _common(p)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--patch", dest="patches", action="append", default=[], metavar="NAME|FILE")

    p = verbs.add_parser("verify", help="full check of one candidate: scope, integrity, numerics, timing, A/B")
    _common(p)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--patch", dest="patches", action="append", default=[], metavar="NAME|FILE")
    p.add_argument("--pairs", type=int, default=None, help="A/B pairs (default: the contract's ab_pairs)")
    p.add_argument("--keep-going", action="store_true",
                   help="run the candidate even after a check before the run failed, to see every layer's verdict")

    p = verbs.add_parser("search", help="guarded search over knobs x patches; promotes only candidates with receipts")
    _common(p)
    p.add_argument("--budget", type=int, default=None,
                   help="executions the search may launch, promotion reruns included (default: the contract's)")
    p.add_argument("--resume", action="store_true", help="continue the last unfinished search from the ledger")
    p.add_argument("--pack", default=None, metavar="PACK.json", help="an experience pack to use as priors")
    p.add_argument("--seed", type=int, default=None, help="seed of the random starts (default: the contract's)")

    p = verbs.add_parser("pack", help="experience packs: `infrarsi pack export [--out PACK.json]`")
    p.add_argument("action", choices=["export"])
    _common(p)
    p.add_argument("--out", default=None, metavar="PACK.json", help="where to write it (default: .infrarsi/pack.json)")

    p = verbs.add_parser("receipt", help="check a receipt: `infrarsi receipt verify R.json`")
    p.add_argument("action", choices=["verify"])
    p.add_argument("path", metavar="RECEIPT.json")
    p.add_argument("--key", default=None, metavar="HEX",
                   help="the public key to trust (default: the one the manifest beside the receipts folder pins)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    p = verbs.add_parser("lint", help="audit a training script's source (against its baseline with --against)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--against", default=None, metavar="BASE",
                   help="the baseline FILE patches: report only what it adds, and check the timing boundary")
    p.add_argument("--contract", default=None,
                   help="contract for allowed precisions and protected paths (default: ./infrarsi.toml if any)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    p = verbs.add_parser("audit", help="re-verify every stored execution with today's rules: `infrarsi audit LEDGER.db`")
    p.add_argument("ledger", metavar="LEDGER.db")
    p.add_argument("--contract", default=None, help="judge by this (newer) contract instead of the stored ones")
    p.add_argument("--key", default=None, metavar="HEX",
                   help="the public key to trust (default: the one the manifest beside the ledger pins)")
    p.add_argument("--rejudge-all", action="store_true",
                   help="re-run the source rules even where today's exact rule code stored the verdict")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    p = verbs.add_parser("report", help="Markdown + self-contained HTML report from the ledger alone")
    _common(p)
    p.add_argument("--ledger", default=None, metavar="LEDGER.db",
                   help="the ledger to report on (default: the contract's .infrarsi/ledger.db)")
    p.add_argument("--out", default=None, metavar="DIR", help="where to write it (default: .infrarsi/report/)")

    p = verbs.add_parser("apply", help="write a verified candidate into the workspace: a git branch or a patch file")
    _common(p)
    p.add_argument("receipt", nargs="?", default=None, metavar="RECEIPT_ID",
                   help="a receipt id (or unique prefix, or a receipt .json); default: the best verified one")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--branch", default=None, metavar="NAME",
                       help="a new branch with one commit (default in a git work tree: infrarsi/<receipt id>)")
    where.add_argument("--patch-file", default=None, metavar="FILE",
                       help="write the combined patch here instead (default outside git: .infrarsi/apply/<id>.diff)")

    p = verbs.add_parser("gate", help="CI: pass a speed change only with a full receipt (carried, or measured here)")
    _common(p)
    p.add_argument("--base", default=None, metavar="REF", help="the pull request's base (e.g. origin/main)")
    p.add_argument("--head", default=None, metavar="REF", help="the pull request's head (e.g. HEAD)")
    p.add_argument("--patch", default=None, metavar="FILE", help="judge this patch on top of --base (default HEAD)")
    p.add_argument("--trusted-keys", default=None, metavar="FILE",
                   help="public keys whose receipts pass without a rerun (default: infrarsi-trusted-keys at the base)")
    p.add_argument("--rerun", action="store_true", help="measure here even when a carried receipt verifies")
    p.add_argument("--runs", type=int, default=3, help="baseline runs when measuring here (default 3)")
    p.add_argument("--pairs", type=int, default=None, help="A/B pairs when measuring here (default: the contract's)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KNOB=VALUE",
                   help="launch settings to measure with (default: a carried receipt's)")
    p.add_argument("--out", default=None, metavar="DIR", help="where a receipt made here is kept (default ./infrarsi-gate)")
    p.add_argument("--summary", default=None, metavar="FILE",
                   help="also append the Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")

    p = verbs.add_parser("demo", help="the bundled workload through every stage built so far")
    p.add_argument("--dir", default=None, help="where to copy the workload (default: ./infrarsi-demo)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser


def _emit(args, payload: dict, human: str) -> None:
    if args.json:
        print(json.dumps(payload, sort_keys=True))
    else:
        print(human)


def _progress(args, label: str):
    """A rich progress bar on a TTY; quiet under --json or when piped."""
    if args.json or not sys.stderr.isatty():
        return None
    from infrarsi._progress import ProgressBar

    return ProgressBar(label)


def _cmd_init(args) -> int:
    from infrarsi._workspace import init

    result = init(args.contract, force=args.force)
    lines = [f"initialised {result.state_dir}",
             f"  ledger    {result.ledger}",
             f"  manifest  {result.manifest} (sha256 {result.manifest_sha256[:16]}...)",
             f"  pinned    {len(result.pinned)} file(s): {', '.join(sorted(result.pinned))}"]
    if result.archived:
        lines.append(f"  previous state archived in {result.archived}")
    lines.append("next: infrarsi baseline")
    _emit(args, result.to_json(), "\n".join(lines))
    return EXIT_OK


def _cmd_baseline(args) -> int:
    from infrarsi._baseline import BaselineFailed, baseline

    bar = _progress(args, "baseline")
    try:
        with bar or _Null():
            summary = baseline(args.contract, runs=args.runs, progress=bar.update if bar else None)
    except BaselineFailed as exc:
        print(f"infrarsi: baseline failed: {exc}", file=sys.stderr)
        if args.json:
            # The DESIGN.md keys, null where nothing was measured, and why.
            print(json.dumps({"runs": 0, "step_time_s": None, "tokens_per_s": None, "peak_mem_mb": None,
                              "mfu": None, "error": str(exc).splitlines()[0]}))
        return EXIT_REJECTED
    st = summary.step_time_s
    human = "\n".join([
        f"baseline over {summary.runs} run(s) (executions {summary.executions[0]}..{summary.executions[-1]})",
        f"  step time   {st['median'] * 1e3:.2f} ms median, CV {_pct(st['cv'])}, MAD {st['mad'] * 1e3:.3f} ms",
        f"  within-run  CV {_pct(summary.within_run_cv)}",
        f"  tokens/s    {_num(summary.tokens_per_s, '{:,.0f}')}",
        f"  peak memory {_num(summary.peak_mem_mb, '{:.0f} MB')}",
        f"  MFU         {_pct(summary.mfu)}",
        f"  reference   loss and grad-norm trajectories over {len(summary.reference['loss'])} steps stored",
    ] + _detectable(args.contract, st["cv"]))
    _emit(args, summary.to_json(), human)
    return EXIT_OK


def _detectable(contract_path, cv) -> list[str]:
    """The smallest speedup `verify` can see at this noise (docs/verification.md)."""
    if not cv:
        return []
    from infrarsi._contract import load_contract
    from infrarsi.verifiers import min_detectable_speedup

    search = load_contract(contract_path).search
    smallest = min_detectable_speedup(cv, search.ab_pairs, search.min_speedup)
    return [f"  detectable  speedups above about {smallest:.3f}x with ab_pairs = {search.ab_pairs} at this noise"]


def _cmd_run(args) -> int:
    from infrarsi._workspace import run

    outcome = run(args.contract, sets=args.sets, patches=args.patches)
    human = (f"execution {outcome.execution}: {outcome.status}"
             + (f", step {outcome.step_time_s * 1e3:.2f} ms" if outcome.step_time_s else "")
             + (f", peak {outcome.peak_mem_mb:.0f} MB" if outcome.peak_mem_mb else "")
             + (f"\n  {outcome.detail}" if outcome.detail else ""))
    _emit(args, outcome.to_json(), human)
    return EXIT_OK if outcome.status == "ok" else EXIT_REJECTED


def _cmd_verify(args) -> int:
    from infrarsi._verify import verify

    bar = _progress(args, "verify")
    with bar or _Null():
        outcome = verify(args.contract, sets=args.sets, patches=args.patches, pairs=args.pairs,
                         progress=bar.update if bar else None, keep_going=args.keep_going)
    width = max(len(c.id) for c in outcome.checks)
    lines = [f"{'ACCEPTED' if outcome.accepted else 'REJECTED'}: knobs {outcome.candidate['knobs']}, "
             f"patches {outcome.candidate['patches'] or 'none'}"]
    lines += [f"  {c.status:9} {c.id:{width}}  {c.detail}" for c in outcome.checks]
    if outcome.speedup:
        sp = outcome.speedup
        lines.append(f"  speedup {sp['median']:.3f}x, 95% CI [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]")
    if outcome.receipt:
        lines.append(f"  receipt {outcome.receipt}")
    _emit(args, outcome.to_json(), "\n".join(lines))
    return EXIT_OK if outcome.accepted else EXIT_REJECTED


def _cmd_search(args) -> int:
    from infrarsi.search import search, search_summary

    if args.budget is not None and args.budget < 1:
        raise _usage(f"--budget {args.budget}: expected a positive number of executions")
    from infrarsi._progress import SearchProgress

    bar = None if args.json or not sys.stderr.isatty() else SearchProgress()
    with bar or _Null():
        outcome = search(args.contract, budget=args.budget, resume=args.resume, pack=args.pack, seed=args.seed,
                         progress=bar.update if bar else None)
    _emit(args, outcome.to_json(), search_summary(outcome))
    return EXIT_OK if outcome.best else EXIT_REJECTED


def _cmd_pack(args) -> int:
    from infrarsi.search import export_pack

    path, pack = export_pack(args.contract, args.out)
    human = (f"pack {path}: {len(pack['findings'])} verified finding(s), {len(pack['runs'])} run(s), "
             f"measured on {pack['hardware'].get('cpu') or pack['hardware'].get('device') or 'this machine'}")
    _emit(args, {"pack": str(path), "findings": len(pack["findings"]), "runs": len(pack["runs"])}, human)
    return EXIT_OK


def _usage(message: str):
    from infrarsi._candidate import UsageError

    return UsageError(message)


def _cmd_receipt(args) -> int:
    from infrarsi._receipt import verify_receipt

    key, source = _receipt_key(args.path, args.key)
    check = verify_receipt(args.path, trusted_public_hex=key)
    trust = {"--key": "the key given with --key", "manifest": "the key the manifest beside it pins",
             "receipt": "its own key only (no manifest beside it: pass --key to pin one)"}[source]
    human = (f"receipt {check.receipt_id}: valid, signed by {trust}" if check.ok
             else "receipt INVALID:\n" + "\n".join(f"  {p}" for p in check.problems))
    _emit(args, {**check.to_json(), "trusted_key": key, "key_source": source}, human)
    return EXIT_OK if check.ok else EXIT_REJECTED


def _receipt_key(path: str, given: str | None) -> tuple[str | None, str]:
    """The key a receipt must be signed by: --key, else the manifest of the workspace it sits in."""
    import re
    from pathlib import Path

    if given is not None:
        if not re.fullmatch(r"[0-9a-f]{64}", given):
            raise _usage(f"--key {given[:20]!r}: expected an Ed25519 public key as 64 lowercase hex digits")
        return given, "--key"
    from infrarsi._manifest import MANIFEST_NAME, load_manifest

    manifest = Path(path).resolve().parent.parent / MANIFEST_NAME   # .infrarsi/receipts/ID.json
    if manifest.is_file():
        return load_manifest(manifest).public_key, "manifest"
    return None, "receipt"


def _cmd_lint(args) -> int:
    from infrarsi._lint import lint

    report = lint(args.file, against=args.against, contract=args.contract)
    lines = [str(f) for f in report.findings]
    rules = f"against {report.against}" if report.against else "standalone"
    lines.append(f"{len(report.findings)} finding(s) in {report.file} ({rules}; contract: "
                 f"{report.contract or 'none, fp32 only'})")
    _emit(args, report.to_json(), "\n".join(lines))
    return EXIT_OK if report.clean else EXIT_REJECTED


def _cmd_audit(args) -> int:
    from infrarsi._reaudit import audit_ledger

    bar = _progress(args, "audit")
    with bar or _Null():
        report = audit_ledger(args.ledger, contract_path=args.contract, trusted_key=args.key,
                              reuse=not args.rejudge_all,
                              progress=(lambda done, total: bar.update(done, total, None)) if bar else None)
    if args.json:
        print(json.dumps(report.to_json(), sort_keys=True))
    else:
        from infrarsi._audit_table import print_report

        print_report(report)
    return EXIT_OK if report.clean else EXIT_REJECTED


def _cmd_report(args) -> int:
    from infrarsi.report import report

    outcome = report(args.contract, ledger=args.ledger, out=args.out)
    lines = [f"report {outcome.html}", f"  markdown  {outcome.markdown} (plots beside it: {len(outcome.plots)})",
             f"  ledger    {outcome.executions} execution(s), chain {'ok' if outcome.chain_ok else 'BROKEN'}"]
    for p in outcome.promoted:
        lines.append(f"  promoted  {p['speedup']['median']:.3f}x  receipt {p['receipt']}")
    if not outcome.promoted:
        lines.append("  promoted  none")
    lines += [f"  INVALID receipt {b['receipt']}: {'; '.join(b['problems'])}" for b in outcome.bad_receipts]
    _emit(args, outcome.to_json(), "\n".join(lines))
    return EXIT_OK if outcome.ok else EXIT_REJECTED


def _cmd_apply(args) -> int:
    from infrarsi._apply import ApplyRefused, apply

    try:
        outcome = apply(args.contract, receipt=args.receipt, branch=args.branch, patch_file=args.patch_file)
    except ApplyRefused as exc:
        print(f"infrarsi apply: refused: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(exc), "exit_code": EXIT_REJECTED, "applied": False}, sort_keys=True))
        return EXIT_REJECTED
    sp = outcome.speedup
    lines = [f"applied receipt {outcome.receipt}: {sp['median']:.3f}x (95% CI {sp['ci_low']:.3f}-{sp['ci_high']:.3f})",
             f"  changes   {', '.join(outcome.changes) or 'none'}"]
    if outcome.branch:
        lines += [f"  branch    {outcome.branch} (commit {outcome.commit[:12]}, receipt bundle {outcome.bundle})",
                  f"  next      git switch {outcome.branch}   (your checkout was not touched)"]
    else:
        lines += [f"  patch     {outcome.patch_file}", f"  next      {outcome.apply_command}"]
    lines.append(f"  launch    {outcome.launch['shell']}")
    _emit(args, {**outcome.to_json(), "applied": True}, "\n".join(lines))
    return EXIT_OK


def _cmd_gate(args) -> int:
    from infrarsi._candidate import parse_sets
    from infrarsi._gate import gate

    if args.runs < 1:
        raise _usage(f"--runs {args.runs}: expected at least 1")
    bar = _progress(args, "gate")
    with bar or _Null():
        outcome = gate(args.contract, base=args.base, head=args.head, patch=args.patch,
                       trusted_keys=args.trusted_keys, rerun=args.rerun, runs=args.runs, pairs=args.pairs,
                       sets=parse_sets(args.sets), out=args.out, progress=bar.update if bar else None)
    text = outcome.markdown()
    if args.summary:
        try:
            with open(args.summary, "a", encoding="utf-8") as handle:
                handle.write(text + "\n")
        except OSError as exc:
            raise _usage(f"--summary {args.summary}: cannot write it: {exc.strerror or exc}") from None
    _emit(args, outcome.to_json(), text.rstrip())
    return EXIT_OK if outcome.passed else EXIT_REJECTED


def _cmd_demo(args) -> int:
    from infrarsi._demo import demo

    report = demo(args.dir, quiet=args.json)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    return EXIT_OK if report.get("ok") else EXIT_REJECTED


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _pct(value) -> str:
    return "n/a" if value is None else f"{value * 100:.2f}%"


def _num(value, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


_COMMANDS = {"init": _cmd_init, "baseline": _cmd_baseline, "run": _cmd_run, "verify": _cmd_verify,
             "search": _cmd_search, "pack": _cmd_pack, "receipt": _cmd_receipt, "lint": _cmd_lint, "audit": _cmd_audit,
             "report": _cmd_report, "apply": _cmd_apply, "gate": _cmd_gate,
             "demo": _cmd_demo}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    _Parser.argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return EXIT_USAGE
    import signal

    from infrarsi._errors import usage_errors

    def _terminated(signum, frame):  # kill, timeout, Slurm, docker stop: clean up as for ^C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminated)
    try:
        return _COMMANDS[args.verb](args)
    except usage_errors() as exc:
        print(f"infrarsi {args.verb}: error: {exc}", file=sys.stderr)
        if getattr(args, "json", False):  # --json promises one object on stdout, errors included
            print(json.dumps({"error": str(exc), "exit_code": EXIT_USAGE}, sort_keys=True))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"infrarsi {args.verb}: interrupted; executions that finished before are in the ledger", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
