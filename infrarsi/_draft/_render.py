"""The drafted contract as TOML, every guess commented where it was made."""

from __future__ import annotations

import re

from infrarsi._draft._catalog import Knob

__all__ = ["render"]


def _string(value: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped, the rest as is
    (JSON's escapes would write a character beyond the BMP as a surrogate pair, which TOML refuses)."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _comment(text: str) -> str:
    """Text that stays on one comment line."""
    return "".join(" " if ord(ch) < 0x20 or ord(ch) == 0x7F else ch for ch in text)


def _strings(values: list[str]) -> str:
    return "[" + ", ".join(_string(v) for v in values) + "]"


def _knob(knob: Knob) -> list[str]:
    lines = [f"[knobs.{knob.name}]" + (f"  # {_comment(knob.why)}" if knob.why else "")]
    if knob.form == "set":
        lines += [f"choices  = {_strings(knob.choices)}", f"baseline = {_string(knob.baseline)}"]
        lines += [f"set.{_string(c)} = {{ args = {_strings(knob.sets[c])} }}" for c in knob.choices]
    else:
        key = {"flag": "flag", "equals": "flag", "switch": "switch", "override": "override", "env": "env"}[knob.form]
        lines.append(f"{key} = {_string(knob.option)}")
        if knob.form == "equals":
            lines.append('form = "equals"')
        if knob.form == "switch" and knob.negation:
            lines.append(f"negation = {_string(knob.negation)}")
        lines += [f"choices  = {_strings(knob.choices)}", f"baseline = {_string(knob.baseline)}"]
    if knob.disabled:
        return [f"# {_comment(knob.disabled)}"] + [f"# {line}" for line in lines]
    return lines


def render(draft, name: str) -> str:
    """The contract text of ``draft`` (an `infrarsi._draft.Draft`)."""
    task_name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "job"
    out = [
        f"# Drafted by `infrarsi draft` from {_comment(draft.script)} "
        f"(arguments read as: {draft.style}). Review every line, then run `infrarsi init`.",
        "# What was guessed, and why:",
        *[f"#   - {_comment(line)}" for line in draft.why],
        *[f"#   ! {_comment(note)}" for note in draft.notes],
        "",
        "[task]",
        f"name = {_string(task_name)}",
        f"command = {_strings(draft.command)}",
        *(
            [f'launcher = "{draft.launcher}"     # the job as it is launched today', f"nproc_per_node = {draft.ranks}"]
            if draft.launcher != "none"
            else []
        ),
        *(
            [f"nnodes = {draft.nodes}             # a job across nodes: the Slurm executor below"]
            if draft.nodes > 1
            else []
        ),
        "timeout_s = 900",
        'evidence = "auto"      # the autoprobe observes the optimizer\'s steps: the script is not edited',
        "# tokens_per_step = 0  # where the model's first input is not the token ids, say how many a step trains on",
        "",
        "[scope]",
        f"editable  = {_strings(draft.editable)}",
        f"protected = {_strings(draft.protected)}",
        "",
        "[timing]",
        "warmup_steps  = 3      # optimizer steps left out of the measurement",
        "measure_steps = 10     # the script must run at least warmup + measure optimizer steps",
        "",
        "[numerics]",
        "loss_rtol      = 1e-3",
        "grad_norm_rtol = 1e-2",
        'precision      = ["fp32"]   # what the baseline trains in; `infrarsi baseline` says if it is not so',
        'require        = ["loss", "grad_norm", "precision"]',
        "",
        "[resources]",
        'device          = "cpu"     # "cuda" where it trains on a GPU',
        "memory_limit_mb = 16000     # the job's process tree above this is an out-of-memory run",
        "# peak_tflops   = 989.4     # for MFU; unset, a GPU in the built-in table gives it, the CPU has none",
        "",
    ]
    if not draft.knobs:
        out += ["# No knob found: add [knobs.NAME] tables (docs/contract.md), or patches.", ""]
    for knob in draft.knobs:
        out += _knob(knob) + [""]
    out += [
        "[search]",
        "budget_executions = 40",
        "ab_pairs          = 5",
        "min_speedup       = 1.02",
        "",
    ]
    if draft.nodes > 1:
        out += [
            "[executor]",
            'kind = "slurm"          # every node runs its ranks under InfraRSI\'s runner (docs/cluster.md)',
            "time_limit_min = 60",
            '# partition = "gpu"',
            "# gpus_per_node = 8",
            "",
        ]
    return "\n".join(out)
