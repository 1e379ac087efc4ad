"""The report's plots, drawn with matplotlib (imported here only) as standalone SVG text.

SVG with its text drawn as paths: it needs no font, no file and no network, so the
same string goes inline into the HTML page and into a file beside the Markdown.
"""

from __future__ import annotations

import io

__all__ = ["best_so_far_svg", "memory_speed_svg", "ab_looks_svg", "convergence_svg"]

_STATUS_STYLE = {  # colour, marker: chosen to read in greyscale too
    "ok": ("#1b7837", "o"),
    "rejected": ("#e08214", "s"),
    "crash": ("#762a83", "X"),
    "timeout": ("#542788", "D"),
}


def _figure():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "path", "svg.hashsalt": "infrarsi", "font.size": 9})
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    return plt, fig, ax


def _svg(plt, fig) -> str:
    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # the XML prolog and doctype are not allowed inline in HTML


def _legend(ax) -> None:
    """Below the axes, so it never hides a point."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=8, frameon=False)


def best_so_far_svg(data) -> str:
    """Best verified speedup against executions, with each exploration run's single-run estimate."""
    plt, fig, ax = _figure()
    steps = data.best_so_far()
    base = (data.baseline or {}).get("step_time_s", {}).get("median")
    attempts = data.attempts()
    if base:
        # Candidate runs only: the A/B baseline runs are the baseline measured again.
        xs = [
            n
            for n, r in enumerate(attempts, start=1)
            if r["status"] == "ok" and r.get("step_time_s") and r.get("kind") not in ("ab-baseline", "long-baseline")
        ]
        ys = [base / attempts[n - 1]["step_time_s"] for n in xs]
        ax.scatter(xs, ys, s=14, color="#999999", label="one run vs the baseline median (not verified)", zorder=2)
    if steps:
        ax.step(
            [n for n, _ in steps],
            [b for _, b in steps],
            where="post",
            color="#2166ac",
            linewidth=2,
            label="best verified speedup (receipt)",
            zorder=3,
        )
    ax.axhline(1.0, color="#444444", linewidth=0.8, linestyle=":")
    ax.set_xlabel("executions launched (search, verify and A/B runs)")
    ax.set_ylabel("speedup over the baseline (x)")
    ax.set_title("Best verified speedup so far")
    ax.xaxis.get_major_locator().set_params(integer=True)
    _legend(ax)
    ax.grid(alpha=0.3)
    return _svg(plt, fig)


def memory_speed_svg(data) -> str:
    """Peak memory against step time; out-of-memory runs are lower bounds drawn at the limit."""
    plt, fig, ax = _figure()
    limit = data.memory_limit_mb
    runs = [r for r in data.attempts() if r.get("kind") in ("search", "run", "verify")]
    timed = [r["step_time_s"] * 1e3 for r in runs if r.get("step_time_s")]
    base = data.baseline or {}
    if base.get("step_time_s"):
        timed.append(base["step_time_s"]["median"] * 1e3)
    for status, (colour, marker) in _STATUS_STYLE.items():
        pts = [
            (r["step_time_s"] * 1e3, r["peak_mem_mb"])
            for r in runs
            if r["status"] == status and r.get("step_time_s") and r.get("peak_mem_mb")
        ]
        if pts:
            ax.scatter(*zip(*pts), s=22, color=colour, marker=marker, label=status, zorder=3)
    ooms = [r for r in runs if r["status"] == "oom"]
    if ooms and limit:
        # An OOM was stopped at the limit: its real peak is at least that. With no step
        # time of its own it sits at the right edge, in the "no time" band.
        right = max(timed) * 1.08 if timed else 1.0
        xs = [r["step_time_s"] * 1e3 if r.get("step_time_s") else right for r in ooms]
        ax.scatter(
            xs,
            [limit] * len(xs),
            marker="^",
            s=40,
            color="#b2182b",
            zorder=4,
            label=f"out of memory (peak ≥ {limit:.0f} MB)",
        )
        for x in sorted(set(xs)):
            ax.annotate(
                "",
                xy=(x, limit * 1.07),
                xytext=(x, limit),
                zorder=4,
                arrowprops={"arrowstyle": "->", "color": "#b2182b", "linewidth": 1},
            )
            stacked = xs.count(x)
            ax.annotate(
                f"{stacked} OOM" if stacked > 1 else "OOM",
                xy=(x, limit * 1.07),
                xytext=(-6, 2),
                textcoords="offset points",
                ha="right",
                color="#b2182b",
                fontsize=8,
            )
    if limit:
        low, high = ax.get_ylim()
        ax.set_ylim(low, max(high, limit * 1.12))  # room for the lower-bound arrows above the limit
        ax.axhline(limit, color="#b2182b", linewidth=1, linestyle="--")
        ax.text(
            0.01, limit, " memory limit", transform=ax.get_yaxis_transform(), va="bottom", color="#b2182b", fontsize=8
        )
    if base.get("step_time_s") and base.get("peak_mem_mb"):
        ax.scatter(
            [base["step_time_s"]["median"] * 1e3],
            [base["peak_mem_mb"]],
            marker="*",
            s=140,
            color="#000000",
            label="baseline",
            zorder=5,
        )
    ax.set_xlabel("step time (ms, one run)")
    ax.set_ylabel("peak memory (MB)")
    ax.set_title("Memory against speed")
    _legend(ax)
    ax.grid(alpha=0.3)
    return _svg(plt, fig)


