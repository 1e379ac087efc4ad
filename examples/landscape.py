"""Synthetic search landscapes that run as real, cheap jobs through the runner.

A landscape says how each change (a knob value, a patch) scales the step time and
adds to the peak memory, which combinations interact, and which crash together.
:func:`make_workspace` writes a workspace whose job (no torch) really sleeps that
long per step, really allocates that much memory (so the runner's memory guard
really kills it), really exits non-zero for a crashing pair, and reports through
the real probe. The exhaustive optimum is known, so a search can be scored.
"""

from __future__ import annotations

import itertools
import json
import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy

__all__ = ["Landscape", "make_workspace", "dense", "moe", "OVERHEAD_MB"]

OVERHEAD_MB = 20.0  # the interpreter and the probe, on top of what the job allocates

JOB = '''\
"""A synthetic training job: its step time and memory come from landscape.json."""

import json
import os
import random
import sys
import time
from pathlib import Path

from infrarsi import probe

here = Path(__file__).parent
LATE_AFTER = 10  # a "late" change leaves the loss alone until this step
spec = json.loads((here / "data" / "landscape.json").read_text())
argv = sys.argv[1:]
atoms = set()
for name, knob in spec["knobs"].items():
    value = os.environ.get(knob["env"], knob["baseline"]) if "env" in knob else knob["baseline"]
    if "flag" in knob and knob["flag"] in argv:
        value = argv[argv.index(knob["flag"]) + 1]
    if value != knob["baseline"]:
        atoms.add(f"{name}={value}")
for switch in sorted((here / "switches").glob("*.py")):
    if "ON = True" in switch.read_text():
        atoms.add(f"+{switch.stem}")


def applies(key):
    return set(key.split("&")) <= atoms


for key in spec["crash"]:
    if applies(key):
        print(f"RuntimeError: {key.replace('&', ' and ')} cannot be combined", file=sys.stderr)
        raise SystemExit(3)
step_ms = spec["base_ms"]
mem_mb = spec["base_mb"]
for key, factor in spec["time"].items():
    if applies(key):
        step_ms *= factor
for key, delta in spec["memory"].items():
    if applies(key):
        mem_mb += delta
hoard = bytearray(int(max(mem_mb, 1) * 2 ** 20))
for i in range(0, len(hoard), 4096):
    hoard[i] = 1
shift = late = 1.0
for key, factor in spec.get("loss", {}).items():
    if applies(key):
        shift *= factor
for key, factor in spec.get("late", {}).items():
    if applies(key):
        late *= factor
p = probe.from_env()
steps = p.total_steps or 6
p.meta(flops_per_token=1000, atoms=sorted(atoms))
for step in range(1, steps + 1):
    with p.step(step, tokens=64):
        time.sleep(step_ms * random.lognormvariate(0.0, spec["noise"]) / 1000)
    after = late if step > LATE_AFTER else 1.0
    p.log(step, loss=shift * after * 3.0 / (1 + 0.1 * step), grad_norm=1.0 + step / 50)
p.close()
'''


