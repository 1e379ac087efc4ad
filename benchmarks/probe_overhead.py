"""Probe overhead per step, as a fraction of a ~5 ms CPU training step.

Three measurements in one run:
  1. the probe's own cost: `with p.step(): ...; p.log(...)` around no work, many times,
     after 200 steps of warm-up (the first steps pay one-time costs). The probe holds a
     sampling plan, as under the runner, whose steps never come: this is an unsampled step;
  2. paired A/B blocks of a real ~5 ms torch step (ABBA order, so drift cancels), as a
     check on (1) in place: the no-op recorder against itself (A/A, the noise floor), the
     real probe writing to /dev/null, and the real probe writing to the FIFO. The last
     also pays for waking the reader once a step, which the runner needs to stamp each
     line as it arrives;
  3. a sampled step (operator dtypes under a dispatch mode, per-parameter gradient norms,
     fp32_precision settings): real ~5 ms steps with every step sampled, against the same
     steps unsampled, in ABBA blocks. The runner leaves sampled steps out of the step time.
Receipts go to a FIFO drained by another process, as under the runner.

    python benchmarks/probe_overhead.py [--steps 3000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch

from infrarsi.probe import NullProbe, Probe


def make_job():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(2)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 128)

    def step():
        loss = model(x).pow(2).mean()
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, gn

    return model, step


def calibrate(step) -> int:
    """Work units per step so that one step takes about 5 ms."""
    for _ in range(20):
        step()  # warm up allocator and kernels first
    start = time.perf_counter()
    for _ in range(50):
        step()
    per = (time.perf_counter() - start) / 50
    return max(1, round(0.005 / per))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    folder = tempfile.mkdtemp()
    fifo = os.path.join(folder, "receipts.fifo")
    os.mkfifo(fifo)
    # Another process drains the FIFO, as the runner does; a thread here would contend for the GIL.
    reader = subprocess.Popen(["cat", fifo], stdout=subprocess.DEVNULL)
    model, step = make_job()
    never = frozenset({10**9})  # a plan whose steps never come: every step is an unsampled one
    probe = Probe(fifo, total_steps=None, sample=never)
    probe.watch(model)

    def empty_steps(first, count):
        for i in range(first, first + count):
            with probe.step(i, tokens=64):
                pass
            probe.log(i, loss=1.0, grad_norm=1.0)

    # 1. the probe's own cost per step, in the steady state: the first steps pay one-time
    #    costs (the autocast spy is installed, the parameter list is first walked)
    empty_steps(1, 200)
    start = time.perf_counter_ns()
    empty_steps(201, args.steps)
    own_s = (time.perf_counter_ns() - start) / 1e9 / args.steps

    # 2. paired blocks of real ~5 ms steps
    units = calibrate(step)
    null = NullProbe()
    # total_steps = a block's length: no window stays open between blocks
    sampling = Probe(os.devnull, total_steps=40, sample="all")

    def block(p, n=40):
        t = time.perf_counter()
        if p is sampling:
            p._sampler.open(1)  # each block starts at step 1: its window opens here, as at the start of a run
        for i in range(1, n + 1):
            with p.step(i, tokens=64):
                for _ in range(units):
                    loss, gn = step()
            p.log(i, loss=loss.item(), grad_norm=gn.item())
        return (time.perf_counter() - t) / n

    def ab(candidate, reference):
        ratios, times = [], []
        for index in range(args.blocks):
            # ABBA order: whichever block runs second in a pair is not always the candidate's.
            if index % 2 == 0:
                a, b = block(reference), block(candidate)
            else:
                b, a = block(candidate), block(reference)
            ratios.append(b / a)
            times.append(a)
        return statistics.median(ratios), times

    to_null = Probe(os.devnull, total_steps=None, sample=never)
    to_null.watch(model)
    aa_ratio, _ = ab(NullProbe(), null)
    null_ratio, _ = ab(to_null, null)
    fifo_ratio, step_times = ab(probe, null)

    # 3. sampled steps: every step observed, against the same probe leaving every step alone
    sampling.watch(model)
    sampled_ratio, unsampled_times = ab(sampling, to_null)
    sampling.close()
    to_null.close()
    probe.close()
    reader.wait(timeout=10)

    step_s = statistics.median(step_times)
    result = {
        "probe_cost_us_per_step": round(own_s * 1e6, 2),
        "step_ms": round(step_s * 1e3, 3),
        "overhead_fraction": round(own_s / step_s, 5),
        "ab_ratio_aa_noise": round(aa_ratio, 4),
        "ab_ratio_devnull": round(null_ratio, 4),
        "ab_ratio_fifo": round(fifo_ratio, 4),
        "sampled_step_ratio": round(sampled_ratio, 3),
        "sampled_step_extra_ms": round((sampled_ratio - 1) * statistics.median(unsampled_times) * 1e3, 3),
        "ab_blocks": args.blocks,
        "goal": "overhead_fraction < 0.01",
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:24} {value}")


if __name__ == "__main__":
    main()
