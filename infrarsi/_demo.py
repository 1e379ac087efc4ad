"""`infrarsi demo`: the bundled workload taken through every stage built so far.

Today: init, baseline, a handful of runs that show what the runner records (real
speed patches, an out-of-memory cliff, the combination that gets past it), `verify`
of the best of them (every check, back-to-back A/B pairs, a signed receipt), and
`audit` of the demo's own ledger (every execution re-judged from stored evidence).
"""

from __future__ import annotations

import shutil
import sys
from importlib import resources
from pathlib import Path

from infrarsi._candidate import UsageError

__all__ = ["demo", "copy_workload", "DEMO_RUNS"]

DEFAULT_DIR = "infrarsi-demo"

# (label, knob settings, patches): each is skipped if the contract lacks what it names.
DEMO_RUNS: list[tuple[str, dict[str, str], list[str]]] = [
    ("sdpa attention", {"attention": "sdpa"}, []),
    ("batched heads alone (manual attention)", {}, ["batched-heads"]),
    ("batched heads + sdpa", {"attention": "sdpa"}, ["batched-heads"]),
    ("recomputation off alone", {"checkpoint": "off"}, []),
    ("recomputation off + smaller micro-batch", {"checkpoint": "off", "micro_batch": "8"}, []),
    ("two threads + foreach optimizer", {"threads": "2", "foreach": "1"}, []),
]


def copy_workload(dest: Path, name: str = "tinygpt") -> Path:
    """Copy a bundled example workload to ``dest``; returns the contract path."""
    source = resources.files("infrarsi.examples") / name
    with resources.as_file(source) as folder:
        shutil.copytree(folder, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "README.md"),
                        dirs_exist_ok=True)
    return dest / "infrarsi.toml"


def _pick_dir(requested: str | None) -> Path:
    if requested is not None:
        path = Path(requested)
        if path.exists() and any(path.iterdir()):
            raise UsageError(f"--dir {requested}: the folder exists and is not empty; pick a new one")
        return path
    path, n = Path(DEFAULT_DIR), 1
    while path.exists():  # never overwrite an earlier demo: its ledger is evidence too
        n += 1
        path = Path(f"{DEFAULT_DIR}-{n}")
    return path


def demo(directory: str | None = None, quiet: bool = False, runs: int = 3) -> dict:
    """Copy the bundled workload and take it through init, baseline and a few runs."""
    from rich.console import Console
    from rich.table import Table

    from infrarsi._baseline import BaselineFailed, baseline
    from infrarsi._contract import load_contract
    from infrarsi._workspace import init, run

    console = Console(stderr=True, quiet=quiet)
    folder = _pick_dir(directory)
    contract_path = copy_workload(folder)
    contract = load_contract(contract_path)
    console.print(f"[bold]1/5 define[/]: copied the bundled workload to {folder}/ and ran `infrarsi init`")
    result = init(contract_path)
    console.print(f"    pinned {len(result.pinned)} file(s) in a signed manifest; ledger {result.ledger}")

    console.print(f"[bold]2/5 diagnose[/]: `infrarsi baseline --runs {runs}`")
    report: dict = {"dir": str(folder), "ledger": str(result.ledger), "ok": False, "runs": []}
    bar = None
    if not quiet and sys.stderr.isatty():
        from infrarsi._progress import ProgressBar

        bar = ProgressBar("baseline")
    try:
        if bar:
            with bar:
                summary = baseline(contract_path, runs=runs, progress=bar.update)
        else:
            summary = baseline(contract_path, runs=runs)
    except BaselineFailed as exc:
        console.print(f"[red]baseline failed[/]: {exc}")
        report["error"] = str(exc)
        return report
    base = summary.step_time_s["median"]
    report["baseline"] = summary.to_json()
    console.print(f"    step {base * 1e3:.1f} ms (CV {summary.step_time_s['cv'] * 100:.1f}%), "
                  f"{summary.tokens_per_s:,.0f} tokens/s, peak {summary.peak_mem_mb:.0f} MB "
                  f"of {contract.resources.memory_limit_mb:.0f} MB, MFU {(summary.mfu or 0) * 100:.2f}%")

    console.print("[bold]3/5 explore[/]: single executions with `infrarsi run` (not evidence yet: "
                  "one run each, no checks)")
    table = Table("execution", "candidate", "status", "step ms", "vs baseline", "peak MB")
    for label, sets, patches in DEMO_RUNS:
        if any(k not in contract.knobs or v not in contract.knobs[k].choices for k, v in sets.items()) \
                or any(contract.patch(p) is None for p in patches):
            continue
        outcome = run(contract_path, sets=sets, patches=patches)
        ratio = base / outcome.step_time_s if outcome.step_time_s else None
        report["runs"].append({"label": label, **outcome.to_json(), "candidate": outcome.candidate,
                               "speedup_single_run": ratio})
        table.add_row(str(outcome.execution), label, outcome.status,
                      f"{outcome.step_time_s * 1e3:.1f}" if outcome.step_time_s else "—",
                      f"{ratio:.2f}x" if ratio else "—",
                      f"{outcome.peak_mem_mb:.0f}" if outcome.peak_mem_mb
                      else (f"> {contract.resources.memory_limit_mb:.0f}" if outcome.status == "oom" else "—"))
    console.print(table)
    report["verify"] = _verify_best(console, contract_path, contract, report["runs"])
    report["audit"] = _audit(console, result.ledger)
    console.print("what to look at next:\n"
                  f"  - the ledger: sqlite3 {result.ledger} 'select id, kind, status, step_time_s, "
                  f"peak_mem_mb, detail from executions'\n"
                  f"  - one more run: cd {folder} && infrarsi run --set KNOB=VALUE --patch NAME\n"
                  + (f"  - the receipt: infrarsi receipt verify {report['verify']['receipt']}"
                     if report["verify"] and report["verify"]["receipt"] else "  - no receipt this time"))
    report["ok"] = True
    return report


