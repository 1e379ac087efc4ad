"""How a knob's value reaches the job: the launch forms a contract can name, and the arguments
and environment variables each choice sets.

Five forms, one per knob: ``flag`` (``FLAG VALUE``, or ``FLAG=VALUE`` with ``form = "equals"``),
``override`` (a bare ``KEY=VALUE`` argument: Hydra, ``--key=value`` configurators that take
``key=value``), ``env`` (a variable), ``switch`` (presence only: ``on`` adds the flag, ``off``
adds nothing or the ``negation``), and ``set`` (per choice, any arguments and variables at once:
micro-batch x accumulation at a fixed global batch is one choice that sets two arguments).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

__all__ = ["KnobLaunch", "argument_key", "parse_launch", "shown_value", "FORMS", "SWITCH_CHOICES"]

FORMS = ("flag", "override", "env", "switch", "set")
SWITCH_CHOICES = ("on", "off")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG_RE = re.compile(r"^-[^\s=]+$")
_OVERRIDE_RE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.@/-]*$")
Fail = Callable[[str, "str | None", str], NoReturn]


def shown_value(value: Any) -> str:
    """A bad value as every contract error shows it."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return f"a list {value!r}"[:80]
    return f"{type(value).__name__} {value!r}"[:80]


def argument_key(token: str) -> str | None:
    """What one argv token sets: ``--lr`` for ``--lr`` and ``--lr=3e-4``; ``trainer.lr`` for a
    Hydra override (``trainer.lr=3e-4``, ``+trainer.lr=...``, ``~trainer.lr``); None for a bare
    value (it belongs to the flag before it)."""
    if token.startswith("-"):
        return token.split("=", 1)[0]
    if "=" in token or token.startswith("~"):
        return token.split("=", 1)[0].lstrip("+~")
    return None


@dataclass(frozen=True)
class KnobLaunch:
    """One knob's launch form; ``settings(value)`` gives the arguments and variables it adds."""

    form: str
    target: str | None = None  # the flag, override key, variable or switch
    equals: bool = False  # flag form: FLAG=VALUE instead of FLAG VALUE
    negation: str | None = None  # switch form: what `off` adds
    sets: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = field(default_factory=dict)

    def settings(self, value: str) -> tuple[list[str], dict[str, str]]:
        """The arguments appended to the command and the environment variables set for ``value``."""
        if self.form == "flag":
            return ([f"{self.target}={value}"] if self.equals else [self.target, value]), {}
        if self.form == "override":
            return [f"{self.target}={value}"], {}
        if self.form == "env":
            return [], {self.target: value}
        if self.form == "switch":
            if value == "on":
                return [self.target], {}
            return ([self.negation] if self.negation else []), {}
        args, env = self.sets[value]
        return list(args), dict(env)

    def targets(self, choices: tuple[str, ...]) -> set[str]:
        """Every argument key (``--flag``, ``key``) and variable (``$NAME``) any choice sets."""
        found: set[str] = set()
        for value in choices:
            args, env = self.settings(value)
            found |= {key for key in map(argument_key, args) if key}
            found |= {f"${name}" for name in env}
        if self.form == "switch" and self.negation:
            found.add(argument_key(self.negation) or self.negation)
        return found


def parse_launch(table: str, values: dict[str, Any], fail: Fail) -> KnobLaunch:
    """The one launch form a validated ``[knobs.NAME]`` table names, checked; ``fail(table, key,
    message)`` raises the contract error."""
    given = [form for form in FORMS if values[form] is not None]
    if len(given) != 1:
        fail(
            table,
            given[1] if len(given) > 1 else None,
            "expected exactly one of "
            + ", ".join(f"`{f}`" for f in FORMS)
            + ", got "
            + (
                (("both " if len(given) == 2 else "all of ") + " and ".join(f"`{f}`" for f in given))
                if given
                else "neither"
            ),
        )
    form = given[0]
    for extra, needs in (("form", "flag"), ("negation", "switch")):
        if values[extra] is not None and form != needs:
            fail(table, extra, f"only with `{needs}`")
    target = values[form] if form != "set" else None
    if form in ("flag", "switch") and not _FLAG_RE.match(target):
        fail(table, form, f"expected a flag like --name (no spaces or '='), got {target!r}")
    if values["negation"] is not None and not _FLAG_RE.match(values["negation"]):
        fail(table, "negation", f"expected a flag like --no-name, got {values['negation']!r}")
    if form == "override" and not _OVERRIDE_RE.match(target):
        fail(
            table,
            "override",
            f"expected a key like trainer.batch_size (no '=', spaces or leading '-'), got {target!r}",
        )
    if form == "env":
        _check_env(table, "env", target, fail)
    if form == "switch" and sorted(values["choices"]) != sorted(SWITCH_CHOICES):
        fail(table, "choices", f'a switch has exactly the choices "on" and "off", got {list(values["choices"])}')
    sets = {}
    if form == "set":
        sets = _choice_sets(table, values["set"], values["choices"], fail)
    return KnobLaunch(form, target, equals=values["form"] == "equals", negation=values["negation"], sets=sets)


def _choice_sets(table: str, raw: dict, choices: tuple[str, ...], fail: Fail) -> dict:
    """``set.CHOICE = { args = [...], env = {...} }`` for every choice, and nothing else."""
    missing = [c for c in choices if c not in raw]
    unknown = [c for c in raw if c not in choices]
    if missing or unknown:
        fail(
            table,
            "set",
            f"expected one entry per choice {list(choices)}; "
            + (f"missing {missing}" if missing else f"not a choice: {unknown}"),
        )
    out = {}
    for choice in choices:
        entry = raw[choice]
        where = f"set.{choice}"
        if not isinstance(entry, dict) or set(entry) - {"args", "env"}:
            expected = '{ args = [...], env = { NAME = "value" } }'
            fail(table, where, f"expected {expected}, got {shown_value(entry)}")
        args, env = entry.get("args", []), entry.get("env", {})
        if not isinstance(args, list) or not all(isinstance(a, str) and a for a in args):
            fail(table, f"{where}.args", f"expected a list of non-empty strings, got {shown_value(args)}")
        if not isinstance(env, dict) or not all(
            isinstance(v, (str, int)) and not isinstance(v, bool) for v in env.values()
        ):
            fail(table, f"{where}.env", f'expected a table of NAME = "value", got {shown_value(env)}')
        for var in env:
            _check_env(table, f"{where}.env", var, fail)
        keys = [k for k in map(argument_key, args) if k]
        if len(keys) != len(set(keys)):
            fail(table, f"{where}.args", f"sets the same argument twice: {args}")
        out[choice] = (tuple(args), tuple((k, str(v)) for k, v in env.items()))
    return out


def _check_env(table: str, key: str, name: str, fail: Fail) -> None:
    if not _ENV_RE.match(name) or name.startswith("INFRARSI_"):
        fail(table, key, f"expected an environment variable name not starting with INFRARSI_, got {name!r}")
