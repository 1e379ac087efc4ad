"""TinyGPT: a small byte-level causal language model, dense or mixture-of-experts.

Written the way many research models start: clear before fast. Attention keeps
one small module per head, the causal mask is rebuilt at every forward, and the
MoE layer sends tokens to experts one expert at a time. The patches under
``patches/`` fix these without changing the job.

Parameters are initialised from their *logical* tensors (a full ``d x d`` query
matrix, say), drawn in a fixed order from one generator, then handed to the
module's own layout. So a patch that changes the layout (fused heads) starts
from exactly the same weights as the original.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = ["Config", "TinyGPT"]


@dataclass
class Config:
    vocab: int = 256
    seq_len: int = 128
    d_model: int = 64
    n_heads: int = 16
    n_layers: int = 4
    mlp_ratio: int = 4
    arch: str = "dense"        # or "moe"
    n_experts: int = 4
    attention: str = "manual"  # or "sdpa"
    checkpoint: bool = True    # recompute each block's activations in backward


def causal_attention(q, k, v, kind: str):
    """Softmax attention with a causal mask; q, k, v are (..., T, head_dim)."""
    if kind == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=q.device))
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class Head(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        hd = cfg.d_model // cfg.n_heads
        self.q = nn.Linear(cfg.d_model, hd, bias=False)
        self.k = nn.Linear(cfg.d_model, hd, bias=False)
        self.v = nn.Linear(cfg.d_model, hd, bias=False)

    def forward(self, x, kind: str):
        return causal_attention(self.q(x), self.k(x), self.v(x), kind)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.heads = nn.ModuleList(Head(cfg) for _ in range(cfg.n_heads))
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def load_logical(self, wq, wk, wv, wo):
        hd = self.cfg.d_model // self.cfg.n_heads
        for h, head in enumerate(self.heads):
            rows = slice(h * hd, (h + 1) * hd)
            head.q.weight.copy_(wq[rows])
            head.k.weight.copy_(wk[rows])
            head.v.weight.copy_(wv[rows])
        self.proj.weight.copy_(wo)

    def forward(self, x):
        return self.proj(torch.cat([head(x, self.cfg.attention) for head in self.heads], dim=-1))


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class MoE(nn.Module):
    """Top-1 routed experts; each expert's output is scaled by its router probability."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg) for _ in range(cfg.n_experts))

    def forward(self, x):
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(flat), dim=-1)
        weight, choice = probs.max(dim=-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            picked = choice == e
            if picked.any():
                out[picked] = expert(flat[picked]) * weight[picked].unsqueeze(-1)
        return out.reshape(shape)


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MoE(cfg) if cfg.arch == "moe" else MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: Config, seed: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self._init_logical(seed)

    @torch.no_grad()
    def _init_logical(self, seed: int | None) -> None:
        # Unset: the seed torch.manual_seed last set (train.py's --seed), so a seed changes the weights.
        gen = torch.Generator().manual_seed(torch.initial_seed() if seed is None else seed)
        d = self.cfg.d_model

        def normal(*shape, std=0.02):
            return torch.randn(*shape, generator=gen) * std

        self.tok.weight.copy_(normal(self.cfg.vocab, d))
        self.pos.weight.copy_(normal(self.cfg.seq_len, d))
        for block in self.blocks:
            block.attn.load_logical(normal(d, d), normal(d, d), normal(d, d),
                                    normal(d, d, std=0.02 / math.sqrt(2 * self.cfg.n_layers)))
            mlps = block.mlp.experts if self.cfg.arch == "moe" else [block.mlp]
            if self.cfg.arch == "moe":
                block.mlp.router.weight.copy_(normal(self.cfg.n_experts, d))
            for mlp in mlps:
                mlp.up.weight.copy_(normal(*mlp.up.weight.shape))
                mlp.up.bias.zero_()
                mlp.down.weight.copy_(normal(*mlp.down.weight.shape, std=0.02 / math.sqrt(2 * self.cfg.n_layers)))
                mlp.down.bias.zero_()
        self.head.weight.copy_(normal(self.cfg.vocab, d))

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            if self.cfg.checkpoint and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
