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

    python benchmarks/search_sim/run.py [--seeds 20] [--first-seed 0] [--budget 40] [--landscapes dense,moe]
        [--methods ours,ours+pack,random,greedy,tpe-config,tpe-joint] [--out results.json]
    python benchmarks/search_sim/run.py --merge part1.json part2.json   # disjoint seeds, one report
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import family  # noqa: E402
from _methods import Arena, greedy, ours, random_search, tpe  # noqa: E402
from _score import score_run, summarise  # noqa: E402

import infrarsi.examples.landscape as landscape  # noqa: E402
from infrarsi import init  # noqa: E402
from infrarsi._baseline import baseline  # noqa: E402
from infrarsi._search import export_pack, search  # noqa: E402

METHODS = ["ours", "ours+pack", "random", "greedy", "tpe-config", "tpe-joint"]
LABELS = {
    "ours": "infrarsi search",
    "ours+pack": "infrarsi search + pack",
    "random": "random",
    "greedy": "greedy one-at-a-time",
    "tpe-config": "TPE, knobs only",
    "tpe-joint": "TPE, knobs + patches",
}
PACK_SEED = 1000
BASELINE_RUNS = 3
# What a fresh search process has loaded: each unit of work runs in a fresh process forked
# from a server holding just these. The runner reports a job's peak memory as at least the
# driver's own RSS (the kernel's high-water mark of the forked child, see docs/benchmarks.md),
# so a driver grown by a hundred earlier searches would skew every later one.
PRELOAD = [
    "infrarsi._search",
    "infrarsi._workspace",
    "infrarsi._init",
    "infrarsi._run",
    "infrarsi._baseline",
    "infrarsi.examples.landscape",
]


def build(name: str, overhead_mb: float, other_hardware: bool = False) -> landscape.Landscape:
    """A landscape (``dense``, ``moe``, or ``gen-N``: the generated family's number N), its
    memory limit placed for the job's measured overhead."""
    landscape.OVERHEAD_MB = overhead_mb
    land = family.generate(int(name[4:])) if name.startswith("gen-") else getattr(landscape, name)()
    return related(land) if other_hardware else land


def related(land: landscape.Landscape) -> landscape.Landscape:
    """The same workload on other hardware: every time factor off by up to 5%, a 1.3x slower step.

    Memory, and so the limit, stay as they are (``replace`` would place the limit afresh
    around the one already placed, possibly in another gap).
    """
    rng = random.Random(f"{land.name}-related")
    jittered = {key: factor * rng.uniform(0.95, 1.05) for key, factor in sorted(land.time.items())}
    other = dataclasses.replace(land, time=jittered, base_ms=land.base_ms * 1.3)
    other.limit_mb = land.limit_mb
    return other


def calibrate_overhead(root: str) -> float:
    """The job's memory beyond what it allocates (interpreter, probe), as the runner's guard sees it.

    The landscape assumes ``OVERHEAD_MB``; if the real figure differs, a point the landscape
    calls out of memory may run (or the reverse), and the truth would not be the truth. The
    job allocates 400 MB here, more than the driver holds, so its own RSS is what is read.
    """
    land = dataclasses.replace(landscape.dense(), base_mb=400.0, limit_mb=1000.0)
    folder = landscape.make_workspace(Path(root) / "calibrate", land)
    init(folder / "infrarsi.toml")
    summary = baseline(folder / "infrarsi.toml", runs=1)
    shutil.rmtree(folder)
    return round(summary.peak_mem_mb - land.base_mb, 1)


def template(name: str, overhead_mb: float, folder: str, other_hardware: bool = False) -> dict:
    """Write, initialise and baseline a landscape's workspace."""
    land = build(name, overhead_mb, other_hardware)
    landscape.make_workspace(folder, land)
    init(Path(folder) / "infrarsi.toml")
    summary = baseline(Path(folder) / "infrarsi.toml", runs=BASELINE_RUNS)
    return {
        "step_s": summary.step_time_s["median"],
        "recorded_peak_mb": summary.peak_mem_mb,
        "true_peak_mb": land.base_mb + overhead_mb,
    }


def make_pack(name: str, overhead_mb: float, root: str) -> tuple[str, dict]:
    """One full search, promotion included, on the related landscape; its exported pack."""
    land, folder = build(name, overhead_mb), Path(root) / f"{name}-related"
    template(name, overhead_mb, str(folder), other_hardware=True)
    outcome = search(folder / "infrarsi.toml", budget=40, seed=PACK_SEED, promote=True)
    path, pack = export_pack(folder / "infrarsi.toml", Path(root) / f"{name}-pack.json")
    best = outcome.best
    return str(path), {
        "findings": len(pack["findings"]),
        "runs": len(pack["runs"]),
        "best": best and {"knobs": best["knobs"], "patches": best["patches"], "speedup": best["speedup"]["median"]},
        "best_true_fraction_here": best and land.speedup(best["knobs"], best["patches"]) / land.optimum(),
    }