@dataclass
class Landscape:
    """``time``: atom set ("a" or "a&b") -> factor on the step time; ``memory``: -> MB added;
    ``loss``: -> factor on the loss (a change that is not the same job); ``late``: -> factor on the
    loss after step 10 only (the same job over a short window, not after it); ``switches``: files a
    patch may turn on beyond the declared patches (for proposers that write their own);
    ``conflicts``: patch sets ("+p&+q") whose diffs do not apply together (``git apply`` rejects
    the second: both edit the same line of a file of their own)."""

    name: str
    knobs: dict[str, tuple[list[str], str]]  # name -> (choices, baseline)
    patches: list[str]
    base_ms: float
    base_mb: float
    limit_mb: float
    time: dict[str, float] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    crash: list[str] = field(default_factory=list)
    loss: dict[str, float] = field(default_factory=dict)
    late: dict[str, float] = field(default_factory=dict)
    switches: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    noise: float = 0.02
    budget: int = 40

    def __post_init__(self) -> None:
        # Put the limit in the widest gap between the points' memory near the intended limit,
        # so no point sits within the interpreter's few MB of it: fits-or-not is never a coin toss.
        totals = sorted({round(float(m) + OVERHEAD_MB, 3) for m in numpy.unique(self.grid().memory_mb)})
        gaps = [(b - a, (a + b) / 2) for a, b in zip(totals, totals[1:]) if abs((a + b) / 2 - self.limit_mb) <= 25]
        if gaps:
            self.limit_mb = round(max(gaps)[1], 1)

    def points(self):
        names = sorted(self.knobs)
        for values in itertools.product(*(self.knobs[n][0] for n in names)):
            for r in range(len(self.patches) + 1):
                for subset in itertools.combinations(self.patches, r):
                    yield dict(zip(names, values)), list(subset)

    def atoms(self, knobs: dict, patches) -> set[str]:
        out = {f"{k}={v}" for k, v in knobs.items() if v != self.knobs[k][1]}
        return out | {f"+{p}" for p in patches}

    def _applies(self, key: str, atoms: set[str]) -> bool:
        return set(key.split("&")) <= atoms

    def step_ms(self, knobs: dict, patches) -> float:
        atoms = self.atoms(knobs, patches)
        return self.base_ms * math.prod(f for k, f in self.time.items() if self._applies(k, atoms))

    def memory_mb(self, knobs: dict, patches) -> float:
        atoms = self.atoms(knobs, patches)
        return self.base_mb + sum(d for k, d in self.memory.items() if self._applies(k, atoms))

    def feasible(self, knobs: dict, patches) -> bool:
        atoms = self.atoms(knobs, patches)
        return self.memory_mb(knobs, patches) + OVERHEAD_MB < self.limit_mb and not any(
            self._applies(k, atoms) for k in [*self.crash, *self.conflicts]
        )

    def grid(self) -> "Grid":
        """Every point of the joint space at once (numpy), for exhaustive answers on large spaces."""
        return Grid(self)

    def optimum(self) -> float:
        """The best speedup over the baseline any feasible point reaches (exhaustive)."""
        return self.grid().optimum()

    def best_point(self) -> tuple[dict, list[str]]:
        """A point that reaches the optimum."""
        return self.grid().best_point()

    def speedup(self, knobs: dict, patches) -> float:
        return self.base_ms / self.step_ms(knobs, patches) if self.feasible(knobs, patches) else 0.0


class Grid:
    """A landscape's whole joint space as arrays: each knob's value index and the patch bitmask
    of every point (knobs in sorted order, the patches' subsets innermost), and from them each
    point's factor on the step time, memory and feasibility, as the job computes them."""

    def __init__(self, land: Landscape) -> None:
        self.land = land
        self.names = sorted(land.knobs)
        sizes = [len(land.knobs[n][0]) for n in self.names] + [2 ** len(land.patches)]
        index = numpy.indices(sizes).reshape(len(sizes), -1)
        self.values, self.masks = index[:-1], index[-1]
        self.time_factor = numpy.ones(self.masks.size)
        for key, factor in land.time.items():
            self.time_factor[self._holds(key)] *= factor
        self.memory_mb = numpy.full(self.masks.size, float(land.base_mb))
        for key, delta in land.memory.items():
            self.memory_mb[self._holds(key)] += delta
        self.broken = numpy.zeros(self.masks.size, dtype=bool)
        for key in [*land.crash, *land.conflicts]:
            self.broken |= self._holds(key)

    def _atom(self, atom: str):
        """Where ``atom`` holds; nowhere for a change no point of the space makes (a switch only
        a proposer's own patch turns on)."""
        if atom.startswith("+"):
            if atom[1:] not in self.land.patches:
                return numpy.zeros(self.masks.size, dtype=bool)
            return (self.masks >> self.land.patches.index(atom[1:])) & 1 == 1
        name, value = atom.split("=", 1)
        choices = self.land.knobs[name][0] if name in self.land.knobs else []
        if value not in choices:
            return numpy.zeros(self.masks.size, dtype=bool)
        return self.values[self.names.index(name)] == choices.index(value)

    def _holds(self, key: str):
        held = numpy.ones(self.masks.size, dtype=bool)
        for atom in key.split("&"):
            held &= self._atom(atom)
        return held

    def feasible(self):
        return (self.memory_mb + OVERHEAD_MB < self.land.limit_mb) & ~self.broken

    def speedups(self):
        """Each point's true speedup over the baseline (0 where it does not run)."""
        return numpy.where(self.feasible(), 1.0 / self.time_factor, 0.0)

    def optimum(self) -> float:
        return float(self.speedups().max())

    def point(self, i: int) -> tuple[dict, list[str]]:
        knobs = {n: self.land.knobs[n][0][int(self.values[k][i])] for k, n in enumerate(self.names)}
        return knobs, [p for b, p in enumerate(self.land.patches) if int(self.masks[i]) >> b & 1]

    def best_point(self) -> tuple[dict, list[str]]:
        return self.point(int(numpy.argmax(self.speedups())))


