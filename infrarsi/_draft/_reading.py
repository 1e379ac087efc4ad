"""What a training script reads, found by parsing it with libcst (it is never run).

The argument style (argparse, Hugging Face's ``HfArgumentParser``/``TrainingArguments``,
module globals overridden by ``--key=value``, Hydra), each setting it reads with its default,
type and choices, the environment variables it reads, and the local modules it imports.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

__all__ = ["Setting", "ScriptFacts", "read_script", "read_hydra_config"]


@dataclass
class Setting:
    """One setting the script reads: how it is passed, its default and what values it takes.

    ``form``: ``flag`` (``--name VALUE``), ``equals`` (``--name=VALUE``), ``switch``
    (presence-only, ``negation`` its opposite where there is one), ``override`` (Hydra's
    ``name=VALUE``), ``env`` (an environment variable).
    """

    name: str
    option: str  # what goes on the command line (or the variable's name)
    form: str
    default: str | None = None
    kind: str = "str"  # bool, int, float, str
    choices: tuple[str, ...] = ()
    negation: str | None = None
    line: int | None = None
    origin: str = ""  # where it was read: "argparse", "TrainingArguments", "globals", "hydra", "environment"
    aliases: tuple[str, ...] = ()  # other spellings of the option (argparse's short forms)


@dataclass
class ScriptFacts:
    script: Path
    style: str  # argparse, hf, globals, hydra, plain
    settings: dict[str, Setting] = field(default_factory=dict)
    local_imports: list[str] = field(default_factory=list)  # module names resolved in the script's folder
    why: list[str] = field(default_factory=list)
    hydra_config: tuple[str, str] | None = None  # (config_path, config_name)


def _literal(node: cst.BaseExpression | None) -> object:
    """The Python value of a literal expression, else None (never evaluated otherwise)."""
    if node is None:
        return None
    try:
        return ast.literal_eval(cst.Module([]).code_for_node(node))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _text(value: object) -> str | None:
    if value is None:
        return None
    try:
        return str(value)
    except ValueError:  # an integer too long to print
        return None


def _kind(value: object, type_name: str | None = None) -> str:
    if type_name in ("int", "float", "str", "bool"):
        return type_name
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "str"


def _name(node: cst.BaseExpression) -> str:
    """``a.b.c`` of a Name/Attribute chain, else ''."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = _name(node.value)
        return f"{inner}.{node.attr.value}" if inner else ""
    return ""


def _kwargs(call: cst.Call) -> dict[str, cst.BaseExpression]:
    return {a.keyword.value: a.value for a in call.args if a.keyword is not None}


