"""The sequential A/B on seeded simulated pairs: how often it passes and how many pairs it uses.

Each simulated A/B draws log-normal step times for the baseline and the candidate (run-to-run
noise ``cv``), then takes the looks `verify` takes (`verifiers/_sequential.py`, min_speedup
1.02) until one decides. Reported for an A/A (no speedup: a pass is a false pass) and a true
1.10x and 2x, at 1%, 3% and 13% noise, for the demo's plan (5 pairs, then one at a time to 8)
and a longer one (5 to 12).

    python benchmarks/sequential_ab.py [--trials 4000] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from infrarsi.verifiers import SequentialPlan, run_looks

MIN_SPEEDUP = 1.02


def simulate(true_speedup: float, cv: float, plan: SequentialPlan, trials: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    sigma = np.sqrt(np.log1p(cv * cv))
    passed = used = 0
    for _ in range(trials):
        base = np.exp(rng.normal(np.log(0.1), sigma, plan.max_pairs))
        cand = np.exp(rng.normal(np.log(0.1 / true_speedup), sigma, plan.max_pairs))
        decision = run_looks(list(base), list(cand), MIN_SPEEDUP, plan)
        passed += decision.status == "pass"
        used += decision.pairs
    return {"pass_rate": passed / trials, "mean_pairs": used / trials}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for first, most in ((5, 8), (5, 12)):
        plan = SequentialPlan(first, most)
        for cv in (0.01, 0.03, 0.13):
            for speedup in (1.0, 1.10, 2.0):
                found = simulate(speedup, cv, plan, args.trials, seed=int(cv * 1000) + int(speedup * 100) + most)
                rows.append({"plan": f"{first} to {most}", "noise": cv, "true_speedup": speedup, **found})
    if args.json:
        print(json.dumps(rows))
        return 0
    print("| plan (pairs) | noise | true speedup | passes | mean pairs used |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['plan']} | {r['noise']:.0%} | {r['true_speedup']:.2f}x | {r['pass_rate']:.1%} "
            f"| {r['mean_pairs']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
