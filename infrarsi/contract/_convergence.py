"""``[numerics.convergence]``: the long runs `verify` trains under several seeds, and how one is
launched (the contract's own command with more steps and the seed's argument or variable)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infrarsi.contract._launch import KnobLaunch, parse_launch

__all__ = ["Convergence", "parse_convergence", "take_convergence"]

_TABLE = "numerics.convergence"


@dataclass(frozen=True)
class Convergence:
    """The validated table; ``seed`` is the seed's launch form (None: no seed is passed)."""

    steps: int
    seeds: int
    margin: float | str | None  # a fraction of the tail loss, "calibrated", or None (the seeds' spread)
    tail: float
    seed: KnobLaunch | None

    @property
    def runs(self) -> int:
        """Long runs one verify makes: one per seed for each of the baseline and the candidate."""
        return 2 * self.seeds

    def describe(self) -> dict:
        return {
            "steps": self.steps,
            "seeds": self.seeds,
            "margin": self.margin,
            "tail": self.tail,
            "seed": None if self.seed is None else {"form": self.seed.form, "target": self.seed.target},
        }


def take_convergence(data: dict) -> tuple[dict, Any]:
    """The parsed TOML without ``[numerics.convergence]`` (``[numerics]``'s own keys are checked
    as a table of their own), and the table as written (None where absent)."""
    numerics = data.get("numerics")
    if not isinstance(numerics, dict) or "convergence" not in numerics:
        return data, None
    rest = {k: v for k, v in numerics.items() if k != "convergence"}
    return {**data, "numerics": rest}, numerics["convergence"]


def parse_convergence(values: dict[str, Any], total_steps: int, knobs: dict, fail: Callable[..., Any]) -> Convergence:
    """The table's values (each key checked by the schema) checked across keys and against the
    contract's window and knobs; ``fail(table, key, message)`` raises."""
    if values["steps"] <= total_steps:
        fail(
            _TABLE,
            "steps",
            f"expected more than the short window's warmup_steps + measure_steps ({total_steps}), "
            f"got {values['steps']}",
        )
    if values["tail"] > 1:
        fail(_TABLE, "tail", f"expected a fraction of the run, at most 1, got {values['tail']:g}")
    if round(values["steps"] * values["tail"]) < 2:
        fail(_TABLE, "tail", f"expected a tail of at least 2 steps, got {values['steps']} x {values['tail']:g}")
    forms = {"flag": values["seed_flag"], "override": values["seed_override"], "env": values["seed_env"]}
    seed = None
    if any(v is not None for v in forms.values()):

        def seed_fail(table, key, message):
            fail(table, f"seed_{key}" if key in forms else key, message)

        seed = parse_launch(_TABLE, {**forms, "switch": None, "set": None, "form": None, "negation": None}, seed_fail)
        seeds = tuple(str(s) for s in range(values["seeds"]))
        for name, knob in knobs.items():
            launch = knob.launch or KnobLaunch("flag" if knob.flag else "env", knob.flag or knob.env)
            clash = seed.targets(seeds) & launch.targets(knob.choices)
            if clash:
                fail(
                    _TABLE,
                    f"seed_{seed.form}",
                    f"{sorted(clash)[0]} is already set by knob {name!r}: the seed needs an argument of its own",
                )
    return Convergence(values["steps"], values["seeds"], values["margin"], values["tail"], seed)