def run_method(
    name: str,
    overhead_mb: float,
    method: str,
    seed: int,
    base: dict,
    template_folder: str,
    folder: str,
    budget: int,
    pack: str | None,
) -> dict:
    """One (method, seed) run in a copy of the template workspace, scored."""
    land = build(name, overhead_mb)
    shutil.copytree(template_folder, folder)
    arena = Arena(land, Path(folder) / "infrarsi.toml", base["step_s"], budget)
    extra: dict = {}
    if method == "ours":
        history = ours(arena, seed)
    elif method == "ours+pack":
        history = ours(arena, seed, pack=Path(pack))
    elif method == "random":
        history = random_search(arena, seed)
    elif method == "greedy":
        history = greedy(arena, seed)
    else:
        history, extra["repeats_answered"] = tpe(arena, seed, joint=method == "tpe-joint")
    shutil.rmtree(folder)
    return {
        "seed": seed,
        **score_run(land, history, budget),
        **extra,
        "history": [
            {
                "status": h["status"],
                "speedup": h["speedup"] and round(h["speedup"], 4),
                "knobs": h["knobs"],
                "patches": h["patches"],
                **({"origin": h["origin"]} if "origin" in h else {}),
            }
            for h in history
        ],
    }


def bench_landscape(
    pool, name: str, overhead_mb: float, methods: list[str], seeds: range, budget: int, root: Path, started: float
) -> dict:
    land = build(name, overhead_mb)
    base_folder = str(root / f"{name}-template")
    base = pool.apply(template, (name, overhead_mb, base_folder))
    pack, pack_info = pool.apply(make_pack, (name, overhead_mb, str(root))) if "ours+pack" in methods else (None, None)
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    # Seeds outermost, so the shared machine's load falls on every method alike.
    for seed in seeds:
        for method in methods:
            scored = pool.apply(
                run_method,
                (
                    name,
                    overhead_mb,
                    method,
                    seed,
                    base,
                    base_folder,
                    str(root / f"{name}-{method}-{seed}"),
                    budget,
                    pack,
                ),
            )
            runs[method].append(scored)
            print(
                f"[{time.time() - started:7.1f} s] {name} {method} seed {seed}: "
                f"final {scored['final']:.3f}, 95% at {scored['to95'] or '>' + str(budget)}, "
                f"{scored['statuses']}",
                file=sys.stderr,
                flush=True,
            )
    best, grid = land.best_point(), land.grid()
    return {
        "landscape": land.name,
        "optimum": land.optimum(),
        "optimum_point": {"knobs": best[0], "patches": best[1]},
        "points": int(grid.masks.size),
        "feasible": int(grid.feasible().sum()),
        "limit_mb": land.limit_mb,
        "baselines": [base],
        "packs": [pack_info],
        "summary": {m: summarise(r, budget) for m, r in runs.items()},
        "runs": runs,
    }


def verdicts(result: dict, budget: int) -> list[str]:
    s = result["summary"]
    out = []
    if "ours" in s:
        worst = s["ours"]["worst_fraction"]
        out.append(
            f"worst seed >= 95% of the optimum within {budget}: "
            f"{'MET' if worst >= 0.95 else 'MISSED'} (worst final {worst:.3f}, "
            f"{s['ours']['reached95']}/{s['ours']['seeds']} seeds reached 95%)"
        )
    if "ours" in s and "tpe-joint" in s:
        mine, theirs = s["ours"]["median_to95"], s["tpe-joint"]["median_to95"]
        out.append(
            f"median executions to 95% <= 2/3 of joint TPE's: "
            f"{'MET' if mine <= theirs * 2 / 3 else 'MISSED'} ({_execs(mine, budget)} vs "
            f"{_execs(theirs, budget)}; 2/3 is {theirs * 2 / 3:.1f})"
        )
    if "ours" in s and "ours+pack" in s:
        a, b = s["ours"], s["ours+pack"]
        out.append(
            f"with the pack: median executions to 95% {_execs(a['median_to95'], budget)} -> "
            f"{_execs(b['median_to95'], budget)}, worst fraction {a['worst_fraction']:.3f} -> "
            f"{b['worst_fraction']:.3f}, seeds reaching 95% {a['reached95']} -> {b['reached95']}"
        )
    return out


def _execs(value: float, budget: int) -> str:
    return f">{budget}" if value > budget else f"{value:g}"


def table(result: dict, budget: int) -> str:
    lines = [
        "| method | median fraction | worst fraction | median execs to 95% | seeds reaching 95% "
        "| OOM / crash per seed |",
        "|---|---|---|---|---|---|",
    ]
    for method, s in result["summary"].items():
        lines.append(
            f"| {LABELS[method]} | {s['median_fraction']:.3f} | {s['worst_fraction']:.3f} | "
            f"{_execs(s['median_to95'], budget)} | {s['reached95']}/{s['seeds']} | "
            f"{s['mean_oom']:.1f} / {s['mean_crash']:.1f} |"
        )
    return "\n".join(lines)


