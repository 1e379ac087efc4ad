"""Scoring a method's executions against a landscape's known optimum (pure)."""

from __future__ import annotations

import statistics

from infrarsi.examples.landscape import Landscape

__all__ = ["trajectory", "score_run", "summarise", "TARGET"]

TARGET = 0.95


def trajectory(land: Landscape, history: list[dict]) -> list[float]:
    """The pick's fraction of the optimum after each execution.

    The pick is the point with the best measured step time so far among ok runs (the
    baseline, at 1.0x, until something measures faster); its worth is its TRUE speedup.
    """
    optimum = land.optimum()
    best, pick = 1.0, ({name: base for name, (_, base) in land.knobs.items()}, [])
    out = []
    for entry in history:
        if entry["status"] == "ok" and entry["speedup"] and entry["speedup"] > best:
            best, pick = entry["speedup"], (entry["knobs"], entry["patches"])
        out.append(land.speedup(*pick) / optimum)
    return out


def score_run(land: Landscape, history: list[dict], budget: int) -> dict:
    fractions = trajectory(land, history)
    reached = next((i + 1 for i, f in enumerate(fractions) if f >= TARGET), None)
    statuses: dict[str, int] = {}
    mismatches = 0
    for entry in history:
        statuses[entry["status"]] = statuses.get(entry["status"], 0) + 1
        # The runner and the landscape must agree on what fits and what crashes.
        feasible = land.feasible(entry["knobs"], entry["patches"])
        mismatches += (entry["status"] == "ok") != feasible and entry["status"] in ("ok", "oom", "crash")
    start = land.speedup({name: base for name, (_, base) in land.knobs.items()}, []) / land.optimum()
    return {
        "final": fractions[-1] if fractions else start,
        "to95": reached,
        "executions": len(history),
        "statuses": statuses,
        "mismatches": mismatches,
        "fractions": [round(f, 4) for f in fractions],
    }


def _median_to95(runs: list[dict], budget: int) -> float:
    return statistics.median(r["to95"] if r["to95"] is not None else budget + 1 for r in runs)


def summarise(runs: list[dict], budget: int) -> dict:
    """Median and worst final fraction, median executions to 95% (never = budget + 1), share reaching 95%."""
    finals = [r["final"] for r in runs]
    return {
        "seeds": len(runs),
        "median_fraction": statistics.median(finals),
        "worst_fraction": min(finals),
        "median_to95": _median_to95(runs, budget),
        "reached95": sum(r["to95"] is not None for r in runs),
        "mean_executions": statistics.fmean(r["executions"] for r in runs),
        "mean_oom": statistics.fmean(r["statuses"].get("oom", 0) for r in runs),
        "mean_crash": statistics.fmean(r["statuses"].get("crash", 0) for r in runs),
        "mismatches": sum(r["mismatches"] for r in runs),
    }