def ab_looks_svg(ab: dict) -> str:
    """A receipt's A/B: each pair's ratio, and the speedup's bounds at each look as pairs accumulated."""
    plt, fig, ax = _figure()
    base, cand = ab.get("baseline_s") or [], ab.get("candidate_s") or []
    ratios = [b / c for b, c in zip(base, cand) if b and c]
    ax.scatter(
        range(1, len(ratios) + 1), ratios, s=18, color="#999999", label="one pair (baseline / candidate)", zorder=2
    )
    looks = ab.get("looks") or []
    if looks:
        xs = [look["pairs"] for look in looks]
        ax.fill_between(
            xs,
            [look["ci_low"] for look in looks],
            [look["ci_high"] for look in looks],
            color="#2166ac",
            alpha=0.2,
            step="mid",
            label="bounds at each look",
        )
        ax.plot(xs, [look["median"] for look in looks], marker="o", color="#2166ac", label="median at each look")
        last = looks[-1]
        ax.annotate(
            last["decision"],
            xy=(last["pairs"], last["ci_low"]),
            xytext=(4, -12),
            textcoords="offset points",
            color="#2166ac",
            fontsize=8,
        )
    bar = (ab.get("sequential") or {}).get("min_speedup")
    if bar:
        ax.axhline(bar, color="#b2182b", linewidth=1, linestyle="--", label=f"min_speedup {bar:g}")
    ax.axhline(1.0, color="#444444", linewidth=0.8, linestyle=":")
    ax.set_xlabel("A/B pairs run (back to back)")
    ax.set_ylabel("speedup (x)")
    ax.set_title("The A/B as its pairs accumulated")
    ax.xaxis.get_major_locator().set_params(integer=True)
    _legend(ax)
    ax.grid(alpha=0.3)
    return _svg(plt, fig)


def convergence_svg(claim: dict) -> str:
    """A receipt's long runs: the baseline's and the candidate's smoothed loss over the steps, the
    mean over seeds as a line and the band between the lowest and highest seed, and the tail compared."""
    plt, fig, ax = _figure()
    curves = claim.get("curves") or {}
    for arm, colour in (("baseline", "#444444"), ("candidate", "#2166ac")):
        curve = curves.get(arm) or {}
        mean, low, high = curve.get("mean") or [], curve.get("low") or [], curve.get("high") or []
        if low and high and len(low) == len(high):
            ax.fill_between([p[0] for p in low], [p[1] for p in low], [p[1] for p in high], color=colour, alpha=0.2)
        if mean:
            label = f"{arm}: mean of {claim.get('seeds')} seeds, band lowest to highest"
            ax.plot([p[0] for p in mean], [p[1] for p in mean], color=colour, linewidth=1.2, label=label)
    steps, tail = claim.get("steps"), claim.get("tail_steps")
    if isinstance(steps, int) and isinstance(tail, int):
        ax.axvspan(steps - tail + 1, steps, color="#1b7837", alpha=0.08, label=f"tail compared (last {tail} steps)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (trailing mean)")
    ax.set_title("Long runs: the candidate against the baseline")
    _legend(ax)
    ax.grid(alpha=0.3)
    return _svg(plt, fig)