def report(doc: dict) -> str:
    """The Markdown report of a result document (one run's, or several merged)."""
    budget = doc["budget"]
    out = [
        " and ".join(f"`{c}`" for c in doc["commands"])
        + f" on {doc['cores']} cores (Python {doc['python']}), job memory overhead measured at "
        + ", ".join(f"{o} MB" for o in doc["overhead_mb"])
        + "\n"
    ]
    for name, result in doc["landscapes"].items():
        seeds = sorted(r["seed"] for r in next(iter(result["runs"].values())))
        out.append(
            f"### {name}: optimum {result['optimum']:.3f}x, {result['feasible']}/{result['points']} points "
            f"feasible, seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}), budget {budget}\n"
        )
        out.append(table(result, budget) + "\n")
        out += [f"- {line}" for line in verdicts(result, budget)]
        for pack in result["packs"]:
            if pack:
                worth = (
                    f"its promoted best is worth {pack['best_true_fraction_here']:.3f} of this optimum"
                    if pack["best"]
                    else "nothing was promoted"
                )
                out.append(f"- pack: {pack['findings']} verified finding(s), {pack['runs']} runs; {worth}")
        out.append(f"- wall time {result['wall_s']:.0f} s\n")
    out.append(f"total wall time {doc['wall_s']:.0f} s ({doc['wall_s'] / 60:.1f} min)")
    return "\n".join(out)


def merge(docs: list[dict]) -> dict:
    """Result documents of the same benchmark over disjoint seeds, as one."""
    if len({d["budget"] for d in docs}) != 1:
        raise SystemExit("--merge: the results have different budgets")
    merged = {
        "commands": [c for d in docs for c in d["commands"]],
        "cores": docs[0]["cores"],
        "python": docs[0]["python"],
        "budget": docs[0]["budget"],
        "overhead_mb": [o for d in docs for o in d["overhead_mb"]],
        "wall_s": round(sum(d["wall_s"] for d in docs), 1),
        "landscapes": {},
    }
    for doc in docs:
        for name, result in doc["landscapes"].items():
            into = merged["landscapes"].setdefault(
                name, {**result, "runs": {}, "packs": [], "baselines": [], "wall_s": 0.0}
            )
            into["packs"] += result["packs"]
            into["baselines"] += result["baselines"]
            into["wall_s"] += result["wall_s"]
            for method, runs in result["runs"].items():
                seen = {r["seed"] for r in into["runs"].get(method, [])}
                if seen & {r["seed"] for r in runs}:
                    raise SystemExit(f"--merge: {name} {method}: a seed appears in two results")
                into["runs"][method] = sorted(into["runs"].get(method, []) + runs, key=lambda r: r["seed"])
    for result in merged["landscapes"].values():
        result["summary"] = {m: summarise(r, merged["budget"]) for m, r in result["runs"].items()}
    return merged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0, help="run seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--landscapes", default="dense,moe")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", type=Path, help="write every run (history, trajectory) as JSON here")
    ap.add_argument("--work", type=Path, help="folder for the workspaces (default: a temporary one, removed)")
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="RESULTS",
        help="run nothing: report the --out files of runs over disjoint seeds as one",
    )
    args = ap.parse_args(argv)
    if args.merge:
        doc = merge([json.loads(path.read_text()) for path in args.merge])
    else:
        methods = [m for m in args.methods.split(",") if m]
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            ap.error(f"--methods: unknown {', '.join(unknown)}; expected some of {', '.join(METHODS)}")
        command = "python benchmarks/search_sim/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
        doc = bench(
            methods,
            range(args.first_seed, args.first_seed + args.seeds),
            args.budget,
            args.landscapes.split(","),
            args.work,
            command.strip(),
        )
    print(report(doc))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1, default=str))
    return 0


def bench(methods: list[str], seeds: range, budget: int, names: list[str], work: Path | None, command: str) -> dict:
    """Every landscape, method and seed; the result document."""
    started = time.time()
    root = work or Path(tempfile.mkdtemp(prefix="search-sim-"))
    root.mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    try:
        with context.Pool(1, maxtasksperchild=1) as pool:
            overhead = pool.apply(calibrate_overhead, (str(root),))
            print(f"memory overhead of the job, measured: {overhead} MB", file=sys.stderr)
            results = {}
            for name in names:
                began = time.time()
                result = bench_landscape(pool, name, overhead, methods, seeds, budget, root, started)
                result["wall_s"] = round(time.time() - began, 1)
                results[result["landscape"]] = result
    finally:
        if work is None:
            shutil.rmtree(root, ignore_errors=True)
    return {
        "commands": [command],
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "budget": budget,
        "overhead_mb": [overhead],
        "wall_s": round(time.time() - started, 1),
        "landscapes": results,
    }


if __name__ == "__main__":
    sys.exit(main())
