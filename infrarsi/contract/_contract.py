"""The task contract, ``infrarsi.toml``, parsed into typed, validated objects.

Every error names the file, the key (with its line where it can be found) and
what was expected; :class:`ContractError` is what the CLI turns into exit 2.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infrarsi.contract._convergence import Convergence, parse_convergence, take_convergence
from infrarsi.contract._crosschecks import check_executor, check_search
from infrarsi.contract._globs import check_glob, matches
from infrarsi.contract._launch import KnobLaunch, parse_launch, shown_value as _show
from infrarsi.contract._launcher import check_launcher, check_nodes, ranks
from infrarsi.contract._logpatterns import log_patterns_of
from infrarsi.contract._schema import CONVERGENCE_FIELDS, KNOB_FIELDS, PATCH_FIELDS, SECTIONS, Field
from infrarsi.errors import ContractError

__all__ = ["Contract", "Knob", "PatchSpec", "load_contract", "parse_contract", "DEFAULT_CONTRACT"]

DEFAULT_CONTRACT = "infrarsi.toml"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Knob:
    name: str
    choices: tuple[str, ...]
    baseline: str
    flag: str | None = None
    env: str | None = None
    launch: KnobLaunch | None = None  # how the value reaches the job (built from flag/env when absent)

    def settings(self, value: str) -> tuple[list[str], dict[str, str]]:
        """The arguments and environment variables this knob adds at ``value``."""
        launch = self.launch or KnobLaunch("flag" if self.flag else "env", self.flag or self.env)
        return launch.settings(value)


@dataclass(frozen=True)
class PatchSpec:
    name: str
    file: str  # as written, relative to the workspace
    path: Path  # resolved


@dataclass(frozen=True)
class Section:
    """A validated section: its values by key name."""

    values: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "values":  # unpickling asks before ``values`` is set
            raise AttributeError(name)
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class Contract:
    path: Path
    text: str
    sha256: str
    task: Section
    scope: Section
    timing: Section
    numerics: Section
    resources: Section
    search: Section
    executor: Section
    knobs: dict[str, Knob] = field(default_factory=dict)
    patches: tuple[PatchSpec, ...] = ()
    log_patterns: dict[str, str] | None = None
    convergence: Convergence | None = None  # [numerics.convergence], where the contract has it
    # [executor] keys set by command-line flags for one command (contract/_executorflags.py):
    # ``executor`` holds the table with them; the file, its text and hash are the pinned ones.
    executor_flags: dict[str, Any] = field(default_factory=dict)

    @property
    def workspace(self) -> Path:
        return self.path.parent

    @property
    def state_dir(self) -> Path:
        """Where the ledger, manifest and keys live: ``.infrarsi/``, or ``.infrarsi/contracts/STEM/``
        for a contract named ``STEM.toml`` (one folder down, so no stem can clash with
        the default contract's own entries such as ``keys/`` or ``receipts/``)."""
        base = self.workspace / ".infrarsi"
        return base if self.path.name == DEFAULT_CONTRACT else base / "contracts" / self.path.stem

    @property
    def total_steps(self) -> int:
        return self.timing.warmup_steps + self.timing.measure_steps

    @property
    def ab_max_pairs(self) -> int:
        """The most A/B pairs a verify may take: ``[search] ab_max_pairs``, else ``ab_pairs`` (one look)."""
        return self.search.ab_max_pairs or self.search.ab_pairs

    @property
    def ranks(self) -> int:
        """How many processes report receipts: 1, or every rank a launcher starts."""
        return ranks(self.task)

    @property
    def protected_globs(self) -> tuple[str, ...]:
        return tuple(self.scope.protected) + (self.path.name,)

    def baseline_knobs(self) -> dict[str, str]:
        return {name: knob.baseline for name, knob in self.knobs.items()}

    def patch(self, name: str) -> PatchSpec | None:
        return next((p for p in self.patches if p.name == name), None)


class _Locator:
    """Finds the line of a key in TOML text; tomllib keeps no positions."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def line(self, table: str | None, key: str | None = None, index: int = 0) -> int | None:
        start, end = 0, len(self.lines)
        if table is not None:
            header = re.compile(rf"^\s*\[\[?\s*{re.escape(table)}\s*\]\]?\s*(#.*)?$")
            hits = [i for i, text in enumerate(self.lines) if header.match(text)]
            if len(hits) <= index:
                return self._key_anywhere(table.split(".")[-1]) if key is None else self._key_anywhere(key)
            start = hits[index]
            if key is None:
                return start + 1
            end = next(
                (i for i in range(start + 1, len(self.lines)) if re.match(r"^\s*\[", self.lines[i])), len(self.lines)
            )
        if key is None:
            return None
        pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
        for i in range(start, end):
            if pattern.match(self.lines[i]):
                return i + 1
        return None

    def _key_anywhere(self, key: str) -> int | None:
        pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*[=.]")
        return next((i + 1 for i, text in enumerate(self.lines) if pattern.match(text)), None)


class _Parser:
    def __init__(self, path: Path, text: str, check_files: bool = True) -> None:
        self.path, self.text, self.check_files = path, text, check_files
        self.file = str(path)
        self.locate = _Locator(text)

    def fail(self, table: str | None, key: str | None, message: str, index: int = 0) -> None:
        shown = ".".join(p for p in (table, key) if p) or None
        raise ContractError(self.file, shown, message, self.locate.line(table, key, index))

    # -- values ----------------------------------------------------------------
    def value(self, table: str, spec: Field, raw: Any, index: int = 0) -> Any:
        def bad(expected: str) -> None:
            self.fail(table, spec.name, f"expected {expected}, got {_show(raw)}", index)

        kind = spec.kind
        if kind == "str":
            if not isinstance(raw, str):
                bad("a string")
            value: Any = raw
        elif kind == "bool":
            if not isinstance(raw, bool):
                bad("true or false")
            value = raw
        elif kind == "int":
            if isinstance(raw, bool) or not isinstance(raw, int):
                bad("an integer")
            value = raw
        elif kind == "float" or (kind == "tolerance" and raw != "calibrated"):
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
                bad("a finite number" if kind == "float" else 'a finite number or "calibrated"')
            value = float(raw)
        elif kind == "tolerance":
            return "calibrated"
        elif kind in ("str_list", "choice_list"):
            if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
                bad("a list of strings")
            value = tuple(raw)
        elif kind == "choice_values":
            if (
                not isinstance(raw, list)
                or not raw
                or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in raw)
            ):
                bad("a non-empty list of strings or integers")
            value = tuple(str(v) for v in raw)
            if len(set(value)) != len(value):
                bad("distinct choices")
        elif kind == "choice_value":
            if isinstance(raw, bool) or not isinstance(raw, (str, int)):
                bad("a string or integer")
            value = str(raw)
        elif kind == "choice_launch":
            if not isinstance(raw, dict):
                bad('a table: choice -> { args = [...], env = { NAME = "value" } }')
            value = dict(raw)
        else:  # pragma: no cover - schema error
            raise AssertionError(kind)
        if spec.minimum is not None:
            low_ok = value > spec.minimum if spec.exclusive_minimum else value >= spec.minimum
            if not low_ok:
                rel = ">" if spec.exclusive_minimum else ">="
                self.fail(table, spec.name, f"expected a value {rel} {spec.minimum:g}, got {_show(raw)}", index)
        if spec.one_of is not None:
            values = value if isinstance(value, tuple) else (value,)
            for v in values:
                if v not in spec.one_of:
                    self.fail(table, spec.name, f"expected one of {', '.join(spec.one_of)}, got {_show(v)}", index)
        return value

    def section(self, table: str, raw: Any, fields: tuple[Field, ...], index: int = 0) -> dict[str, Any]:
        if not isinstance(raw, dict):
            self.fail(table, None, f"expected a table [{table}], got {_show(raw)}", index)
        known = {f.name: f for f in fields}
        for key in raw:
            if key not in known:
                self.fail(table, key, f"unknown key; expected one of {', '.join(known)}", index)
        out: dict[str, Any] = {}
        for spec in fields:
            if spec.name in raw:
                out[spec.name] = self.value(table, spec, raw[spec.name], index)
            elif spec.required:
                self.fail(table, spec.name, "missing required key", index)
            else:
                out[spec.name] = spec.default
        return out

    # -- whole contract --------------------------------------------------------
    def parse(self) -> Contract:
        try:
            data = tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as exc:
            raise ContractError(self.file, None, f"not valid TOML: {exc}") from None
        allowed = set(SECTIONS) | {"knobs", "patches", "evidence"}
        for key in data:
            if key not in allowed:
                self.fail(None, key, f"unknown section; expected one of {', '.join(sorted(allowed))}")
        for required in ("task", "resources"):
            if required not in data:
                raise ContractError(self.file, f"[{required}]", "missing required section")
        data, long_runs = take_convergence(data)
        sections = {name: Section(self.section(name, data.get(name, {}), fields)) for name, fields in SECTIONS.items()}
        self.check_task(sections["task"])
        self.check_scope(sections["scope"])
        check_search(sections["search"], self.fail)
        check_executor(sections["executor"], self.fail)
        check_nodes(sections["task"], sections["executor"], self.fail)
        knobs = self.knobs(data.get("knobs", {}))
        patches = self.patches(data.get("patches", []))
        log_patterns = log_patterns_of(
            data.get("evidence"), sections["task"].evidence, self.file, self.section, self.fail
        )
        convergence = None
        if long_runs is not None:
            values, timing = self.section("numerics.convergence", long_runs, CONVERGENCE_FIELDS), sections["timing"]
            convergence = parse_convergence(values, timing.warmup_steps + timing.measure_steps, knobs, self.fail)
        return Contract(
            path=self.path,
            text=self.text,
            sha256=hashlib.sha256(self.text.encode()).hexdigest(),
            knobs=knobs,
            patches=patches,
            log_patterns=log_patterns,
            convergence=convergence,
            **sections,
        )

    def check_task(self, task: Section) -> None:
        if not task.command:
            self.fail("task", "command", "expected a non-empty argv list, got []")
        if task.evidence == "auto" and (
            task.command[0] != "python" or len(task.command) < 2 or task.command[1] == "-m"
        ):
            self.fail("task", "command", 'evidence = "auto" needs a command of the form ["python", "SCRIPT", ...]')
        check_launcher(task, self.fail)

    def check_scope(self, scope: Section) -> None:
        for key in ("editable", "protected"):
            for glob in scope.values[key]:
                problem = check_glob(glob)
                if problem:
                    self.fail("scope", key, f"expected a workspace-relative glob, got {glob!r}: {problem}")
        both = set(scope.editable) & set(scope.protected)
        if both:
            self.fail("scope", "protected", f"glob {sorted(both)[0]!r} is both editable and protected")
        # A file matched by both an editable and a protected glob is just as contradictory.
        workspace = self.path.parent
        files = workspace.rglob("*") if self.check_files else ()
        for path in sorted(p for p in files if p.is_file() and ".infrarsi" not in p.parts):
            rel = path.relative_to(workspace).as_posix()
            edit = next((g for g in scope.editable if matches(rel, g)), None)
            prot = next((g for g in scope.protected if matches(rel, g)), None)
            if edit and prot:
                self.fail(
                    "scope",
                    "protected",
                    f"{rel} is matched by editable {edit!r} and protected {prot!r}; a file can't be both",
                )
            if edit and rel == self.path.name:
                self.fail("scope", "editable", f"{edit!r} matches the contract itself, which is always protected")

    def knobs(self, raw: Any) -> dict[str, Knob]:
        if not isinstance(raw, dict):
            self.fail(None, "knobs", f"expected tables [knobs.NAME], got {_show(raw)}")
        knobs: dict[str, Knob] = {}
        seen_flags: dict[str, str] = {}
        for name, body in raw.items():
            table = f"knobs.{name}"
            if not _NAME_RE.match(name):
                self.fail(table, None, "expected a knob name of letters, digits, '_', '-', '.'")
            values = self.section(table, body, KNOB_FIELDS)
            if values["baseline"] not in values["choices"]:
                self.fail(
                    table,
                    "baseline",
                    f"expected one of the choices {list(values['choices'])}, got {values['baseline']!r}",
                )
            launch = parse_launch(table, values, self.fail)
            for target in sorted(launch.targets(values["choices"])):
                if target in seen_flags:
                    self.fail(
                        table,
                        launch.form,
                        f"{target} is already set by knob {seen_flags[target]!r}: two knobs "
                        "can't set the same argument or variable",
                    )
                seen_flags[target] = name
            knobs[name] = Knob(
                name=name,
                choices=values["choices"],
                baseline=values["baseline"],
                flag=values["flag"],
                env=values["env"],
                launch=launch,
            )
        return knobs

    def patches(self, raw: Any) -> tuple[PatchSpec, ...]:
        if not isinstance(raw, list):
            self.fail(None, "patches", f"expected an array of tables [[patches]], got {_show(raw)}")
        specs: list[PatchSpec] = []
        for index, body in enumerate(raw):
            values = self.section("patches", body, PATCH_FIELDS, index)
            if not _NAME_RE.match(values["name"]):
                self.fail(
                    "patches",
                    "name",
                    f"expected a name of letters, digits, '_', '-', '.', got {values['name']!r}",
                    index,
                )
            if any(s.name == values["name"] for s in specs):
                self.fail("patches", "name", f"duplicate patch name {values['name']!r}", index)
            problem = check_glob(values["file"])
            path = self.path.parent / values["file"]
            if problem or (self.check_files and not path.is_file()):
                self.fail(
                    "patches",
                    "file",
                    f"expected an existing diff file in the workspace, "
                    f"got {values['file']!r} ({problem or 'no such file'})",
                    index,
                )
            specs.append(PatchSpec(values["name"], values["file"], path))
        return tuple(specs)


def parse_contract(text: str, path: str | Path, check_files: bool = True) -> Contract:
    """Validate contract ``text`` as if read from ``path`` (its folder is the workspace).

    ``check_files=False`` skips what needs the workspace itself (patch files exist, no file
    both editable and protected): for judging stored evidence where the workspace is gone.
    """
    return _Parser(Path(path).resolve(), text, check_files).parse()


def load_contract(path: str | Path = DEFAULT_CONTRACT) -> Contract:
    """Read and validate the contract file at ``path``."""
    path = Path(path)
    if path.is_dir():
        path = path / DEFAULT_CONTRACT
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ContractError(
            str(path), None, "no such contract file (expected an infrarsi.toml; pass --contract PATH)"
        ) from None
    except UnicodeDecodeError as exc:
        raise ContractError(str(path), None, f"expected UTF-8 text: {exc}") from None
    except OSError as exc:
        raise ContractError(str(path), None, f"cannot read: {exc.strerror}") from None
    return parse_contract(text, path)