def _audit(console, ledger: Path) -> dict:
    """`infrarsi audit` of the demo's own ledger: every execution re-judged from stored evidence."""
    from infrarsi._reaudit import audit_ledger

    console.print(f"[bold]5/5 audit[/]: `infrarsi audit {ledger}`: the chain, every signature, and every "
                  "execution re-judged from the stored evidence alone")
    audited = audit_ledger(ledger)
    console.print(f"    chain {'ok' if audited.chain_ok else '[red]BROKEN[/]'}; {audited.executions} executions, "
                  f"{audited.previously_accepted} accepted when stored, {audited.now_rejected} rejected now; "
                  f"{len(audited.findings)} finding(s)")
    for finding in audited.findings[:5]:
        console.print(f"    execution {finding['execution']}: {finding['status']} {finding['check']}: "
                      f"{finding['detail']}")
    out = audited.to_json()
    return {k: out[k] for k in ("executions", "previously_accepted", "now_rejected", "rejected_only_by_numerics",
                                "chain_ok", "findings")}


def _verify_best(console, contract_path: Path, contract, runs: list[dict]) -> dict | None:
    """`infrarsi verify` on the fastest single run: checks, A/B pairs, a receipt if accepted."""
    from infrarsi._verify import verify

    done = [r for r in runs if r["status"] == "ok" and r["speedup_single_run"]]
    if not done:
        return None
    best = max(done, key=lambda r: r["speedup_single_run"])
    changed = {k: v for k, v in best["candidate"]["knobs"].items() if contract.knobs[k].baseline != v}
    console.print(f"[bold]4/5 verify[/]: `infrarsi verify` on the fastest, {best['label']}: every check, "
                  f"then {contract.search.ab_pairs} back-to-back A/B pairs")
    bar = None
    if sys.stderr.isatty() and not console.quiet:
        from infrarsi._progress import ProgressBar

        bar = ProgressBar("verify")
    if bar:
        with bar:
            outcome = verify(contract_path, sets=changed, patches=best["candidate"]["patches"], progress=bar.update)
    else:
        outcome = verify(contract_path, sets=changed, patches=best["candidate"]["patches"])
    failed = [c for c in outcome.checks if c.status != "pass"]
    sp = outcome.speedup
    console.print(f"    {'[green]ACCEPTED[/]' if outcome.accepted else '[red]REJECTED[/]'}: "
                  f"{len(outcome.checks) - len(failed)}/{len(outcome.checks)} checks pass"
                  + (f"; speedup {sp['median']:.2f}x, lower bound {sp['ci_low']:.2f}x" if sp else "")
                  + (f"; receipt {outcome.receipt}" if outcome.receipt else ""))
    for check in failed:
        console.print(f"    {check.status} {check.id}: {check.detail}")
    return outcome.to_json()
