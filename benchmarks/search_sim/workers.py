"""`infrarsi search --workers N` on the synthetic landscapes: executions and wall time to 95% of the optimum.

The landscapes' jobs sleep (their contract says ``timing_sensitive = false``), so 4 or 8 at once
are honest on 2 cores. For each landscape, seed and worker count, one exploration-only search
(``promote=False``) of ``--budget`` executions in a copy of the baselined template; scored as
`run.py` scores (the pick after each execution is the best measured point so far, worth its
true speedup). Wall time to 95% is from the search's start to the moment the execution that
first brought the pick to 95% was recorded.

    python benchmarks/search_sim/workers.py [--seeds 20] [--workers 1,4,8] [--budget 40] [--landscapes dense,moe]
        [--step-ms 250] [--out results.json]

Goal (issue 28): at 4 workers, 95% reached in at most 1/3 of the sequential wall time, with at
most 1.25x the executions, and the worst seed still at least 95% of the optimum.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _score import score_run  # noqa: E402
from run import BASELINE_RUNS, build, calibrate_overhead  # noqa: E402

import infrarsi.examples.landscape as landscape  # noqa: E402
from infrarsi import init  # noqa: E402
from infrarsi._baseline import baseline  # noqa: E402
from infrarsi._search import search  # noqa: E402


def slowed(name: str, overhead_mb: float, step_ms: float | None):
    """The landscape with its base step at ``step_ms`` (the job sleeps longer, the shape is the same)."""
    land = build(name, overhead_mb)
    if step_ms:
        land.base_ms = step_ms
    return land


def template(land, folder: Path) -> None:
    landscape.make_workspace(folder, land)
    init(folder / "infrarsi.toml")
    baseline(folder / "infrarsi.toml", runs=BASELINE_RUNS)


def one(land, seed: int, workers: int, budget: int, template_folder: str, root: Path) -> dict:
    folder = root / f"{land.name}-{seed}-{workers}"
    shutil.copytree(template_folder, folder)
    seen: dict[int, float] = {}
    started = time.monotonic()

    def progress(phase, launched, budget, last):
        if phase == "explore" and not last.endswith("sent"):
            seen.setdefault(launched, time.monotonic() - started)

    outcome = search(
        folder / "infrarsi.toml", budget=budget, seed=seed, promote=False, workers=workers, progress=progress
    )
    wall = time.monotonic() - started
    history = [{k: h[k] for k in ("status", "speedup", "knobs", "patches")} for h in outcome.history]
    scored = score_run(land, history, len(history))
    reached = scored["to95"]
    shutil.rmtree(folder)
    return {
        "seed": seed,
        "workers": workers,
        "final": scored["final"],
        "to95": reached,
        "seconds_to95": seen.get(reached) if reached else None,
        "executions": len(history),
        "wall_s": round(wall, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--workers", default="1,4,8")
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--landscapes", default="dense,moe")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--step-ms",
        type=float,
        default=None,
        help="the landscapes' base step (default theirs, 24-30 ms): longer makes the sleep, not the runner's "
        "own work per execution, the cost, as on a real job",
    )
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    report: dict = {"budget": args.budget, "seeds": args.seeds, "landscapes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        overhead = calibrate_overhead(tmp)
        for name in args.landscapes.split(","):
            folder = root / f"{name}-template"
            land = slowed(name, overhead, args.step_ms)
            template(land, folder)
            rows = []
            for seed in range(args.seeds):
                for workers in counts:
                    row = one(land, seed, workers, args.budget, str(folder), root)
                    rows.append(row)
                    print(json.dumps({"landscape": name, **row}), flush=True)
            report["landscapes"][name] = {"rows": rows, "summary": summarise(rows, counts)}
    print_table(report, counts)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


def summarise(rows: list[dict], counts: list[int]) -> dict:
    out = {}
    for workers in counts:
        mine = [r for r in rows if r["workers"] == workers]
        hit = [r for r in mine if r["to95"] is not None]
        out[workers] = {
            "reached95": len(hit),
            "median_executions_to95": statistics.median(r["to95"] for r in hit) if hit else None,
            "median_seconds_to95": statistics.median(r["seconds_to95"] for r in hit) if hit else None,
            "worst_final": min(r["final"] for r in mine),
            "median_final": statistics.median(r["final"] for r in mine),
            "median_wall_s": statistics.median(r["wall_s"] for r in mine),
        }
    return out


def print_table(report: dict, counts: list[int]) -> None:
    print(
        "| landscape | workers | reached 95% | median executions to 95% | median s to 95% | median s, whole budget |"
        " worst final | median final |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, data in report["landscapes"].items():
        for workers in counts:
            s = data["summary"][workers]
            print(
                f"| {name} | {workers} | {s['reached95']}/{report['seeds']} | {s['median_executions_to95']} | "
                f"{s['median_seconds_to95'] and round(s['median_seconds_to95'], 1)} | {s['median_wall_s']} | "
                f"{s['worst_final']:.3f} | {s['median_final']:.3f} |"
            )


if __name__ == "__main__":
    sys.exit(main())
