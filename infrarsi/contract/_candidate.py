"""A candidate: knob settings plus patches, resolved against the contract."""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from infrarsi.contract._contract import Contract, Knob, Section
from infrarsi.contract._launcher import launched
from infrarsi.errors import UsageError

__all__ = [
    "Candidate",
    "PatchRef",
    "resolve_candidate",
    "parse_sets",
    "changes_from",
    "launch_settings",
    "launch_command",
    "long_run",
    "SEED_KNOB",
]

SEED_KNOB = "convergence.seed"  # the seed's launch, added to a long run's contract as one more knob


@dataclass(frozen=True)
class PatchRef:
    """A patch as it will be applied: its name in outputs, its text and hash."""

    name: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class Candidate:
    knobs: dict[str, str]
    patches: tuple[PatchRef, ...] = field(default_factory=tuple)

    def describe(self) -> dict:
        """The DESIGN.md shape: knob name -> choice, patch names."""
        return {"knobs": dict(self.knobs), "patches": [p.name for p in self.patches]}


def changes_from(baseline_knobs: dict[str, str], knobs: dict[str, str], patches: list[str]) -> list[str]:
    """How a candidate reads to a person: its knob settings off the baseline (``k=v``), then its patches."""
    return [f"{k}={v}" for k, v in sorted(knobs.items()) if baseline_knobs.get(k) != v] + list(patches)


def launch_settings(contract: Contract, knobs: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The contract's command with these knob settings: each knob's arguments appended in the
    contract's order of knobs (so the same settings always give the same argv), its variables set.
    The one place knobs become a launch, for the runner and for `apply` alike (the runner then
    resolves ``python`` to its interpreter); contract/_launch.py has the forms."""
    argv, env = list(contract.task.command), {}
    for name, knob in contract.knobs.items():
        if name in knobs:
            args, variables = knob.settings(knobs[name])
            argv += args
            env.update(variables)
    return launched(contract.task, argv), env


def parse_sets(sets: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set {item!r}: expected KNOB=VALUE")
        out[key.strip()] = value.strip()
    return out


def _patch_text(contract: Contract, ref: str) -> PatchRef:
    spec = contract.patch(ref)
    if spec is not None:
        path, name = spec.path, spec.name
    else:
        path = Path(ref)
        if not path.is_absolute():
            path = (Path.cwd() / path) if (Path.cwd() / path).is_file() else contract.workspace / path
        if not path.is_file():
            names = ", ".join(p.name for p in contract.patches) or "none declared"
            raise UsageError(
                f"--patch {ref!r}: neither a patch named in {contract.path.name} ({names}) nor a readable file"
            )
        try:
            name = path.resolve().relative_to(contract.workspace).as_posix()
        except ValueError:
            name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--patch {ref!r}: cannot read {path}: {exc}") from None
    return PatchRef(name=name, text=text)


def resolve_candidate(
    contract: Contract, sets: dict[str, str] | None = None, patches: list[str] | None = None
) -> Candidate:
    """Knob settings (baseline for the unset ones) and patch texts, validated."""
    knobs = contract.baseline_knobs()
    for key, value in (sets or {}).items():
        knob = contract.knobs.get(key)
        if knob is None:
            raise UsageError(
                f"--set {key}={value}: unknown knob; the contract declares {', '.join(contract.knobs) or 'no knobs'}"
            )
        if value not in knob.choices:
            raise UsageError(f"--set {key}={value}: expected one of {', '.join(knob.choices)}")
        knobs[key] = value
    refs = tuple(_patch_text(contract, ref) for ref in (patches or []))
    if len({r.name for r in refs}) != len(refs):
        raise UsageError("--patch: the same patch is given twice")
    return Candidate(knobs=knobs, patches=refs)


def launch_command(contract, knobs: dict[str, str]) -> dict:
    """The contract's command with these knob settings: ``{argv, env, shell}`` (flags appended, env set)."""
    argv, env = launch_settings(contract, knobs)
    shell = " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.join(argv)])
    return {"argv": argv, "env": env, "shell": shell}


def long_run(contract: Contract, candidate: Candidate, seed: int) -> tuple[Contract, Candidate]:
    """The contract and candidate one of ``[numerics.convergence]``'s long runs launches: its
    ``steps`` steps (the warm-up kept, the rest measured), the timeout scaled with the steps, and
    for seeds 1, 2, ... the seed given the way the table says (as a knob of its own, after the
    contract's knobs); seed 0 is the job's own launch, with no seed argument."""
    conv = contract.convergence
    timing = {**contract.timing.values, "measure_steps": conv.steps - contract.timing.warmup_steps}
    task = {**contract.task.values, "timeout_s": contract.task.timeout_s * conv.steps / contract.total_steps}
    long = dataclasses.replace(contract, timing=Section(timing), task=Section(task))
    if conv.seed is None or seed == 0:
        # Seed 0 is launched exactly as the job runs without InfraRSI (no seed argument): a job
        # that behaves one way when given a seed and another without can't pass both pairs.
        return long, candidate
    knob = Knob(SEED_KNOB, tuple(str(s) for s in range(conv.seeds)), "0", launch=conv.seed)
    return (
        dataclasses.replace(long, knobs={**contract.knobs, SEED_KNOB: knob}),
        Candidate({**candidate.knobs, SEED_KNOB: str(seed)}, candidate.patches),
    )