def make_workspace(
    folder: str | Path,
    land: Landscape,
    ab_pairs: int = 3,
    min_speedup: float = 1.02,
    starts: int = 4,
    proposers: tuple[str, ...] = ("contract",),
    extra_search: str = "",
    convergence: str = "",
) -> Path:
    """Write the landscape's workspace (job, switches, patches, contract) into ``folder``;
    ``convergence``: the body of a ``[numerics.convergence]`` table (none where empty)."""
    root = Path(folder)
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "switches").mkdir(exist_ok=True)
    (root / "patches").mkdir(exist_ok=True)
    (root / "train.py").write_text(JOB)
    knobs = {}
    for i, (name, (choices, base)) in enumerate(sorted(land.knobs.items())):
        knobs[name] = {"baseline": base, **({"flag": f"--{name}"} if i % 2 == 0 else {"env": f"LAND_{name.upper()}"})}
    (root / "data" / "landscape.json").write_text(
        json.dumps(
            {
                "knobs": knobs,
                "patches": land.patches,
                "base_ms": land.base_ms,
                "base_mb": land.base_mb,
                "time": land.time,
                "memory": land.memory,
                "crash": land.crash,
                "loss": land.loss,
                "late": land.late,
                "noise": land.noise,
            },
            indent=1,
        )
    )
    lines = [
        # The job sleeps: runs side by side don't change each other's step time (search --workers).
        f'[task]\nname = "{land.name}"\ncommand = ["python", "train.py"]\ntimeout_s = 60\ntiming_sensitive = false\n',
        '[scope]\neditable = ["switches/*.py"]\nprotected = ["data/**", "train.py"]\n',
        "[timing]\nwarmup_steps = 1\nmeasure_steps = 4\n",
        '[numerics]\nrequire = ["loss", "grad_norm"]\n'
        + (f"[numerics.convergence]\n{convergence}\n" if convergence else ""),
        f"[resources]\nmemory_limit_mb = {land.limit_mb}\n",
    ]
    for name, spec in knobs.items():
        choices = ", ".join(f'"{c}"' for c in land.knobs[name][0])
        how = f'flag = "{spec["flag"]}"' if "flag" in spec else f'env = "{spec["env"]}"'
        lines.append(f'[knobs.{name}]\n{how}\nchoices = [{choices}]\nbaseline = "{spec["baseline"]}"\n')
    for switch in land.switches:
        (root / "switches" / f"{switch}.py").write_text("ON = False\n")
    for i, _ in enumerate(land.conflicts):
        (root / "switches" / f"_conflict{i}.py").write_text("TAKEN = False\n")
    for patch in land.patches:
        (root / "switches" / f"{patch}.py").write_text("ON = False\n")
        hunks = [_switch_diff(f"{patch}.py", "ON")]
        hunks += [
            _switch_diff(f"_conflict{i}.py", "TAKEN")
            for i, key in enumerate(land.conflicts)
            if f"+{patch}" in key.split("&")
        ]
        (root / "patches" / f"{patch}.diff").write_text("".join(hunks))
        lines.append(f'[[patches]]\nname = "{patch}"\nfile = "patches/{patch}.diff"\n')
    wanted = ", ".join(f'"{p}"' for p in proposers)
    lines.append(
        f"[search]\nbudget_executions = {land.budget}\nstarts = {starts}\npromote_top = 1\n"
        f"ab_pairs = {ab_pairs}\nmin_speedup = {min_speedup}\nproposers = [{wanted}]\n{extra_search}"
    )
    (root / "infrarsi.toml").write_text("\n".join(lines))
    return root


