"""Well-known training settings, and the knobs `draft` proposes for the ones a script reads.

Each catalog entry names a setting by the names scripts give it (normalised: lower case,
``-`` as ``_``, the last part of a dotted key) and says what values to try. Micro-batch x
accumulation is one knob at the script's global batch. Settings that change precision
(TF32, Liger kernels) are proposed commented out: the contract must allow them explicitly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from infrarsi._draft._reading import ScriptFacts, Setting

__all__ = ["Knob", "propose", "HF_TRAINING_ARGUMENTS", "given_value"]

# TrainingArguments fields the catalog knows (name: default, kind), for HfArgumentParser scripts.
HF_TRAINING_ARGUMENTS = {
    "per_device_train_batch_size": ("8", "int"),
    "gradient_accumulation_steps": ("1", "int"),
    "gradient_checkpointing": ("False", "bool"),
    "torch_compile": ("False", "bool"),
    "optim": ("adamw_torch", "str"),
    "dataloader_num_workers": ("0", "int"),
    "use_liger_kernel": ("False", "bool"),
    "tf32": ("False", "bool"),
}

# knob name -> (names scripts use, what it is)
CATALOG: dict[str, tuple[frozenset[str], str]] = {
    "attention": (
        frozenset({"attn_implementation", "attention", "attn", "attention_impl", "attn_impl", "attention_backend"}),
        "the attention implementation",
    ),
    "checkpointing": (
        frozenset(
            {"gradient_checkpointing", "activation_checkpointing", "checkpoint", "checkpointing", "grad_checkpointing"}
        ),
        "activation (gradient) checkpointing: less memory, more compute",
    ),
    "compile": (frozenset({"compile", "torch_compile", "use_compile"}), "torch.compile"),
    "optimizer": (
        frozenset({"fused", "foreach", "fused_adam", "fused_adamw", "optim"}),
        "the optimizer's implementation",
    ),
    "workers": (frozenset({"num_workers", "dataloader_num_workers", "workers"}), "data-loading worker processes"),
    "liger": (frozenset({"use_liger_kernel", "liger", "use_liger", "liger_kernel"}), "Liger kernels"),
    "tf32": (frozenset({"tf32", "allow_tf32", "use_tf32"}), "TF32 matmuls"),
}
PRECISION_CHANGING = {"tf32": "tf32", "liger": "bf16"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # the contract's rule for a variable's name
BATCH = ("per_device_train_batch_size", "micro_batch_size", "batch_size", "train_batch_size", "micro_batch")
ACCUMULATION = (
    "gradient_accumulation_steps",
    "grad_accum",
    "accumulation_steps",
    "gradient_accumulation",
    "accum_steps",
)
GLOBAL_BATCH = ("global_batch_size", "global_batch", "batch", "total_batch_size")


@dataclass
class Knob:
    """A proposed ``[knobs.NAME]``: its launch form, choices, baseline, and why."""

    name: str
    form: str  # flag, equals, switch, override, env, set
    option: str = ""
    choices: list[str] = field(default_factory=list)
    baseline: str = ""
    negation: str | None = None
    sets: dict[str, list[str]] = field(default_factory=dict)  # form "set": choice -> args
    why: str = ""
    disabled: str | None = None  # why it is commented out
    consumes: list[str] = field(default_factory=list)  # setting names it drives


def _normal(name: str) -> str:
    return name.rsplit(".", 1)[-1].lower().replace("-", "_").removeprefix("env:")


def given_value(args: list[str], setting: Setting) -> tuple[str | None, list[int]]:
    """The value ``args`` give ``setting`` (last one wins) and the indexes of the args that give it.

    A flag of a bool setting given bare (``--gradient_checkpointing``, as HfArgumentParser
    allows) is ``True``; a flag's value is the next argument only when that is not an option.
    """
    value, used = None, []
    spellings = (setting.option, *setting.aliases)
    for i, arg in enumerate(args):
        if setting.form == "override":
            if arg.lstrip("+").partition("=")[0] == setting.option:
                value, used = arg.partition("=")[2], [i]
        elif setting.form == "switch":
            if arg in spellings:
                value, used = "True", [i]
            elif setting.negation and arg == setting.negation:
                value, used = "False", [i]
        elif any(arg.startswith(spelling + "=") for spelling in spellings if spelling.startswith("--")):
            value, used = arg.partition("=")[2], [i]
        elif arg in spellings and setting.form == "flag":
            following = args[i + 1] if i + 1 < len(args) else None
            if following is not None and not following.startswith("-"):
                value, used = following, [i, i + 1]
            elif setting.kind == "bool":
                value, used = "True", [i]
    return value, used


def _bool_choices(form: str, current: bool) -> tuple[list[str], str]:
    if form == "switch":
        return ["on", "off"], "on" if current else "off"
    if form == "override":
        return ["false", "true"], str(current).lower()
    if form == "env":
        return ["0", "1"], "1" if current else "0"
    return ["False", "True"], str(current)


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _catalog_knob(name: str, setting: Setting, current: str | None) -> Knob | None:
    """The knob for one catalog setting, or None where its values can't be told from the source."""
    what = CATALOG[name][1]
    form = setting.form
    knob = Knob(name, form, setting.option, negation=setting.negation, consumes=[setting.name])
    where = f"{setting.origin} {setting.option}" + (f" (line {setting.line})" if setting.line else "")
    bool_like = name in ("checkpointing", "compile", "liger", "tf32") or _normal(setting.name) in ("fused", "foreach")
    if setting.choices and form != "switch":
        knob.choices, knob.baseline = list(dict.fromkeys(setting.choices)), current or setting.choices[0]
    elif name == "optimizer" and _normal(setting.name) == "optim":
        if setting.origin != "TrainingArguments":
            return None  # a script's own --optim: its values are its own
        knob.choices = ["adamw_torch", "adamw_torch_fused"]
        knob.baseline = current or "adamw_torch"
    elif form == "switch" or (setting.kind == "bool" and form != "env"):
        knob.choices, knob.baseline = _bool_choices(form, _truthy(current))
    elif bool_like and (form == "env" or setting.kind == "int") and str(current) in ("0", "1"):
        knob.choices, knob.baseline = ["0", "1"], str(current)
    elif name == "attention" and setting.kind == "str" and form != "env":
        if current is None and _normal(setting.name) != "attn_implementation":
            return None
        base = current or "eager"
        knob.choices = [base] + [c for c in ("eager", "sdpa") if c != base and (c == "sdpa" or base == "eager")]
        knob.baseline = base
    elif name == "workers" and setting.kind == "int" and form != "env":
        try:
            base = int(current if current is not None else 0)
        except ValueError:
            return None
        knob.choices, knob.baseline = [str(v) for v in sorted({base, 2, 4})], str(base)
    else:
        return None
    if knob.baseline not in knob.choices:
        knob.choices.insert(0, knob.baseline)
    knob.why = f"{what}: {where}, now {knob.baseline}"
    if name in PRECISION_CHANGING:
        knob.disabled = (
            f"changes precision ({PRECISION_CHANGING[name]}): to search it, allow "
            f'"{PRECISION_CHANGING[name]}" in [numerics] precision and uncomment'
        )
    return knob


