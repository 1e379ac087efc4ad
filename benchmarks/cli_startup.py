"""How fast `infrarsi --help` and `infrarsi --version` answer (goal: well under a second).

Each command runs `--runs` times as a fresh process; printed: the median wall time, and
the same for a bare `python -c pass` as the floor any Python command pays.

    python benchmarks/cli_startup.py [--runs 10] [--json]

Exit 0 when both medians are under 0.5 s; 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOAL_S = 0.5


def median_wall(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    script = shutil.which("infrarsi") or str(Path(sys.executable).parent / "infrarsi")
    report = {
        "python -c pass": median_wall([sys.executable, "-c", "pass"], args.runs),
        "infrarsi --help": median_wall([script, "--help"], args.runs),
        "infrarsi --version": median_wall([script, "--version"], args.runs),
    }
    met = report["infrarsi --help"] < GOAL_S and report["infrarsi --version"] < GOAL_S
    if args.json:
        print(json.dumps({"median_s": report, "goal_s": GOAL_S, "met": met}))
    else:
        for name, seconds in report.items():
            print(f"{name:20s} median {seconds * 1000:6.0f} ms over {args.runs} runs")
        print(f"goal: under {GOAL_S:g} s: {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
