"""Synthetic evidence, shaped like the probe's receipts and the runner's stamps."""

from __future__ import annotations

import json

from infrarsi.verifiers import BaselineReference, RunEvidence, Rules

WARMUP, MEASURE = 2, 6
TOTAL = WARMUP + MEASURE
TOKENS = 2048
RULES = Rules(WARMUP, MEASURE, 1e-3, 1e-2, ("fp32",), ("loss", "grad_norm", "precision"))


def losses(n=TOTAL):
    return [5.0 - 0.1 * i for i in range(n)]


def grad_norms(n=TOTAL):
    return [1.0 + 0.01 * i for i in range(n)]


REFERENCE = BaselineReference(loss=losses(), grad_norm=grad_norms(), tokens_per_step=TOKENS)


def make_run(step_ms=50.0, latency_ms=0.3, steps=None, mutate=None, start_ns=1_000_000_000,
             integrity=None) -> RunEvidence:
    """An honest run: each line written right after its step, stamped ``latency_ms`` later."""
    lines = [json.dumps({"type": "meta", "version": 1})]
    arrivals = [start_ns]
    t = start_ns + 1_000_000
    loss, gn = losses(), grad_norms()
    for step in steps or range(1, TOTAL + 1):
        t0 = t + 1_000_000  # data loading between steps
        t1 = t0 + int(step_ms * 1e6)
        rec = {"type": "step", "step": step, "t0_ns": t0, "t1_ns": t1, "tokens": TOKENS,
               "loss": loss[(step - 1) % TOTAL], "grad_norm": gn[(step - 1) % TOTAL], "peak_mem_bytes": 1 << 20,
               "autocast": [], "param_dtypes": ["float32"], "fp32_matmul": "highest"}
        if mutate:
            rec = mutate(rec) or rec
        lines.append(json.dumps(rec))
        arrivals.append(t1 + int(latency_ms * 1e6))
        t = t1
    ok = {"protected_changed_before_run": [], "protected_changed_by_run": [], "framework_changed": []}
    return RunEvidence(lines, arrivals, start_ns, t + 10_000_000, ok if integrity is None else integrity)
