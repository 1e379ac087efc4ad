"""TinyGPT's knob settings leave the training job unchanged: `benchmarks/knob_numerics.py`,
run for real (every combination a real training run judged by `verify`), over a pairwise
design of every knob but torch.compile (compiled runs add minutes on CPU, and compiling with
checkpointing off is over the memory limit; the benchmark's full run, compile included, is
in docs/benchmarks.md)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

from infrarsi.contract._contract import load_contract

ROOT = Path(__file__).parents[2]


def test_every_pair_of_knob_values_trains_the_same_job():
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "knob_numerics.py"),
            "--without",
            "compile",
            "--warmup",
            "1",
            "--measure",
            "3",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = json.loads(proc.stdout)
    failing = [(r["knobs"], r["status"], r["failing"]) for r in report["rows"] if not r["passed"]]
    assert not failing, (failing, proc.stderr[-2000:])
    # The memory cliff (checkpointing off at micro-batch 16) is judged too. Whether it runs out
    # of memory in this 4-step window is the benchmark's claim, not this test's: its peak has
    # read 522-701 MB against the 560 MB limit from run to run (docs/benchmarks.md).
    assert report["cliff"]["status"] in ("ok", "oom"), report["cliff"]
    # Every value pair of two knobs, compile held at its baseline and the memory cliff aside,
    # was trained and judged together at least once.
    knobs = load_contract(ROOT / "examples" / "tinygpt" / "infrarsi.toml").knobs
    sizes = {name: 1 if name == "compile" else len(k.choices) for name, k in knobs.items()}
    expected = sum(sizes[a] * sizes[b] for a, b in itertools.combinations(sorted(sizes), 2)) - 1
    assert report["pairs_covered"] == expected
    assert {r["knobs"]["compile"] for r in report["rows"]} == {"0"}
    assert all(r["status"] == "ok" for r in report["rows"])
