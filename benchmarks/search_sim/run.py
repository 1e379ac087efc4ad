"""Search on synthetic landscapes with a known optimum: infrarsi's search against other methods.

Each landscape (``infrarsi.examples.landscape``: dense and MoE shapes, interactions,
an OOM cliff that needs a memory-saving partner, a crashing pair, timing noise) runs as
real executions of a cheap job through the runner. With the same exploration budget
and seeds, it compares: this search (``promote=False``); random search; one knob at a
time greedy; Optuna's TPE over the knobs alone; Optuna's TPE over knobs and patches;
and this search with a pack exported from one promoted search on a related landscape
(time factors jittered +-5%, base step 1.3x, as other hardware would be).

A method's pick after each execution is its best measured point so far (the baseline
until something measures faster), worth its TRUE speedup over the exhaustive optimum.

    python benchmarks/search_sim/run.py [--seeds 20] [--budget 40] [--landscapes dense,moe]
        [--methods ours,ours+pack,random,greedy,tpe-config,tpe-joint] [--out results.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import infrarsi.examples.landscape as landscape  # noqa: E402
from infrarsi._baseline import baseline  # noqa: E402
from infrarsi._workspace import init  # noqa: E402
from infrarsi.search import export_pack, search  # noqa: E402

from _methods import Arena, greedy, ours, random_search, tpe  # noqa: E402
from _score import score_run, summarise  # noqa: E402

METHODS = ["ours", "ours+pack", "random", "greedy", "tpe-config", "tpe-joint"]
LABELS = {"ours": "infrarsi search", "ours+pack": "infrarsi search + pack", "random": "random",
          "greedy": "greedy one-at-a-time", "tpe-config": "TPE, knobs only", "tpe-joint": "TPE, knobs + patches"}
PACK_SEED = 1000
BASELINE_RUNS = 3


def calibrate_overhead(root: Path) -> float:
    """The job's memory beyond what it allocates (interpreter, probe), as the runner's guard sees it.

    The landscape assumes ``OVERHEAD_MB``; if the real figure differs, a point the landscape
    calls out of memory may run (or the reverse), and the truth would not be the truth.
    """
    land = landscape.dense()
    folder = landscape.make_workspace(root / "calibrate", land)
    init(folder / "infrarsi.toml")
    summary = baseline(folder / "infrarsi.toml", runs=1)
    shutil.rmtree(folder)
    return round(summary.peak_mem_mb - land.base_mb, 1)


def related(land: landscape.Landscape) -> landscape.Landscape:
    """The same workload on other hardware: every time factor off by up to 5%, a 1.3x slower step."""
    rng = random.Random(f"{land.name}-related")
    jittered = {key: factor * rng.uniform(0.95, 1.05) for key, factor in sorted(land.time.items())}
    return dataclasses.replace(land, time=jittered, base_ms=land.base_ms * 1.3)


def template(land: landscape.Landscape, folder: Path) -> float:
    """Write, initialise and baseline a workspace; returns the baseline's median step time."""
    landscape.make_workspace(folder, land)
    init(folder / "infrarsi.toml")
    return baseline(folder / "infrarsi.toml", runs=BASELINE_RUNS).step_time_s["median"]


def make_pack(land: landscape.Landscape, root: Path) -> tuple[Path, dict]:
    """One full search, promotion included, on the related landscape; its exported pack."""
    other = related(land)
    folder = root / f"{land.name}-related"
    template(other, folder)
    outcome = search(folder / "infrarsi.toml", budget=40, seed=PACK_SEED, promote=True)
    path, pack = export_pack(folder / "infrarsi.toml", root / f"{land.name}-pack.json")
    best = outcome.best
    return path, {"findings": len(pack["findings"]), "runs": len(pack["runs"]),
                  "best": best and {"knobs": best["knobs"], "patches": best["patches"],
                                    "speedup": best["speedup"]["median"]},
                  "best_true_fraction_here": best and land.speedup(best["knobs"], best["patches"]) / land.optimum()}


def run_method(method: str, arena: Arena, seed: int, pack: Path | None) -> tuple[list[dict], dict]:
    extra: dict = {}
    if method == "ours":
        history = ours(arena, seed)
    elif method == "ours+pack":
        history = ours(arena, seed, pack=pack)
    elif method == "random":
        history = random_search(arena, seed)
    elif method == "greedy":
        history = greedy(arena, seed)
    else:
        history, extra["repeats_answered"] = tpe(arena, seed, joint=method == "tpe-joint")
    return history, extra


