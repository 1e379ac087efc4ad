"""What an expression stands for, as far as reading the source can tell.

``const_str`` folds the strings a job can build without running anything
(``"INFRA" + "RSI_STEPS"``, ``"_".join([...])``, ``"...".upper()``, ``s[::-1]``, a
name assigned one constant). ``object_paths`` names the objects an expression may
reach: ``torch.optim.AdamW`` for an alias of the class, ``torch.optim.AdamW().step``
for a method of an instance, ``<probe>.step().__class__`` for the class of the
probe's region object. ``attribute_writes`` lists every way a file writes an
attribute of some object (assignment, ``del``, ``setattr``, ``vars(x)[k] = ...``,
``x.__dict__.update(...)``), so the rules that judge monkeypatching agree on what a
write is.
"""

from __future__ import annotations

import libcst as cst

from ._source import SourceModel, dotted, string_value

__all__ = [
    "CLOCK_MODULES",
    "DEVICE_CLOCKS",
    "PROBE",
    "bound_from",
    "call_args",
    "const_int",
    "const_str",
    "is_clock",
    "is_probe",
    "is_reference",
    "last_name",
    "namespace_of",
    "object_paths",
    "root_name",
    "under",
]

PROBE = "<probe>"  # the root of a path through the probe object from infrarsi.probe.from_env()
_DEPTH = 6
_STR_METHODS = {
    "upper",
    "lower",
    "strip",
    "lstrip",
    "rstrip",
    "replace",
    "casefold",
    "title",
    "capitalize",
    "removeprefix",
    "removesuffix",
    "decode",
    "encode",
    "format",
    "swapcase",
}


def call_args(call: cst.Call) -> list[cst.CSTNode]:
    """The positional arguments of a call, in order."""
    return [a.value for a in call.args if a.keyword is None and not a.star]


def _assigned_values(source: SourceModel, name: str) -> list[cst.CSTNode]:
    """The values a plain name is assigned anywhere in the file (scope-insensitive: fails safe)."""
    index = source.memo.get("assigned")
    if index is None:
        index = {}
        for node in source.of_type(cst.Assign, cst.AnnAssign, cst.NamedExpr):
            if node.value is None:
                continue
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for t in targets:
                if isinstance(t, cst.Name):
                    index.setdefault(t.value, []).append(node.value)
        source.memo["assigned"] = index
    return index.get(name, [])


def last_name(expr: cst.CSTNode) -> str | None:
    """``c`` for ``a.b.c`` or ``c``: a cheap first test before resolving names."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        return expr.attr.value
    return None


def bound_from(source: SourceModel, *modules: str) -> set[str]:
    """The names this file binds by importing ``modules`` or anything in them (``import sys``, ``from gc import
    get_objects as g``, ``import os.path``), plus the modules' own top names."""
    key = ("bound",) + modules
    found = source.memo.get(key)
    if found is None:
        found = {m.split(".")[0] for m in modules}
        for _, real, bound in source.imports():
            if under(real, *modules):
                found.add(bound.split(".")[0])
        source.memo[key] = found
    return found


def root_name(expr: cst.CSTNode) -> str | None:
    while isinstance(expr, (cst.Attribute, cst.Call, cst.Subscript)):
        expr = expr.func if isinstance(expr, cst.Call) else expr.value
    return expr.value if isinstance(expr, cst.Name) else None


def const_int(source: SourceModel, node: cst.CSTNode, depth: int = 0) -> int | None:
    if isinstance(node, cst.Integer):
        try:
            return int(node.value, 0)
        except ValueError:
            return None
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        value = const_int(source, node.expression, depth + 1)
        return -value if value is not None else None
    if isinstance(node, cst.BinaryOperation) and depth < _DEPTH:
        left, right = const_int(source, node.left, depth + 1), const_int(source, node.right, depth + 1)
        if left is None or right is None:
            return None
        if isinstance(node.operator, cst.Add):
            return left + right
        if isinstance(node.operator, cst.Subtract):
            return left - right
        if isinstance(node.operator, cst.Multiply):
            return left * right
    return None


