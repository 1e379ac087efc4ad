"""The libcst helpers the codemods are built from: reading literals, names and simple expressions,
finding nodes, counting a function's names and bindings, recognising a causal mask built as ``tril`` or
``triu`` of ``torch.ones``, and applying edits found on the original tree to it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import libcst as cst
from libcst.metadata import ParentNodeProvider, PositionProvider, QualifiedNameProvider

__all__ = [
    "Notes",
    "source_of",
    "same_code",
    "is_number",
    "is_name",
    "is_simple",
    "positional_args",
    "find_all",
    "is_use",
    "name_counts",
    "Bindings",
    "bindings_of",
    "simple_assign",
    "binds_torch",
    "Edits",
    "Qualified",
    "causal_triangle",
]

# ---------------------------------------------------------------- matching helpers


def source_of(node: cst.CSTNode) -> str:
    """The node's source text, as libcst would print it."""
    return cst.Module([]).code_for_node(node)


def same_code(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """The two nodes read the same, whitespace aside."""
    return "".join(source_of(a).split()) == "".join(source_of(b).split())


def is_number(node: cst.CSTNode, value: float) -> bool:
    """``node`` is the literal ``value``; a negative one is a unary minus on a literal."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return value < 0 and is_number(node.expression, -value)
    return isinstance(node, (cst.Integer, cst.Float)) and node.evaluated_value == value


def is_name(node: cst.CSTNode, value: str) -> bool:
    """``node`` is the bare name ``value``."""
    return isinstance(node, cst.Name) and node.value == value


def is_simple(node: cst.CSTNode) -> bool:
    """A name, attribute chain, integer or constant subscript: moving or repeating it is harmless."""
    if isinstance(node, (cst.Name, cst.Integer)):
        return True
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return isinstance(node.expression, cst.Integer)
    if isinstance(node, cst.Attribute):
        return is_simple(node.value)
    if isinstance(node, cst.Subscript):
        return is_simple(node.value) and all(
            isinstance(e.slice, cst.Index) and is_simple(e.slice.value) for e in node.slice
        )
    return False


def positional_args(call: cst.Call) -> list[cst.BaseExpression] | None:
    """The call's arguments when all are plain positional ones, else None."""
    if any(a.keyword is not None or a.star for a in call.args):
        return None
    return [a.value for a in call.args]


class _Find(cst.CSTVisitor):
    """Collects every node below the root that ``pred`` accepts, in visiting order."""

    def __init__(self, pred: Callable[[cst.CSTNode], bool]) -> None:
        self.pred, self.found = pred, []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.pred(node):
            self.found.append(node)
        return True


def find_all(root: cst.CSTNode, pred: Callable[[cst.CSTNode], bool]) -> list:
    """The nodes of ``root`` (itself included) that ``pred`` accepts."""
    finder = _Find(pred)
    root.visit(finder)
    return finder.found


def is_use(node: cst.CSTNode, parent: cst.CSTNode | None) -> bool:
    """A name node that is a name, not an attribute's or a keyword's label."""
    if isinstance(parent, cst.Attribute) and parent.attr is node:
        return False
    return not (isinstance(parent, cst.Arg) and parent.keyword is node)


class _NameCounts(cst.CSTVisitor):
    """Every appearance of each name (bindings included), nested scopes included: conservative."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def visit_Name(self, node: cst.Name) -> None:
        self.counts[node.value] += 1

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False


def name_counts(*nodes: cst.CSTNode) -> Counter[str]:
    """How often each name appears across ``nodes`` (see :class:`_NameCounts`)."""
    visitor = _NameCounts()
    for node in nodes:
        node.visit(visitor)
    return visitor.counts


class Bindings(cst.CSTVisitor):
    """Each name a function binds, how often, and its line where it is one plain ``name = value``."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.plain: dict[str, cst.SimpleStatementLine] = {}

    def _bind(self, target: cst.CSTNode) -> None:
        if isinstance(target, cst.Name):
            self.count[target.value] += 1
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        stmt = node.body[0]
        if (
            len(node.body) == 1
            and isinstance(stmt, cst.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0].target, cst.Name)
        ):
            self.plain[stmt.targets[0].target.value] = node

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name)

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self._bind(item.name)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for item in node.names:
            self._bind(item.name)

    def single(self, name: str) -> cst.SimpleStatementLine | None:
        """The one ``name = value`` line, if the function binds ``name`` nowhere else."""
        return self.plain.get(name) if self.count[name] == 1 else None


