"""The cached-causal-mask codemod: a causal ``torch.tril(torch.ones(a, b, ...))`` built inside a
function (not ``__init__``) from simple arguments is instead fetched from a ``functools.lru_cache`` helper
that builds it once per size, dtype and device. The helper goes above the first top-level statement that
built the mask, with ``import functools`` among the imports where the module lacks it. Since the cached
tensor is shared, it applies only where the mask is only read: no in-place op, nothing that keeps it.
"""

from __future__ import annotations

import sys

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from ._cst import (
    Edits,
    Notes,
    Qualified,
    bindings_of,
    binds_torch,
    causal_triangle,
    find_all,
    is_name,
    is_simple,
    is_use,
    name_counts,
    source_of,
)

__all__ = ["cached_causal_mask"]


# Calls that could keep the shared mask or change it: then it is not safe to share.
_KEEPERS = {
    "register_buffer",
    "Parameter",
    "Buffer",
    "setattr",
    "append",
    "extend",
    "insert",
    "add",
    "update",
    "setdefault",
}

# Methods that return a new tensor made from the mask (never the mask itself changed).
_CONVERSIONS = {"bool", "float", "half", "to", "type", "logical_not"}

_MASK_HELPER = '''@functools.lru_cache(maxsize=32)
def {name}(rows, cols, dtype, device):
    """The causal mask, built once per size, dtype and device and shared: never modify it in place."""
    return torch.tril(torch.ones(rows, cols, dtype=dtype, device=device))
'''


class _FindMasks(Qualified):
    """``torch.tril(torch.ones(a, b, dtype=.., device=..))`` built in a function (not ``__init__``),
    with simple arguments, whose result is only read there."""

    def __init__(self) -> None:
        super().__init__()
        self.functions: list[cst.FunctionDef] = []
        self.found: list[tuple[cst.Call, list, dict]] = []
        self.notes: Notes = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.functions.pop()

    def visit_Call(self, node: cst.Call) -> None:
        found = causal_triangle(node, self.qn)
        if found is None or found[0] != "tril":
            return
        why = None
        sizes = [a.value for a in found[1].args if a.keyword is None]
        extra = {a.keyword.value: a.value for a in found[1].args if a.keyword is not None}
        if not self.functions:
            why = "built once at module level already"
        elif self.functions[-1].name.value == "__init__":
            why = "built once in __init__ already"
        elif not all(map(is_simple, sizes)):
            why = "its sizes are expressions, not names or numbers"
        elif not set(extra) <= {"dtype", "device"} or not all(
            is_simple(v) or isinstance(v, cst.SimpleString) for v in extra.values()
        ):
            why = "torch.ones gets keywords other than a simple dtype and device"
        elif not self._only_read(node, self.functions[-1]):
            why = "the mask is changed in place or kept beyond the call, so one shared copy is not safe"
        if why is None:
            self.found.append((node, sizes, extra))
        else:
            self.notes.append((self.line(node), f"a causal mask ({source_of(node)[:60]}): {why}"))

    def _parent(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.get_metadata(ParentNodeProvider, node)

    def _only_read(self, call: cst.Call, func: cst.FunctionDef) -> bool:
        parent = self._parent(call)
        # mask.bool() / .to(...) / .float(): a new tensor, made from the shared one by reading it.
        while (
            isinstance(parent, cst.Attribute)
            and parent.attr.value in _CONVERSIONS
            and isinstance(self._parent(parent), cst.Call)
            and self._parent(parent).func is parent
        ):
            call = self._parent(parent)
            parent = self._parent(call)
        if isinstance(parent, (cst.UnaryOperation, cst.Comparison, cst.ComparisonTarget)):
            return True
        if not (
            isinstance(parent, cst.Assign)
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)
        ):
            return False
        name = parent.targets[0].target.value
        if bindings_of(func).single(name) is None:
            return False
        uses = [n for n in find_all(func, lambda n: is_name(n, name)) if is_use(n, self._parent(n))]
        return all(self._read(n) for n in uses)

    def _read(self, node: cst.Name) -> bool:
        """Whether this use of the mask only reads it: no in-place op, no escape from the function."""
        parent = self._parent(node)
        if isinstance(
            parent,
            (
                cst.AssignTarget,
                cst.UnaryOperation,
                cst.BinaryOperation,
                cst.Comparison,
                cst.ComparisonTarget,
                cst.Index,
            ),
        ):
            return True
        if isinstance(parent, cst.Attribute):
            return not parent.attr.value.endswith("_") and parent.attr.value != "data"
        if isinstance(parent, cst.Subscript):
            return not isinstance(self._parent(parent), (cst.AssignTarget, cst.AugAssign))
        if (
            isinstance(parent, cst.Arg)
            and parent.star == ""
            and (parent.keyword is None or parent.keyword.value != "out")
        ):
            func = self._parent(parent).func
            label = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", "")
            return label not in _KEEPERS
        return False