def const_str(source: SourceModel, node: cst.CSTNode, depth: int = 0) -> str | None:
    """The string ``node`` always evaluates to, when the source alone says so; else None."""
    if depth > _DEPTH:
        return None
    if isinstance(node, cst.SimpleString):
        return string_value(node)
    if isinstance(node, cst.ConcatenatedString):
        left, right = const_str(source, node.left, depth + 1), const_str(source, node.right, depth + 1)
        return left + right if left is not None and right is not None else None
    if isinstance(node, cst.FormattedString):
        out = []
        for part in node.parts:
            if isinstance(part, cst.FormattedStringText):
                out.append(part.value)
            elif (
                part.format_spec is None
                and part.conversion is None
                and (value := const_str(source, part.expression, depth + 1)) is not None
            ):
                out.append(value)
            else:
                return None
        return "".join(out)
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, cst.Add):
            left, right = const_str(source, node.left, depth + 1), const_str(source, node.right, depth + 1)
            return left + right if left is not None and right is not None else None
        if isinstance(node.operator, cst.Multiply):
            text, times = const_str(source, node.left, depth + 1), const_int(source, node.right)
            return text * times if text is not None and times is not None and 0 <= times < 64 else None
        return None
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        text = const_str(source, node.value, depth + 1)
        item = node.slice[0].slice
        if text is None:
            return None
        if isinstance(item, cst.Slice):
            bounds = [const_int(source, b) if b is not None else None for b in (item.lower, item.upper, item.step)]
            if any(b is None and given is not None for b, given in zip(bounds, (item.lower, item.upper, item.step))):
                return None
            return text[bounds[0] : bounds[1] : bounds[2]] if bounds[2] != 0 else None
        if isinstance(item, cst.Index) and (index := const_int(source, item.value)) is not None:
            return text[index] if -len(text) <= index < len(text) else None
        return None
    if isinstance(node, cst.Call):
        return _const_call(source, node, depth)
    if isinstance(node, cst.Name) and depth < _DEPTH:
        cache = source.memo.setdefault("const_names", {})
        if node.value not in cache:
            cache[node.value] = None  # a name defined through itself is not a constant
            values = _assigned_values(source, node.value)
            folded = {const_str(source, v, depth + 1) for v in values}
            cache[node.value] = folded.pop() if len(folded) == 1 and None not in folded else None
        return cache[node.value]
    return None


def _const_items(source: SourceModel, node: cst.CSTNode, depth: int) -> list[str] | None:
    """The strings of a literal list, tuple, generator of chr(...) or a string's characters."""
    if isinstance(node, (cst.List, cst.Tuple)):
        items = [const_str(source, e.value, depth + 1) for e in node.elements]
        return None if None in items else items  # type: ignore[return-value]
    if isinstance(node, cst.Call) and dotted(node.func) in ("reversed", "list", "tuple") and node.args:
        items = _const_items(source, node.args[0].value, depth + 1)
        return items[::-1] if items is not None and dotted(node.func) == "reversed" else items
    if (
        isinstance(node, cst.Call)
        and dotted(node.func) == "map"
        and len(node.args) == 2
        and dotted(node.args[0].value) == "chr"
        and isinstance(node.args[1].value, (cst.List, cst.Tuple))
    ):
        codes = [const_int(source, e.value) for e in node.args[1].value.elements]
        return None if None in codes or any(not 0 <= c < 0x110000 for c in codes) else [chr(c) for c in codes]
    text = const_str(source, node, depth + 1)
    return list(text) if text is not None else None


def _const_call(source: SourceModel, node: cst.Call, depth: int) -> str | None:
    func = node.func
    args = call_args(node)
    name = dotted(func)
    if name in ("str", "chr") and len(args) == 1:
        if name == "chr":
            code = const_int(source, args[0])
            return chr(code) if code is not None and 0 <= code < 0x110000 else None
        return const_str(source, args[0], depth + 1)
    if not isinstance(func, cst.Attribute):
        return None
    method = func.attr.value
    if method == "join" and len(args) == 1:
        sep = const_str(source, func.value, depth + 1)
        items = _const_items(source, args[0], depth)
        return sep.join(items) if sep is not None and items is not None else None
    if method == "fromhex" and dotted(func.value) in ("bytes", "bytearray") and len(args) == 1:
        text = const_str(source, args[0], depth + 1)
        try:
            return bytes.fromhex(text).decode("latin-1") if text is not None else None
        except ValueError:
            return None
    if method not in _STR_METHODS:
        return None
    base = const_str(source, func.value, depth + 1)
    if base is None:
        return None
    values = [const_str(source, a, depth + 1) for a in args]
    if None in values or any(a.keyword is not None for a in node.args):
        return None
    try:
        if method in ("decode", "encode"):
            return base
        if method == "format":
            return base.format(*values)
        return getattr(base, method)(*values)
    except (TypeError, ValueError, IndexError, KeyError):
        return None