def bench_landscape(land: landscape.Landscape, methods: list[str], seeds: int, budget: int, root: Path,
                    started: float) -> dict:
    base_folder = root / f"{land.name}-template"
    base_step = template(land, base_folder)
    pack, pack_info = (make_pack(land, root) if "ours+pack" in methods else (None, None))
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    # Seeds outermost, so the shared machine's load falls on every method alike.
    for seed in range(seeds):
        for method in methods:
            folder = root / f"{land.name}-{method}-{seed}"
            shutil.copytree(base_folder, folder)
            arena = Arena(land, folder / "infrarsi.toml", base_step, budget)
            history, extra = run_method(method, arena, seed, pack)
            shutil.rmtree(folder)
            scored = {"seed": seed, **score_run(land, history, budget), **extra, "history": [
                {"status": h["status"], "speedup": h["speedup"] and round(h["speedup"], 4),
                 "knobs": h["knobs"], "patches": h["patches"], **({"origin": h["origin"]} if "origin" in h else {})}
                for h in history]}
            runs[method].append(scored)
            print(f"[{time.time() - started:7.1f} s] {land.name} {method} seed {seed}: "
                  f"final {scored['final']:.3f}, 95% at {scored['to95'] or '>' + str(budget)}, "
                  f"{scored['statuses']}", file=sys.stderr, flush=True)
    best = max(land.points(), key=lambda p: land.speedup(*p))
    return {"optimum": land.optimum(), "optimum_point": {"knobs": best[0], "patches": best[1]},
            "points": sum(1 for _ in land.points()), "feasible": sum(land.feasible(*p) for p in land.points()),
            "limit_mb": land.limit_mb, "baseline_step_s": base_step, "pack": pack_info,
            "summary": {m: summarise(r, budget) for m, r in runs.items()}, "runs": runs}


def verdicts(result: dict, budget: int) -> list[str]:
    s = result["summary"]
    out = []
    if "ours" in s:
        worst = s["ours"]["worst_fraction"]
        out.append(f"worst seed >= 95% of the optimum within {budget}: "
                   f"{'MET' if worst >= 0.95 else 'MISSED'} (worst final {worst:.3f}, "
                   f"{s['ours']['reached95']}/{s['ours']['seeds']} seeds reached 95%)")
    if "ours" in s and "tpe-joint" in s:
        mine, theirs = s["ours"]["median_to95"], s["tpe-joint"]["median_to95"]
        out.append(f"median executions to 95% <= 2/3 of joint TPE's: "
                   f"{'MET' if mine <= theirs * 2 / 3 else 'MISSED'} ({_execs(mine, budget)} vs "
                   f"{_execs(theirs, budget)}; 2/3 is {theirs * 2 / 3:.1f})")
    if "ours" in s and "ours+pack" in s:
        a, b = s["ours"], s["ours+pack"]
        out.append(f"with the pack: median executions to 95% {_execs(a['median_to95'], budget)} -> "
                   f"{_execs(b['median_to95'], budget)}, worst fraction {a['worst_fraction']:.3f} -> "
                   f"{b['worst_fraction']:.3f}, seeds reaching 95% {a['reached95']} -> {b['reached95']}")
    return out


def _execs(value: float, budget: int) -> str:
    return f">{budget}" if value > budget else f"{value:g}"


def table(result: dict, budget: int) -> str:
    lines = ["| method | median fraction | worst fraction | median execs to 95% | seeds reaching 95% "
             "| OOM / crash per seed |", "|---|---|---|---|---|---|"]
    for method, s in result["summary"].items():
        lines.append(f"| {LABELS[method]} | {s['median_fraction']:.3f} | {s['worst_fraction']:.3f} | "
                     f"{_execs(s['median_to95'], budget)} | {s['reached95']}/{s['seeds']} | "
                     f"{s['mean_oom']:.1f} / {s['mean_crash']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--landscapes", default="dense,moe")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", type=Path, help="write every run (history, trajectory) as JSON here")
    ap.add_argument("--work", type=Path, help="folder for the workspaces (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        ap.error(f"--methods: unknown {', '.join(unknown)}; expected some of {', '.join(METHODS)}")
    started = time.time()
    root = args.work or Path(tempfile.mkdtemp(prefix="search-sim-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        landscape.OVERHEAD_MB = calibrate_overhead(root)
        print(f"memory overhead of the job, measured: {landscape.OVERHEAD_MB} MB", file=sys.stderr)
        results = {}
        for name in args.landscapes.split(","):
            land, began = getattr(landscape, name)(), time.time()
            results[land.name] = bench_landscape(land, methods, args.seeds, args.budget, root, started)
            results[land.name]["wall_s"] = round(time.time() - began, 1)
    finally:
        if args.work is None:
            shutil.rmtree(root, ignore_errors=True)
    wall = time.time() - started
    command = "python benchmarks/search_sim/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"`{command.strip()}` on {os.cpu_count()} cores ({platform.python_version()}), "
          f"memory overhead calibrated to {landscape.OVERHEAD_MB} MB\n")
    for name, result in results.items():
        print(f"### {name}: optimum {result['optimum']:.3f}x, {result['feasible']}/{result['points']} points feasible, "
              f"{args.seeds} seeds, budget {args.budget}\n")
        print(table(result, args.budget) + "\n")
        for line in verdicts(result, args.budget):
            print(f"- {line}")
        if result["pack"]:
            pack = result["pack"]
            worth = (f"its promoted best is worth {pack['best_true_fraction_here']:.3f} of this optimum"
                     if pack["best"] else "nothing was promoted")
            print(f"- pack: {pack['findings']} verified finding(s), {pack['runs']} runs; {worth}")
        print(f"- wall time {result['wall_s']:.0f} s\n")
    print(f"total wall time {wall:.0f} s ({wall / 60:.1f} min)")
    if args.out:
        args.out.write_text(json.dumps({"command": command.strip(), "cores": os.cpu_count(), "seeds": args.seeds,
                                        "budget": args.budget, "overhead_mb": landscape.OVERHEAD_MB,
                                        "wall_s": round(wall, 1), "landscapes": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
