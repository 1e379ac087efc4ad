"""Source-audit time for a 2,000-line training file, standalone and diff-aware.

Builds a realistic single-file trainer (model classes, data helpers, a probe-timed loop
with accumulation and clipping) of about ``--lines`` lines, then times
``audit_source`` (every shortcut rule) and ``audit_diff`` (against a patched copy, the
timing boundary included: two files parsed) over several repeats, the latter both cold
and against a baseline parsed before (what a search auditing many candidates sees).
Goal: under 1 s per file.

    python benchmarks/audit_speed.py [--lines 2000] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from infrarsi.auditors import audit_diff, audit_source
from infrarsi.auditors._audit import _model, _plain_findings

HEADER = '''"""A single-file trainer."""
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import clip_grad_norm_ as clip

from infrarsi import probe
'''

BLOCK = '''

class Block{i}(nn.Module):
    """Transformer block {i}."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)
        self.n_heads = n_heads
        self.dropout = dropout

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        k = k.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        v = v.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))
        scores = scores.masked_fill(~mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return x


def helper_{i}(values, scale=1.0):
    total = 0.0
    for value in values:
        if value > 0:
            total += value * scale
        else:
            total -= value
    return total / max(len(values), 1)
'''

LOOP = """

def get_batch(data, step, batch, seq_len):
    gen = torch.Generator().manual_seed(1000 + step)
    starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
    x = torch.stack([data[s:s + seq_len] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + seq_len + 1] for s in starts.tolist()])
    return x, y


def main():
    model = nn.Sequential(*[Block0(64, 4) for _ in range(2)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100)
    data = torch.randint(0, 256, (10000,))
    p = probe.from_env()
    p.watch(model)
    steps = p.total_steps or 100
    for step in range(1, steps + 1):
        x, y = get_batch(data, step, 16, 64)
        with p.step(step, tokens=16 * 64):
            loss_sum = 0.0
            for i in range(4):
                logits = model(x[i * 4:(i + 1) * 4])
                loss = F.cross_entropy(logits.flatten(0, 1), y[i * 4:(i + 1) * 4].flatten()) / 4
                loss.backward()
                loss_sum += loss.item()
            gn = clip(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        p.log(step, loss=loss_sum, grad_norm=gn.item())
        if not p.enabled and step % 10 == 0:
            print(f"step {step}: loss {loss_sum:.4f}")
    p.close()


if __name__ == "__main__":
    main()
"""


def training_file(lines: int) -> str:
    parts, i = [HEADER], 0
    while sum(p.count("\n") for p in parts) + LOOP.count("\n") < lines:
        parts.append(BLOCK.format(i=i))
        i += 1
    parts.append(LOOP)
    return "".join(parts)


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    text = training_file(args.lines)
    patched = text.replace("            opt.step()\n", "            opt.step()  # patched\n")
    findings_alone = audit_source(text, "train.py")
    findings_diff = audit_diff(text, patched, "train.py")
    alone = _time(lambda: audit_source(text, "train.py"), args.repeats)

    def cold_diff():  # a new baseline every time: nothing parsed before
        _model.cache_clear()
        _plain_findings.cache_clear()
        audit_diff(text, patched, "train.py")

    diff = _time(cold_diff, args.repeats)
    audit_diff(text, patched, "train.py")
    warm = _time(lambda: audit_diff(text, patched, "train.py"), args.repeats)  # the search's case
    result = {
        "lines": text.count("\n"),
        "audit_source_s": statistics.median(alone),
        "audit_diff_s": statistics.median(diff),
        "audit_source_max_s": max(alone),
        "audit_diff_max_s": max(diff),
        "audit_diff_same_baseline_s": statistics.median(warm),
        "findings": len(findings_alone) + len(findings_diff),
        "goal_s": 1.0,
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print(
            f"{result['lines']} lines: audit_source {result['audit_source_s']:.3f} s (max {max(alone):.3f}), "
            f"audit_diff {result['audit_diff_s']:.3f} s (max {max(diff):.3f}), against an already-parsed "
            f"baseline {result['audit_diff_same_baseline_s']:.3f} s; goal < 1 s per file; "
            f"findings {result['findings']} (expected 0)"
        )


if __name__ == "__main__":
    main()