class _Reader(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.arguments: list[Setting] = []
        self.env: list[Setting] = []
        self.module_globals: dict[str, tuple[object, int]] = {}
        self.marks: dict[str, int] = {}  # hf, hydra, globals_write, exec, argparse: first line seen
        self.imports: list[str] = []
        self.dataclass_fields: dict[str, tuple[object, str | None, int]] = {}
        self.hydra: tuple[str, str] | None = None
        self._depth = 0  # inside a function or class body

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _mark(self, what: str, node: cst.CSTNode) -> None:
        self.marks.setdefault(what, self._line(node))

    # -- scopes: module-level globals are only the top level's
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._depth += 1
        for decorator in node.decorators:
            call = decorator.decorator
            if isinstance(call, cst.Call) and _name(call.func).endswith("hydra.main"):
                kw = _kwargs(call)
                self.hydra = (
                    _text(_literal(kw.get("config_path"))) or ".",
                    _text(_literal(kw.get("config_name"))) or "",
                )
                self._mark("hydra", node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._depth += 1
        if any(
            _name(d.decorator).endswith("dataclass")
            or _name(getattr(d.decorator, "func", d.decorator)).endswith("dataclass")
            for d in node.decorators
        ):
            for statement in node.body.body:
                for small in getattr(statement, "body", ()):
                    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                        value = small.value
                        if isinstance(value, cst.Call) and _name(value.func).endswith("field"):
                            value = _kwargs(value).get("default")
                        annotation = _name(small.annotation.annotation) or None
                        self.dataclass_fields[small.target.value] = (_literal(value), annotation, self._line(small))

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._depth -= 1

    def visit_Assign(self, node: cst.Assign) -> None:
        if self._depth == 0:
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    value = _literal(node.value)
                    if isinstance(value, (bool, int, float, str)):
                        self.module_globals.setdefault(target.target.value, (value, self._line(node)))

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self.imports.append(_name(alias.name))
            if _name(alias.name) == "hydra":
                self._mark("hydra", node)
            if _name(alias.name).startswith("transformers"):
                self._mark("transformers", node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.module is not None and not node.relative:
            module = _name(node.module)
            self.imports.append(module)
            if module.startswith("transformers") and not isinstance(node.names, cst.ImportStar):
                if "HfArgumentParser" in {_name(a.name) for a in node.names}:
                    self._mark("hf_import", node)
        elif node.module is not None:
            self.imports.append(_name(node.module))

    def visit_Call(self, node: cst.Call) -> None:
        func = _name(node.func)
        if func.endswith("ArgumentParser") and not func.endswith("HfArgumentParser"):
            self._mark("argparse", node)
        if func.endswith("HfArgumentParser"):
            self._mark("hf", node)
        if func in ("exec", "execfile"):
            self._mark("exec", node)
        if func == "globals":
            self._mark("globals", node)
        if func.endswith("add_argument"):
            self._argument(node)
        if func in ("os.environ.get", "os.getenv", "environ.get", "getenv") and node.args:
            name = _literal(node.args[0].value)
            if isinstance(name, str):
                default = _literal(node.args[1].value) if len(node.args) > 1 else None
                self.env.append(
                    Setting(
                        name, name, "env", _text(default), _kind(default), line=self._line(node), origin="environment"
                    )
                )

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if _name(node.value) in ("os.environ", "environ") and len(node.slice) == 1:
            element = node.slice[0].slice
            name = _literal(element.value) if isinstance(element, cst.Index) else None
            if isinstance(name, str):
                self.env.append(Setting(name, name, "env", line=self._line(node), origin="environment"))

    def _argument(self, call: cst.Call) -> None:
        options = [_literal(a.value) for a in call.args if a.keyword is None]
        options = [o for o in options if isinstance(o, str) and o.startswith("-")]
        if not options:
            return
        longs = [o for o in options if o.startswith("--")] or options
        aliases = tuple(o for o in options if o != longs[0])
        kw = _kwargs(call)
        dest = _literal(kw.get("dest")) or longs[0].lstrip("-").replace("-", "_")
        default = _literal(kw.get("default"))
        action = _literal(kw.get("action")) if "action" in kw else None
        type_name = _name(kw["type"]) if "type" in kw else None
        choices = _literal(kw.get("choices"))
        line = self._line(call)
        if action in ("store_true", "store_false") or _name(kw.get("action", cst.Name("x"))).endswith(
            "BooleanOptionalAction"
        ):
            on = action != "store_false"
            negation = f"--no-{longs[0][2:]}" if action not in ("store_true", "store_false") else None
            current = bool(default) if default is not None else not on
            self.arguments.append(
                Setting(
                    str(dest),
                    longs[0],
                    "switch",
                    str(current == on),
                    "bool",
                    ("True", "False"),
                    negation,
                    line,
                    "argparse",
                    aliases,
                )
            )
            return
        if "action" in kw:  # store_const, count, append: no value to choose
            return
        self.arguments.append(
            Setting(
                str(dest),
                longs[0],
                "flag",
                _text(default),
                _kind(default, type_name),
                tuple(str(c) for c in choices) if isinstance(choices, (list, tuple)) else (),
                line=line,
                origin="argparse",
                aliases=aliases,
            )
        )


def _local_modules(script: Path, imports: list[str]) -> list[str]:
    """Imported modules that are files (or packages) beside the script, as relative paths."""
    found = []
    for module in imports:
        parts = module.split(".")
        for candidate in (Path(*parts).with_suffix(".py"), Path(*parts) / "__init__.py"):
            if (script.parent / candidate).is_file():
                found.append(candidate.as_posix())
                break
    return sorted(set(found))


def read_script(script: Path) -> ScriptFacts:
    """Parse ``script`` (libcst) and say how it reads its settings.

    Raises ``SyntaxError`` (``ast`` first: its parser has limits libcst's native one lacks),
    ``ValueError``/``RecursionError``/``MemoryError`` for source neither can take, and
    ``cst.ParserSyntaxError``.
    """
    source = script.read_bytes()
    ast.parse(source)  # honours a coding declaration; deep nesting is a SyntaxError here, not a crash
    module = cst.parse_module(source)
    reader = _Reader()
    MetadataWrapper(module).visit(reader)
    marks = reader.marks
    facts = ScriptFacts(script, "plain", local_imports=_local_modules(script, reader.imports))
    if "hf" in marks:
        facts.style = "hf"
        facts.why.append(f"Hugging Face arguments (HfArgumentParser at line {marks['hf']})")
        for name, (value, annotation, line) in reader.dataclass_fields.items():
            facts.settings[name] = Setting(
                name, f"--{name}", "flag", _text(value), _kind(value, annotation), line=line, origin="dataclass"
            )
    elif "hydra" in marks and reader.hydra:
        facts.style, facts.hydra_config = "hydra", reader.hydra
        facts.why.append(f"a Hydra app (@hydra.main at line {marks['hydra']}): settings are key=value overrides")
        facts.settings.update(read_hydra_config(script, reader.hydra))
    elif "argparse" in marks and reader.arguments:
        facts.style = "argparse"
        facts.why.append(f"argparse (ArgumentParser at line {marks['argparse']}, {len(reader.arguments)} arguments)")
    elif ("exec" in marks or "globals" in marks) and reader.module_globals:
        facts.style = "globals"
        how = f"exec at line {marks['exec']}" if "exec" in marks else f"globals() at line {marks['globals']}"
        facts.why.append(f"module globals overridden by --key=value ({how}); config files given are exec'd")
        for name, (value, line) in reader.module_globals.items():
            if not name.startswith("_") and name.upper() != name:
                facts.settings[name] = Setting(
                    name, f"--{name}", "equals", _text(value), _kind(value), line=line, origin="globals"
                )
    else:
        facts.why.append("no argument parser recognised: only environment variables can be knobs")
    if facts.style == "argparse":
        for setting in reader.arguments:
            facts.settings.setdefault(setting.name, setting)
    for setting in reader.env:
        facts.settings.setdefault(f"env:{setting.name}", setting)
    return facts


def read_hydra_config(script: Path, config: tuple[str, str]) -> dict[str, Setting]:
    """The scalar keys of a Hydra app's primary config (a small subset of YAML: nested mappings of
    scalars), as dotted override settings. Lists, interpolations and the defaults list are skipped."""
    folder, name = config
    path = (script.parent / folder / name).with_suffix(".yaml")
    if not path.is_file():
        return {}
    settings: dict[str, Setting] = {}
    stack: list[tuple[int, str]] = []
    for number, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        text = raw.split(" #", 1)[0].rstrip()
        if not text.strip() or text.lstrip().startswith(("#", "-")) or ":" not in text:
            continue
        indent = len(text) - len(text.lstrip())
        key, _, value = text.strip().partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key.strip()])
        value = value.strip()
        if not value:
            stack.append((indent, key.strip()))
            continue
        if value.startswith(("[", "{", "${")) or dotted == "defaults":
            continue
        parsed: object = {"true": True, "false": False, "null": None}.get(value.lower(), value.strip("'\""))
        if isinstance(parsed, str):
            for cast in (int, float):
                try:
                    parsed = cast(parsed)
                    break
                except ValueError:
                    continue
        settings[dotted] = Setting(
            dotted, dotted, "override", _text(parsed), _kind(parsed), line=number, origin=f"hydra ({path.name})"
        )
    return settings
