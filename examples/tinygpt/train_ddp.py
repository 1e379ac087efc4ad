"""TinyGPT data-parallel: ``torchrun --nproc_per_node=N train_ddp.py`` (contract ``ddp.toml``).

The same job as ``train.py`` (same data, same initial weights, same knobs) on the gloo
backend: each rank takes its share of every global batch (``--batch`` must split evenly
across the ranks and then into micro-batches) and DistributedDataParallel averages the
gradients, so the model trains as the one-process run does. Each rank reports its own loss,
on its share, through the probe; the grad norm (after the all-reduce) is the same on all.
Run on its own (no torchrun) it is one rank.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from infrarsi import probe
from model import Config, TinyGPT
from train import get_batch, load_corpus, parse_args


def main(argv=None) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = parse_args(argv)
    local = args.batch // world  # this rank's share of each global batch
    if args.batch % world or local % args.micro_batch:
        sys.exit(f"--micro-batch {args.micro_batch} must divide --batch {args.batch} split across {world} ranks")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = Config(arch=args.arch, attention=args.attention, checkpoint=args.checkpoint == "on",
                 seq_len=args.seq_len)
    model = TinyGPT(cfg)
    rank = 0
    trained = model
    if world > 1:
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        trained = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                            foreach=os.environ.get("TINYGPT_FOREACH", "0") == "1")
    data = load_corpus()
    n_params = sum(p.numel() for p in model.parameters())
    p = probe.from_env()
    p.watch(model)
    p.meta(params=n_params, flops_per_token=6 * n_params, dtype="fp32", arch=args.arch, world=world)
    steps = p.total_steps or args.steps
    accum = local // args.micro_batch
    for step in range(1, steps + 1):
        x, y = get_batch(data, step, args.batch, args.seq_len)
        x, y = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        with p.step(step, tokens=local * args.seq_len):
            loss_sum = 0.0
            for i in range(accum):
                rows = slice(i * args.micro_batch, (i + 1) * args.micro_batch)
                loss = trained(x[rows], y[rows]) / accum
                loss.backward()
                loss_sum += loss.item()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        p.log(step, loss=loss_sum, grad_norm=gn.item())
        if not p.enabled and rank == 0 and (step == 1 or step % 10 == 0):
            print(f"step {step}: loss {loss_sum:.4f} grad_norm {gn.item():.4f}", flush=True)
    p.close()
    if world > 1:  # every rank done with the collectives before any tears its process group down
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
