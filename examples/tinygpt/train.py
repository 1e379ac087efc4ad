"""Train TinyGPT on the bundled corpus (CPU, seconds per run), reporting through the probe.

Knobs (see infrarsi.toml): --attention, --checkpoint, --micro-batch (gradient
accumulation at a fixed global batch), --threads, and the environment variables
TINYGPT_COMPILE (torch.compile) and TINYGPT_FOREACH (the optimizer's foreach path).
Every setting trains the same job: same data order, same weights, same loss.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from infrarsi import probe
from model import Config, TinyGPT

HERE = Path(__file__).resolve().parent


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=["dense", "moe"], default="dense")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights' initialisation")
    ap.add_argument("--attention", choices=["manual", "sdpa"], default="manual")
    ap.add_argument("--checkpoint", choices=["on", "off"], default="on")
    ap.add_argument("--batch", type=int, default=16, help="global batch (sequences per optimizer step)")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args(argv)
    if args.batch % args.micro_batch:
        ap.error(f"--micro-batch {args.micro_batch} must divide --batch {args.batch}")
    return args


def load_corpus() -> torch.Tensor:
    raw = (HERE / "data" / "corpus.txt").read_bytes()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()


def get_batch(data: torch.Tensor, step: int, batch: int, seq_len: int):
    """The step's sequences; depends only on the step, so every setting sees the same data."""
    gen = torch.Generator().manual_seed(1000 + step)
    starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
    x = torch.stack([data[s:s + seq_len] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + seq_len + 1] for s in starts.tolist()])
    return x, y


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = Config(arch=args.arch, attention=args.attention, checkpoint=args.checkpoint == "on",
                 seq_len=args.seq_len)
    model = TinyGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                            foreach=os.environ.get("TINYGPT_FOREACH", "0") == "1")
    step_fn = model
    if os.environ.get("TINYGPT_COMPILE", "0") == "1":
        # Compile in this process: inductor's default pool of compile workers is a tree of
        # processes (about 1.1 GB on a 2-core machine), alone over the contract's memory limit.
        import torch._inductor.config as inductor_config
        inductor_config.compile_threads = 1
        step_fn = torch.compile(model)

    data = load_corpus()
    n_params = sum(p.numel() for p in model.parameters())
    p = probe.from_env()
    p.watch(model)
    p.meta(params=n_params, flops_per_token=6 * n_params, dtype="fp32", arch=args.arch)
    steps = p.total_steps or args.steps
    accum = args.batch // args.micro_batch
    for step in range(1, steps + 1):
        x, y = get_batch(data, step, args.batch, args.seq_len)
        with p.step(step, tokens=args.batch * args.seq_len):
            loss_sum = 0.0
            for i in range(accum):
                rows = slice(i * args.micro_batch, (i + 1) * args.micro_batch)
                loss = step_fn(x[rows], y[rows]) / accum
                loss.backward()
                loss_sum += loss.item()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        p.log(step, loss=loss_sum, grad_norm=gn.item())
        if not p.enabled and (step == 1 or step % 10 == 0):
            print(f"step {step}: loss {loss_sum:.4f} grad_norm {gn.item():.4f}", flush=True)
    p.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