def _import_at(body: list, before: int) -> int:
    """Where ``import functools`` goes among the top-level imports above ``before``, isort's way."""
    imports = [
        (i, line.body[0])
        for i, line in enumerate(body[:before])
        if isinstance(line, cst.SimpleStatementLine)
        and isinstance(line.body[0], (cst.Import, cst.ImportFrom))
        and not (
            isinstance(line.body[0], cst.ImportFrom)
            and line.body[0].module is not None
            and source_of(line.body[0].module) == "__future__"
        )
    ]

    def root(stmt) -> str:
        name = stmt.names[0].name if isinstance(stmt, cst.Import) else stmt.module
        return source_of(name).split(".")[0] if name is not None else ""

    std = [(i, s) for i, s in imports if root(s) in sys.stdlib_module_names]
    for i, stmt in std:
        if isinstance(stmt, cst.ImportFrom) or source_of(stmt.names[0].name) > "functools":
            return i
    if std:
        return std[-1][0] + 1
    return imports[0][0] if imports else before


def _insert(body: list, at: int, line: cst.BaseStatement, blank_after: int) -> None:
    """Insert ``line`` before ``body[at]``, taking over the blank lines above it."""
    if at < len(body):
        ahead = body[at].leading_lines
        blank = 0
        while blank < len(ahead) and ahead[blank].comment is None:
            blank += 1
        line = line.with_changes(leading_lines=ahead[:blank])
        body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine()] * blank_after + list(ahead[blank:]))
    body.insert(at, line)


def cached_causal_mask(module: cst.Module, notes: Notes | None = None) -> cst.Module:
    """``module`` with each shareable causal mask fetched from one cached helper; the same object where
    there is none, or where the module does not import ``torch``. ``notes`` gets the masks it saw and
    left, with the reason."""
    if not binds_torch(module):
        return module
    wrapper = MetadataWrapper(module)
    finder = _FindMasks()
    wrapper.visit(finder)
    if notes is not None:
        notes.extend(finder.notes)
    if not finder.found:
        return module
    taken = name_counts(wrapper.module)
    helper = next(
        n for n in ("_causal_mask", "_causal_mask_cached", *(f"_causal_mask_{i}" for i in range(2, 99))) if not taken[n]
    )
    edits = {}
    for call, (rows, cols), extra in finder.found:
        args = [
            source_of(rows),
            source_of(cols),
            *(source_of(extra[k]) if k in extra else "None" for k in ("dtype", "device")),
        ]
        edits[call] = cst.parse_expression(f"{helper}({', '.join(args)})").with_changes(lpar=call.lpar, rpar=call.rpar)
    first = finder.found[0][0]
    while wrapper.resolve(ParentNodeProvider)[first] is not wrapper.module:
        first = wrapper.resolve(ParentNodeProvider)[first]
    at = list(wrapper.module.body).index(first)
    new = wrapper.module.visit(Edits(edits))
    body = list(new.body)
    config = new.config_for_parsing
    _insert(body, at, cst.parse_statement(_MASK_HELPER.format(name=helper), config), blank_after=2)
    binds_functools = any(
        isinstance(s, cst.Import) and any(source_of(a.name) == "functools" and a.asname is None for a in s.names)
        for line in body
        if isinstance(line, cst.SimpleStatementLine)
        for s in line.body
    )
    if not binds_functools:
        _insert(body, _import_at(body, at), cst.parse_statement("import functools\n", config), blank_after=0)
    return new.with_changes(body=body)