def _matches(knob_names: frozenset[str], name: str, setting: Setting) -> bool:
    """A setting is a catalog entry by its own name; an environment variable by its last words
    (``TINYGPT_COMPILE`` is ``compile``; ``CHECKPOINT_DIR`` is not checkpointing)."""
    if setting.form != "env":
        return _normal(name) in knob_names
    if not _ENV_NAME.match(setting.option) or setting.option.startswith("INFRARSI_"):
        return False
    words = setting.option.lower().split("_")
    return any("_".join(words[-k:]) in knob_names for k in range(1, min(3, len(words)) + 1))


def _set_args(setting: Setting, value: int) -> list[str]:
    if setting.form == "override":
        return [f"{setting.option}={value}"]
    if setting.form == "equals":
        return [f"{setting.option}={value}"]
    return [setting.option, str(value)]


def _batch_knob(settings: dict[str, Setting], current: dict[str, str | None]) -> tuple[Knob | None, str | None]:
    """Micro-batch x accumulation at the script's global batch, or a micro-batch that divides a
    stated global batch; a batch size alone is no knob (it changes the job)."""
    by_normal = {_normal(n): n for n, s in settings.items() if s.form != "env"}
    batch = next((by_normal[b] for b in BATCH if b in by_normal), None)
    accum = next((by_normal[a] for a in ACCUMULATION if a in by_normal), None)
    if batch is None:
        return None, None
    try:
        b = int(current[batch] or 0)
        a = int(current[accum] or 1) if accum else 1
    except ValueError:
        return None, f"{batch}: not a whole number, so no micro-batch knob"
    if b <= 0:
        return None, f"{batch} has no default, so no micro-batch knob"
    if accum:
        total = b * a
        pairs = [(m, total // m) for m in (total, total // 2, total // 4, total // 8) if m >= 1 and total % m == 0]
        knob = Knob("micro_batch", "set", consumes=[batch, accum])
        for m, k in dict.fromkeys(pairs):
            choice = f"{m}x{k}"
            knob.choices.append(choice)
            knob.sets[choice] = _set_args(settings[batch], m) + _set_args(settings[accum], k)
        knob.baseline = f"{b}x{a}"
        if knob.baseline not in knob.sets:
            knob.choices.insert(0, knob.baseline)
            knob.sets[knob.baseline] = _set_args(settings[batch], b) + _set_args(settings[accum], a)
        knob.why = (
            f"micro-batch x gradient accumulation at the global batch of {total}: {settings[batch].option} "
            f"and {settings[accum].option} set together"
        )
        return knob, None
    overall = next((by_normal[g] for g in GLOBAL_BATCH if g in by_normal and by_normal[g] != batch), None)
    if overall is None or "micro" not in _normal(batch):
        return None, f"{settings[batch].option} has no accumulation beside it: changing it alone changes the job"
    try:
        total = int(current[overall] or 0)
    except ValueError:
        return None, None
    if total <= 0:
        return None, None
    choices = [str(m) for m in (total // 4, total // 2, total) if m >= 1 and total % m == 0]
    knob = Knob("micro_batch", settings[batch].form, settings[batch].option, consumes=[batch])
    knob.choices = list(dict.fromkeys(choices))
    knob.baseline = str(b)
    if knob.baseline not in knob.choices:
        knob.choices.append(knob.baseline)
    knob.why = f"the micro-batch at the global batch of {total} ({settings[overall].option}; the script accumulates)"
    return knob, None


def propose(facts: ScriptFacts, args: list[str]) -> tuple[list[Knob], list[str], list[int]]:
    """Knobs for the catalog's settings the script reads; notes; the indexes of ``args`` they take over."""
    settings = dict(facts.settings)
    if facts.style == "hf":
        for name, (default, kind) in HF_TRAINING_ARGUMENTS.items():
            settings.setdefault(name, Setting(name, f"--{name}", "flag", default, kind, origin="TrainingArguments"))
    current, used_args = {}, {}
    for name, setting in settings.items():
        value, used = given_value(args, setting)
        current[name] = value if value is not None else setting.default
        used_args[name] = used
    knobs, notes = [], []
    batch, note = _batch_knob(settings, current)
    if batch:
        knobs.append(batch)
    if note:
        notes.append(note)
    taken = {n for k in knobs for n in k.consumes}
    for knob_name, (names, _) in CATALOG.items():
        for name, setting in settings.items():
            if name in taken or not _matches(names, name, setting):
                continue
            knob = _catalog_knob(knob_name, setting, current[name])
            if knob is None:
                if setting.form != "env":  # a variable that is no switch is simply not a knob
                    notes.append(
                        f"{setting.option}: {CATALOG[knob_name][1]}, but its values can't be told from the source"
                    )
                continue
            if any(k.name == knob.name for k in knobs):
                knob.name = f"{knob.name}_{_normal(name)}"
            knobs.append(knob)
            taken.add(name)
            break
    consumed = sorted({i for k in knobs if not k.disabled for n in k.consumes for i in used_args.get(n, [])})
    return knobs, notes, consumed
