"""TinyGPT's numerics across its knob settings: every pair of knob values, judged by `verify`.

The knobs are launch settings that must not change the training job: attention kernel,
activation checkpointing, micro-batch (gradient accumulation at a fixed global batch),
thread count, torch.compile, the optimizer's foreach path. All 96 combinations take too
long on a CPU (a compiled run compiles for over a minute), so this runs a pairwise
covering design: a greedy set of combinations in which every pair of values of two
different knobs appears together at least once. Each combination goes through
`infrarsi verify --pairs 0` against a stored baseline: the loss and grad-norm
trajectories within the contract's tolerances, precision observed, the timing window,
integrity. The memory cliff the contract is built around (checkpointing off at
micro-batch 16 runs out of memory) is left out of the design and run once on its own,
expected to end `oom`.

    python benchmarks/knob_numerics.py [--without compile] [--warmup 2 --measure 8] [--json]

Exit 0 when every combination passed and the cliff ran out of memory; 1 otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import infrarsi
from infrarsi import init
from infrarsi.contract._contract import load_contract
from infrarsi.ledger import Ledger

TINYGPT = Path(infrarsi.__file__).resolve().parents[1] / "examples" / "tinygpt"
CLIFF = {"checkpoint": "off", "micro_batch": "16"}  # out of memory by design (see the contract)


def pairwise_cover(choices: dict[str, list[str]], excluded: dict[str, str]) -> list[dict[str, str]]:
    """Greedy pairwise covering design: every value pair of two knobs in some row (the first
    candidate wins ties, so the design is deterministic). Rows holding all of ``excluded``
    are left out, and so is the pair they share."""
    names = sorted(choices)
    rows = [dict(zip(names, values)) for values in itertools.product(*(choices[n] for n in names))]
    rows = [r for r in rows if not all(r.get(k) == v for k, v in excluded.items())]

    def pairs(row):
        return {((a, row[a]), (b, row[b])) for a, b in itertools.combinations(names, 2)}

    wanted = set().union(*(pairs(r) for r in rows))
    design = []
    while wanted:
        best = max(rows, key=lambda r: len(pairs(r) & wanted))
        design.append(best)
        wanted -= pairs(best)
    return design


def workspace(folder: Path, warmup: int, measure: int) -> Path:
    shutil.copytree(TINYGPT, folder, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    contract = folder / "infrarsi.toml"
    text = contract.read_text()
    text = text.replace("warmup_steps  = 5", f"warmup_steps  = {warmup}")
    text = text.replace("measure_steps = 15", f"measure_steps = {measure}")
    contract.write_text(text)
    return contract


def judge(contract: Path, knobs: dict[str, str]) -> dict:
    started = time.monotonic()
    outcome = infrarsi.verify(contract, sets=knobs, pairs=0)
    with Ledger.open(contract.parent / ".infrarsi" / "ledger.db") as ledger:
        row = ledger.get_execution(outcome.executions[-1])
    checks = [c for c in outcome.checks if c.id != "stats.speedup"]
    return {
        "knobs": knobs,
        "status": row["status"],
        "step_time_s": row.get("step_time_s"),
        "peak_mem_mb": row.get("peak_mem_mb"),
        "wall_s": round(time.monotonic() - started, 1),
        "passed": all(c.passed for c in checks),
        "failing": [f"{c.id}: {c.detail}" for c in checks if not c.passed],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="KNOB",
        help="hold this knob at its baseline (e.g. compile, which compiles for a minute per run)",
    )
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--measure", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="knob-numerics-") as tmp:
        contract = workspace(Path(tmp) / "tinygpt", args.warmup, args.measure)
        parsed = load_contract(contract)
        unknown = sorted(set(args.without) - set(parsed.knobs))
        if unknown:
            print(
                f"--without {', '.join(unknown)}: not a knob of {contract.name} "
                f"(expected one of {', '.join(sorted(parsed.knobs))})",
                file=sys.stderr,
            )
            return 2
        choices = {
            name: ([k.baseline] if name in args.without else list(k.choices)) for name, k in parsed.knobs.items()
        }
        init(contract)
        base = infrarsi.baseline(contract, runs=2)
        design = pairwise_cover(choices, CLIFF)
        rows = []
        for index, knobs in enumerate(design, 1):
            rows.append(judge(contract, knobs))
            if not args.json:
                r = rows[-1]
                print(
                    f"[{index}/{len(design)}] {' '.join(f'{k}={v}' for k, v in sorted(knobs.items()))}: "
                    f"{r['status']} {'PASS' if r['passed'] else 'FAIL'} "
                    f"{(r['step_time_s'] or 0) * 1000:.0f} ms/step, {r['wall_s']} s"
                    + "".join(f"\n    {f}" for f in r["failing"]),
                    flush=True,
                )
        cliff = judge(contract, {**parsed.baseline_knobs(), **CLIFF})
    covered = {
        ((a, r["knobs"][a]), (b, r["knobs"][b]))
        for r in rows
        if r["passed"]
        for a, b in itertools.combinations(sorted(r["knobs"]), 2)
    }
    report = {
        "baseline_step_s": base.step_time_s.get("median"),
        "baseline_peak_mb": base.peak_mem_mb,
        "design": len(design),
        "passed": sum(r["passed"] for r in rows),
        "pairs_covered": len(covered),
        "rows": rows,
        "cliff": cliff,
        "held_at_baseline": sorted(args.without),
    }
    ok = report["passed"] == len(rows) and cliff["status"] == "oom"
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(
            f"{report['passed']}/{len(rows)} combinations pass every correctness check; "
            f"{len(covered)} knob-value pairs covered; the cliff "
            f"({', '.join(f'{k}={v}' for k, v in CLIFF.items())}) ended {cliff['status']}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
