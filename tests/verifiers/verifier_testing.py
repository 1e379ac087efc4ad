"""Synthetic evidence, shaped like the probe's receipts and the runner's stamps."""

from __future__ import annotations

import json

from infrarsi.verifiers import BaselineReference, Rules, RunEvidence

WARMUP, MEASURE = 2, 6
TOTAL = WARMUP + MEASURE
TOKENS = 2048
RULES = Rules(WARMUP, MEASURE, 1e-3, 1e-2, ("fp32",), ("loss", "grad_norm", "precision"))


def losses(n=TOTAL):
    return [5.0 - 0.1 * i for i in range(n)]


def grad_norms(n=TOTAL):
    return [1.0 + 0.01 * i for i in range(n)]


REFERENCE = BaselineReference(loss=losses(), grad_norm=grad_norms(), tokens_per_step=TOKENS)
SAMPLED = (3, 6)
OPS = ["addmm:float32", "bmm:float32", "mm:float32"]


def param_grads(step: int) -> dict[str, float | None]:
    """A small model's per-parameter gradient norms at ``step``: attention heads, an MLP, an embedding."""
    grads = {
        "tok.weight": 0.2 + 0.001 * step,
        "blocks.0.mlp.up.weight": 0.05,
        "blocks.0.mlp.up.bias": 1e-3,
        "blocks.0.attn.proj.weight": 0.02,
        "frozen.weight": None,
    }
    for h in range(2):
        for name, norm in (("q", 2e-6 * (h + 1)), ("k", 3e-6 * (h + 1)), ("v", 0.01 * (h + 1))):
            grads[f"blocks.0.attn.heads.{h}.{name}.weight"] = norm
    return grads


def param_rows(step: int) -> dict[str, float]:
    """Each 2-D parameter's smallest row norm (a quarter of its norm: four equal rows)."""
    return {n: v / 2 for n, v in param_grads(step).items() if v is not None and not n.endswith("bias")}


SAMPLED_REFERENCE = BaselineReference(
    loss=losses(),
    grad_norm=grad_norms(),
    tokens_per_step=TOKENS,
    param_grad_norms={k: param_grads(k) for k in range(1, TOTAL + 1)},
    param_grad_min_rows={k: param_rows(k) for k in range(1, TOTAL + 1)},
    ops={k: list(OPS) for k in range(1, TOTAL + 1)},
)


def make_sampled_run(sampled=SAMPLED, mutate=None, **kwargs) -> RunEvidence:
    """An honest run whose sampled steps carry operator dtypes, per-parameter norms and settings."""

    def observed(rec):
        if rec["step"] in sampled:
            rec = {
                **rec,
                "ops": list(OPS),
                "grads": param_grads(rec["step"]),
                "grad_min_rows": param_rows(rec["step"]),
                "fp32_precision": {"backends": "none", "mkldnn.matmul": "none", "legacy_matmul": "highest"},
            }
        return mutate(rec) or rec if mutate else rec

    run = make_run(mutate=observed, **kwargs)
    return RunEvidence(
        run.receipt_lines, run.arrivals_ns, run.started_ns, run.ended_ns, run.integrity, sampled_steps=tuple(sampled)
    )


def make_run(
    step_ms=50.0, latency_ms=0.3, steps=None, mutate=None, start_ns=1_000_000_000, integrity=None
) -> RunEvidence:
    """An honest run: each line written right after its step, stamped ``latency_ms`` later."""
    lines = [json.dumps({"type": "meta", "version": 1})]
    arrivals = [start_ns]
    t = start_ns + 1_000_000
    loss, gn = losses(), grad_norms()
    for step in steps or range(1, TOTAL + 1):
        t0 = t + 1_000_000  # data loading between steps
        t1 = t0 + int(step_ms * 1e6)
        rec = {
            "type": "step",
            "step": step,
            "t0_ns": t0,
            "t1_ns": t1,
            "tokens": TOKENS,
            "loss": loss[(step - 1) % TOTAL],
            "grad_norm": gn[(step - 1) % TOTAL],
            "peak_mem_bytes": 1 << 20,
            "autocast": [],
            "param_dtypes": ["float32"],
            "fp32_matmul": "highest",
        }
        if mutate:
            rec = mutate(rec) or rec
        lines.append(json.dumps(rec))
        arrivals.append(t1 + int(latency_ms * 1e6))
        t = t1
    ok = {
        "protected_changed_before_run": [],
        "protected_changed_by_run": [],
        "framework_changed": [],
        "containment": {"strays": [], "subreaper": True},
    }
    return RunEvidence(lines, arrivals, start_ns, t + 10_000_000, ok if integrity is None else integrity)
