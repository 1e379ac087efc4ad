"""The schema of ``infrarsi.toml``: every section and key, its type, default and meaning.

The contract parser validates against this table, and the contract reference in
the docs is generated from it, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "Field",
    "SECTIONS",
    "KNOB_FIELDS",
    "PATCH_FIELDS",
    "LOG_FIELDS",
    "CONVERGENCE_FIELDS",
    "REQUIRED",
    "PRECISIONS",
    "REQUIRABLE",
    "EVIDENCE_KINDS",
    "LAUNCHERS",
    "EXECUTORS",
    "DEVICES",
    "PROPOSERS",
]

REQUIRED = object()
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
REQUIRABLE = ("loss", "grad_norm", "precision")
EVIDENCE_KINDS = ("probe", "auto", "log")
LAUNCHERS = ("none", "torchrun")
DEVICES = ("cpu", "cuda")
PROPOSERS = ("contract", "catalog", "llm")


@dataclass(frozen=True)
class Field:
    """One contract key. ``kind`` is one of str, int, float, bool, tolerance (a float or "calibrated"),
    str_list, choice_list, choice_values, choice_value, choice_launch."""

    name: str
    kind: str
    default: Any
    doc: str
    minimum: float | None = None
    exclusive_minimum: bool = False
    one_of: tuple[str, ...] | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


EXECUTORS = ("local", "slurm")

SECTIONS: dict[str, tuple[Field, ...]] = {
    "task": (
        Field("name", "str", REQUIRED, "a short name for the job"),
        Field(
            "command",
            "str_list",
            REQUIRED,
            'argv run in the sandbox copy; a leading "python" is the interpreter infrarsi runs under',
        ),
        Field(
            "timeout_s",
            "float",
            600.0,
            "wall-clock limit of one execution; past it the process group is killed",
            minimum=0,
            exclusive_minimum=True,
        ),
        Field("evidence", "str", "probe", "where receipts come from", one_of=EVIDENCE_KINDS),
        Field(
            "launcher",
            "str",
            "none",
            "how the job's processes start: `none` (the command, one process) or `torchrun` (the command's "
            "script under `torchrun`, `nproc_per_node` ranks, each reporting through a receipt channel of its "
            "own; the slowest rank ends each step, every rank's numerics are checked)",
            one_of=LAUNCHERS,
        ),
        Field("nproc_per_node", "int", 1, 'with `launcher = "torchrun"`: ranks on each node', minimum=1),
        Field(
            "nnodes",
            "int",
            1,
            'with `launcher = "torchrun"`: nodes, each running `nproc_per_node` ranks; more than one needs '
            '`[executor] kind = "slurm"`',
            minimum=1,
        ),
        Field(
            "timing_sensitive",
            "bool",
            True,
            "false: runs side by side can't disturb each other's timing (a job that sleeps, or one that waits on "
            "a service), so `search --workers N` may run N at once on this machine; leave it true for a job that "
            "computes: beside another, its step time measures the other",
        ),
        Field(
            "tokens_per_step",
            "int",
            None,
            "tokens one training step trains on, for tokens/s and MFU where the receipts count none "
            "(`log` evidence without a tokens regex; `auto` where the inputs are not one integer tensor)",
            minimum=1,
        ),
    ),
    "scope": (
        Field("editable", "str_list", (), "globs a patch may touch"),
        Field("protected", "str_list", (), "globs pinned by SHA-256 at init; the contract itself is always protected"),
    ),
    "timing": (
        Field("warmup_steps", "int", 10, "steps run but not measured", minimum=0),
        Field("measure_steps", "int", 20, "measured steps after the warmup", minimum=1),
    ),
    "numerics": (
        Field(
            "loss_rtol",
            "tolerance",
            1e-3,
            'per-step relative tolerance of the loss against the baseline; `"calibrated"`: the one '
            "`infrarsi baseline --calibrate` measured from the job's own noise (stored with the baseline)",
            minimum=0,
            exclusive_minimum=True,
        ),
        Field(
            "grad_norm_rtol",
            "tolerance",
            1e-2,
            "per-step relative tolerance of the grad norm (and of each parameter's at the sampled steps); "
            '`"calibrated"` as for loss_rtol',
            minimum=0,
            exclusive_minimum=True,
        ),
        Field("precision", "choice_list", ("fp32",), "training dtypes allowed", one_of=PRECISIONS),
        Field("require", "choice_list", REQUIRABLE, "checks that must have evidence and pass", one_of=REQUIRABLE),
    ),
    "resources": (
        Field("device", "str", "cpu", "where the job trains", one_of=DEVICES),
        Field(
            "memory_limit_mb",
            "float",
            REQUIRED,
            "enforced limit on the RSS of the job's process tree (with a launcher: of each rank's processes); "
            "above it the execution is oom",
            minimum=0,
            exclusive_minimum=True,
        ),
        Field(
            "peak_tflops",
            "float",
            None,
            "one device's peak MFU is measured against (a job of several ranks: one device each, so their "
            "peaks add up); unset, a GPU in the built-in table of data-sheet peaks (H100, H200, A100, L40S, "
            "L4, V100) gives it for the precision the baseline trains in, and elsewhere (the CPU) there is no MFU",
            minimum=0,
            exclusive_minimum=True,
        ),
    ),
    "search": (
        Field("budget_executions", "int", 40, "executions a search may launch, promotion reruns included", minimum=1),
        Field("starts", "int", 4, "diverse starting points of the multi-start search", minimum=1),
        Field("promote_top", "int", 3, "candidates re-run A/B before promotion", minimum=1),
        Field(
            "ab_pairs",
            "int",
            5,
            "back-to-back baseline/candidate pairs before the A/B's first look (promotion and `verify`)",
            minimum=2,
        ),
        Field(
            "ab_max_pairs",
            "int",
            None,
            "the sequential A/B: while the speedup's interval still straddles min_speedup, one more pair and "
            "another look, up to this many pairs (the error split over the looks); unset, ab_pairs (one look)",
            minimum=2,
        ),
        Field("min_speedup", "float", 1.02, "the lower bound of the speedup CI must clear this", minimum=1.0),
        Field(
            "drift_tolerance",
            "float",
            0.15,
            "how far (a fraction) the A/B's baseline runs may stray from the stored baseline, or 5x its "
            "run-to-run CV if larger, before stats.speedup is unchecked; raise it on a machine shared with other work",
            minimum=0,
            exclusive_minimum=True,
        ),
        Field(
            "proposers",
            "choice_list",
            PROPOSERS,
            "where patches come from: the contract's [[patches]], the built-in codemod catalog, an LLM",
            one_of=PROPOSERS,
        ),
        Field("seed", "int", 0, "seed of the search's random starts (a resumed search keeps its own)", minimum=0),
        Field(
            "llm_base_url",
            "str",
            None,
            "an OpenAI-compatible endpoint (else $INFRARSI_LLM_BASE_URL; the LLM proposer is off without one)",
        ),
        Field("llm_model", "str", None, "the model name sent to the endpoint (else $INFRARSI_LLM_MODEL)"),
        Field(
            "llm_api_key_env",
            "str",
            "INFRARSI_LLM_API_KEY",
            "the environment variable holding the key (never the key itself: the contract is committed)",
        ),
        Field("llm_max_proposals", "int", 3, "patches asked of the LLM per search", minimum=0),
        Field("llm_cost_per_1k_tokens", "float", 0.0, "price of 1,000 tokens, for the cost totals", minimum=0.0),
    ),
    "executor": (
        Field(
            "kind",
            "str",
            "local",
            "where executions run: `local` (this machine, one at a time) or `slurm` (each execution one Slurm "
            "job through submitit, running InfraRSI's runner on the node; the workspace must be on a file "
            "system the node sees at the same path)",
            one_of=EXECUTORS,
        ),
        Field("partition", "str", None, "`slurm`: the partition (`#SBATCH --partition`); unset, the cluster's default"),
        Field("account", "str", None, "`slurm`: the account charged (`#SBATCH --account`)"),
        Field(
            "time_limit_min",
            "int",
            60,
            "`slurm`: each job's time limit in minutes (`#SBATCH --time`); a verify's one allocation holds all "
            "its runs, so size it for 1 + 2 x ab_max_pairs runs",
            minimum=1,
        ),
        Field("gpus_per_node", "int", 0, "`slurm`: GPUs per node (`#SBATCH --gpus-per-node`)", minimum=0),
        Field("cpus_per_task", "int", None, "`slurm`: CPUs for the job (`#SBATCH --cpus-per-task`)", minimum=1),
        Field(
            "sbatch",
            "str_list",
            (),
            '`slurm`: more `#SBATCH` options, each "--key=value" (for example "--qos=high", "--constraint=h100")',
        ),
    ),
}

KNOB_FIELDS: tuple[Field, ...] = (
    Field("choices", "choice_values", REQUIRED, "the values this knob may take (strings or integers)"),
    Field("baseline", "choice_value", REQUIRED, "the value of the original setup; one of choices"),
    Field("flag", "str", None, "a command-line flag given the value: `FLAG VALUE`, or `FLAG=VALUE` with `form`"),
    Field(
        "form",
        "str",
        None,
        "with `flag`: `separate` (`FLAG VALUE`, the default) or `equals` (`FLAG=VALUE`)",
        one_of=("separate", "equals"),
    ),
    Field("override", "str", None, "a bare `KEY=VALUE` argument (Hydra's `trainer.lr=3e-4`, key=value configurators)"),
    Field("env", "str", None, "an environment variable set to the value"),
    Field("switch", "str", None, "a presence-only flag: choices `on` (adds it) and `off` (nothing, or `negation`)"),
    Field("negation", "str", None, "with `switch`: what `off` adds instead of nothing (e.g. `--no-compile`)"),
    Field(
        "set",
        "choice_launch",
        None,
        'per choice, the arguments and variables it sets: `set.CHOICE = { args = [...], env = { NAME = "v" } }`',
    ),
)

PATCH_FIELDS: tuple[Field, ...] = (
    Field("name", "str", REQUIRED, "the name used by --patch and in outputs"),
    Field("file", "str", REQUIRED, "a unified diff, relative to the workspace"),
)

CONVERGENCE_FIELDS: tuple[Field, ...] = (
    Field(
        "steps",
        "int",
        REQUIRED,
        "steps of each long run (more than warmup_steps + measure_steps; 10x to 50x the window is typical)",
        minimum=2,
    ),
    Field("seeds", "int", 3, "long runs of each of the baseline and the candidate, one per seed 0, 1, ...", minimum=2),
    Field("seed_flag", "str", None, "a flag the seed is given with: `FLAG SEED` (for example `--seed`)"),
    Field("seed_override", "str", None, "a bare `KEY=SEED` argument (Hydra's `seed`)"),
    Field(
        "seed_env",
        "str",
        None,
        "an environment variable set to the seed; with no seed key at all, every run of an arm is the same "
        "launch and the spread is the job's own nondeterminism",
    ),
    Field(
        "margin",
        "tolerance",
        None,
        "the equivalence margin on the loss averaged over the tail, relative to the baseline's; unset, the "
        'baseline\'s seed-to-seed standard deviation there (never below loss_rtol); `"calibrated"`: the spread '
        "`infrarsi baseline --calibrate` measured over the baseline's own long runs",
        minimum=0,
        exclusive_minimum=True,
    ),
    Field(
        "tail",
        "float",
        0.2,
        "the final fraction of each long run whose loss is averaged for the equivalence test (at most 1)",
        minimum=0,
        exclusive_minimum=True,
    ),
)

LOG_FIELDS: tuple[Field, ...] = (
    Field("step", "str", REQUIRED, "regex with one group: the step number"),
    Field("loss", "str", None, "regex with one group: the loss"),
    Field("grad_norm", "str", None, "regex with one group: the grad norm"),
    Field("tokens", "str", None, "regex with one group: tokens in the step"),
)