# -- objects ---------------------------------------------------------------------------------
def _resolve_call(source: SourceModel, call: cst.Call, depth: int) -> set[str]:
    args = call_args(call)
    if source.resolves_to(call.func, "builtins.getattr") and len(args) >= 2:
        attr = const_str(source, args[1]) or "?"
        return {f"{p}.{attr}" for p in object_paths(source, args[0], depth + 1)}
    if source.resolves_to(call.func, "builtins.type") and len(args) == 1:
        return {f"{p}.__class__" for p in object_paths(source, args[0], depth + 1)}
    if source.resolves_to(call.func, "importlib.import_module", "builtins.__import__") and args:
        module = const_str(source, args[0])
        return {module} if module else {"?"}
    return {f"{p}()" for p in object_paths(source, call.func, depth + 1)}


def object_paths(source: SourceModel, expr: cst.CSTNode, depth: int = 0) -> set[str]:
    """Dotted paths ``expr`` may stand for; ``()`` marks a call's result, ``.__class__`` a type."""
    if depth > _DEPTH:
        return set()
    cache = source.memo.setdefault("paths", {})
    key = id(expr)
    if key not in cache:
        cache[key] = set()  # a cycle through assignments adds nothing
        cache[key] = _object_paths(source, expr, depth)
    return cache[key]


def _object_paths(source: SourceModel, expr: cst.CSTNode, depth: int) -> set[str]:
    if source.is_probe_factory(expr) or (isinstance(expr, (cst.Name, cst.Attribute)) and source.probe_object(expr)):
        return {PROBE}
    if isinstance(expr, cst.Name):
        found = set(source.qnames(expr))
        for value in _assigned_values(source, expr.value):
            found |= object_paths(source, value, depth + 1)
        return found
    if isinstance(expr, cst.Attribute):
        base = object_paths(source, expr.value, depth + 1)
        found = {f"{p}.{expr.attr.value}" for p in base}
        if not isinstance(expr.value, cst.Call):
            found |= set(source.qnames(expr))
        return found
    if isinstance(expr, cst.Call):
        return _resolve_call(source, expr, depth)
    if isinstance(expr, cst.Subscript):
        key = expr.slice[0].slice.value if len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index) else None
        text = const_str(source, key) if key is not None else None
        if dotted(expr.value) == "sys.modules" and key is not None:
            return {text} if text else {"?"}
        if key is not None and (owner := namespace_of(source, expr.value)) is not None:  # vars(torch)['bfloat16']
            return {f"{p}.{text or '?'}" for p in object_paths(source, owner, depth + 1)}
        return {f"{p}[]" for p in object_paths(source, expr.value, depth + 1)}
    return set()


def namespace_of(source: SourceModel, expr: cst.CSTNode) -> cst.CSTNode | None:
    """``x`` for ``vars(x)`` or ``x.__dict__``, else None."""
    if (
        isinstance(expr, cst.Call)
        and last_name(expr.func) == "vars"
        and source.resolves_to(expr.func, "builtins.vars")
        and call_args(expr)
    ):
        return call_args(expr)[0]
    if isinstance(expr, cst.Attribute) and expr.attr.value == "__dict__":
        return expr.value
    return None


# -- what a path is ----------------------------------------------------------------------------
CLOCK_MODULES = ("time", "timeit")
DEVICE_CLOCKS = (
    "torch.cuda.synchronize",
    "torch.cuda.Event",
    "torch.cuda.Stream.synchronize",
    "torch.cuda.current_stream",
    "torch.Event",
)


def under(path: str, *prefixes: str) -> bool:
    """``path`` is one of ``prefixes`` or reached from one (an attribute, a call, an item)."""
    return any(path == p or (path.startswith(p) and path[len(p)] in ".([") for p in prefixes)


def is_clock(path: str) -> bool:
    return under(path, *CLOCK_MODULES, *DEVICE_CLOCKS)


def is_probe(path: str) -> bool:
    return under(path, PROBE, "infrarsi.probe")


def is_reference(source: SourceModel, node: cst.CSTNode) -> bool:
    """A Name or Attribute that reads a binding: not ``x.<attr>``'s attr, a keyword, a parameter or an import."""
    parent = source.parent.get(node)
    if isinstance(parent, (cst.ImportAlias, cst.AsName, cst.Import, cst.ImportFrom)):
        return False
    if isinstance(parent, cst.Attribute):
        return parent.attr is not node
    if isinstance(parent, cst.Arg):
        return parent.keyword is not node
    if isinstance(parent, (cst.Param, cst.FunctionDef, cst.ClassDef)):
        return parent.name is not node
    return True