def bindings_of(func: cst.FunctionDef) -> Bindings:
    """The names ``func`` binds (see :class:`Bindings`)."""
    visitor = Bindings()
    func.visit(visitor)
    return visitor


def simple_assign(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """``(name, value)`` for a line that is exactly ``name = value``."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
        assign = stmt.body[0]
        if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
            return assign.targets[0].target.value, assign.value
    return None


def binds_torch(module: cst.Module) -> bool:
    """Whether a top-level ``import torch`` (or ``import torch.x``) binds the name ``torch``."""
    return any(
        isinstance(s, cst.Import)
        and any(a.asname is None and source_of(a.name).split(".")[0] == "torch" for a in s.names)
        for line in module.body
        if isinstance(line, cst.SimpleStatementLine)
        for s in line.body
    )


class Edits(cst.CSTTransformer):
    """Applies edits found on the original tree: node -> replacement, REMOVE, or f(updated node)."""

    def __init__(self, edits: dict) -> None:
        self.edits = edits

    def on_leave(self, original_node, updated_node):
        edit = self.edits.get(original_node, updated_node)
        return edit(updated_node) if callable(edit) else edit


# Where a codemod saw its idiom and did not rewrite it: (line, why), for the search to explain itself.
Notes = list[tuple[int, str]]


class Qualified(cst.CSTVisitor):
    """A visitor that can ask for a node's qualified names (``torch.ones`` however it was imported)
    and the line a node starts on."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider, ParentNodeProvider, PositionProvider)

    def qn(self, node: cst.CSTNode) -> set[str]:
        """The qualified names ``node`` may refer to; empty where it names nothing imported."""
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

    def line(self, node: cst.CSTNode) -> int:
        position = self.get_metadata(PositionProvider, node, None)
        return position.start.line if position is not None else 0


# ---------------------------------------------------------------- causal masks


def _ones(node: cst.CSTNode, qn) -> cst.Call | None:
    """``torch.ones(a, b, ...)`` with two positional sizes."""
    if isinstance(node, cst.Call) and "torch.ones" in qn(node.func) and not any(a.star for a in node.args):
        if sum(a.keyword is None for a in node.args) == 2 and all(a.keyword is not None for a in node.args[2:]):
            return node
    return None


def causal_triangle(node: cst.CSTNode, qn) -> tuple[str, cst.Call] | None:
    """``("tril", ones)`` for ``tril(ones(..))``, ``("triu", ones)`` for ``triu(ones(..), diagonal=1)``."""
    if not isinstance(node, cst.Call) or any(a.star for a in node.args):
        return None
    func = node.func
    if isinstance(func, cst.Attribute) and func.attr.value in ("tril", "triu") and _ones(func.value, qn):
        kind, base, extra = func.attr.value, func.value, list(node.args)
    else:
        names = qn(func)
        kind = "tril" if "torch.tril" in names else "triu" if "torch.triu" in names else None
        if kind is None or not node.args or node.args[0].keyword is not None:
            return None
        base, extra = node.args[0].value, list(node.args[1:])
    ones = _ones(base, qn)
    if (
        ones is None
        or len(extra) > 1
        or (extra and extra[0].keyword is not None and extra[0].keyword.value != "diagonal")
    ):
        return None
    if not is_number(extra[0].value if extra else cst.Integer("0"), 0 if kind == "tril" else 1):
        return None
    return kind, ones