def _switch_diff(name: str, variable: str) -> str:
    """A diff that turns ``variable`` in switches/``name`` from False to True."""
    return textwrap.dedent(f"""\
        diff --git a/switches/{name} b/switches/{name}
        --- a/switches/{name}
        +++ b/switches/{name}
        @@ -1 +1 @@
        -{variable} = False
        +{variable} = True
        """)


def dense(noise: float = 0.02) -> Landscape:
    """Shaped like a dense transformer: recomputation off is the big win but needs a smaller
    micro-batch to fit; compile and a fused-attention patch stack; compile crashes with one kernel."""
    return Landscape(
        name="sim-dense",
        patches=["fused-attn", "fused-qkv", "cached-mask"],
        knobs={
            "checkpoint": (["on", "off"], "on"),
            "micro_batch": (["4", "8", "16"], "16"),
            "compile": (["0", "1"], "0"),
            "kernel": (["eager", "flash", "triton"], "eager"),
            "threads": (["1", "2"], "1"),
        },
        base_ms=24.0,
        base_mb=90.0,
        limit_mb=160.0,
        noise=noise,
        time={
            "checkpoint=off": 0.70,
            "micro_batch=8": 1.06,
            "micro_batch=4": 1.18,
            "compile=1": 0.85,
            "kernel=flash": 0.88,
            "kernel=triton": 0.93,
            "threads=2": 0.95,
            "+fused-attn": 0.90,
            "+fused-qkv": 0.96,
            "+cached-mask": 0.98,
            "compile=1&+fused-attn": 0.85,
            "kernel=flash&+fused-attn": 1.08,
            "compile=1&kernel=flash": 0.92,
        },
        memory={
            "checkpoint=off": 80.0,
            "micro_batch=8": -40.0,
            "micro_batch=4": -60.0,
            "compile=1": 10.0,
            "kernel=flash": -10.0,
            "+fused-attn": -10.0,
        },
        crash=["compile=1&kernel=triton"],
    )


def moe(noise: float = 0.02) -> Landscape:
    """Shaped like a mixture-of-experts model: a sorted-dispatch patch only pays with grouped GEMM,
    expert parallel capacity needs memory, and a kernel crashes with one dispatch patch."""
    return Landscape(
        name="sim-moe",
        patches=["sorted-dispatch", "fused-router", "cached-mask"],
        knobs={
            "checkpoint": (["on", "off"], "on"),
            "capacity": (["1.0", "1.25", "2.0"], "1.25"),
            "grouped_gemm": (["0", "1"], "0"),
            "micro_batch": (["4", "8"], "8"),
            "compile": (["0", "1"], "0"),
        },
        base_ms=30.0,
        base_mb=100.0,
        limit_mb=170.0,
        noise=noise,
        time={
            "checkpoint=off": 0.72,
            "capacity=1.0": 0.92,
            "capacity=2.0": 1.15,
            "grouped_gemm=1": 0.97,
            "+sorted-dispatch": 1.02,
            "grouped_gemm=1&+sorted-dispatch": 0.70,
            "+fused-router": 0.95,
            "compile=1": 0.9,
            "micro_batch=4": 1.1,
            "+cached-mask": 0.98,
        },
        memory={
            "checkpoint=off": 80.0,
            "capacity=1.0": -10.0,
            "capacity=2.0": 20.0,
            "micro_batch=4": -50.0,
            "+sorted-dispatch": 10.0,
            "compile=1": 10.0,
        },
        crash=["compile=1&+fused-router"],
    )
