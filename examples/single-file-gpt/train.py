"""A single-file GPT trainer, written the way many are: settings are module globals, a config
file given as an argument is exec'd over them, and ``--key=value`` arguments override single
globals. It knows nothing of InfraRSI (``evidence = "auto"`` observes it from outside).

    python train.py config/small.py --batch_size=8 --gradient_accumulation_steps=2
"""

import math
import sys
import time
from ast import literal_eval

import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
# defaults; config/*.py and --key=value override them
batch_size = 16
gradient_accumulation_steps = 1
block_size = 64
vocab_size = 64
n_layer = 2
n_head = 8
n_embd = 64
learning_rate = 1e-3
max_iters = 5000
warmup_iters = 10
grad_clip = 0.2
attention = "manual"  # "manual" or "sdpa"
foreach = False
threads = 1
seed = 1337
# -----------------------------------------------------------------------------
for arg in sys.argv[1:]:
    if not arg.startswith("--"):
        print(f"overriding config with {arg}")
        with open(arg) as handle:
            exec(handle.read())
        continue
    key, sep, value = arg[2:].partition("=")
    if not sep or key not in globals() or key.startswith("_"):
        raise SystemExit(f"unknown or malformed setting: {arg} (expected --key=value for a known key)")
    try:
        value = literal_eval(value)
    except (SyntaxError, ValueError):
        pass  # a plain string
    if not isinstance(value, type(globals()[key])):
        raise SystemExit(f"--{key}: expected a {type(globals()[key]).__name__}, got {value!r}")
    globals()[key] = value

torch.manual_seed(seed)
torch.set_num_threads(threads)

# A synthetic corpus with structure, so the loss goes down.
corpus_gen = torch.Generator().manual_seed(0)
corpus = (torch.arange(1 << 16) * 5 + torch.randint(0, 4, (1 << 16,), generator=corpus_gen)) % vocab_size
batch_gen = torch.Generator().manual_seed(seed)


def get_batch(size):
    ix = torch.randint(len(corpus) - block_size - 1, (size,), generator=batch_gen)
    x = torch.stack([corpus[i : i + block_size] for i in ix])
    y = torch.stack([corpus[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


class Head(nn.Module):
    """One attention head."""

    def __init__(self, size):
        super().__init__()
        self.query = nn.Linear(n_embd, size, bias=False)
        self.key = nn.Linear(n_embd, size, bias=False)
        self.value = nn.Linear(n_embd, size, bias=False)

    def forward(self, x):
        q, k, v = self.query(x), self.key(x), self.value(x)
        if attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = x.size(1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        return F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


class MultiHeadAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([Head(n_embd // n_head) for _ in range(n_head)])
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        return self.proj(torch.cat([head(x) for head in self.heads], dim=-1))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = MultiHeadAttention()
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        logits = self.head(self.ln_f(self.blocks(x)))
        return F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))


model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.1, foreach=foreach)
print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")


def get_lr(it):
    return learning_rate * min(1.0, (it + 1) / warmup_iters)


t0 = time.time()
for it in range(max_iters):
    for group in optimizer.param_groups:
        group["lr"] = get_lr(it)
    # One global batch of batch_size x gradient_accumulation_steps, in micro-batches.
    xs, ys = get_batch(batch_size * gradient_accumulation_steps)
    total = 0.0
    for x, y in zip(xs.split(batch_size), ys.split(batch_size)):
        loss = model(x, y) / gradient_accumulation_steps
        loss.backward()
        total += loss.item()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    print(f"iter {it}: loss {total:.4f}, norm {norm.item():.3f}, {dt * 1e3:.1f} ms")
