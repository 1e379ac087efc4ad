"""One parsed source file with the libcst metadata every rule needs, resolved once.

Rules ask this model questions (what does this name resolve to, where is this node,
what encloses it) instead of each walking the tree with its own metadata.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from infrarsi.errors import SourceError

from ._names import NameResolver

__all__ = ["SourceModel", "dotted", "string_value"]

PROBE_MODULE = "infrarsi.probe"


def dotted(expr: cst.CSTNode) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        base = dotted(expr.value)
        return f"{base}.{expr.attr.value}" if base else None
    return None


def string_value(node: cst.CSTNode) -> str | None:
    """The text of a string literal (f-strings: their literal parts), else None."""
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:  # noqa: BLE001 - an odd literal is just not a string we can read
            return None
        return value if isinstance(value, str) else value.decode("latin-1")
    if isinstance(node, cst.ConcatenatedString):
        left, right = string_value(node.left), string_value(node.right)
        return (left or "") + (right or "") if left is not None or right is not None else None
    if isinstance(node, cst.FormattedString):
        return "".join(p.value for p in node.parts if isinstance(p, cst.FormattedStringText))
    return None


# Layout-only nodes no rule reads: leaving them out of the walk halves the nodes visited.
_LAYOUT = (
    cst.BaseParenthesizableWhitespace,
    cst.EmptyLine,
    cst.TrailingWhitespace,
    cst.Newline,
    cst.Comment,
    cst.Comma,
    cst.Dot,
    cst.Colon,
    cst.Semicolon,
    cst.AssignEqual,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
    cst.ImportStar,
    cst.Asynchronous,
    cst.BaseAugOp,
    cst.BaseBinaryOp,
    cst.BaseBooleanOp,
    cst.BaseCompOp,
    cst.BaseUnaryOp,
)
_FIELDS: dict[type, tuple[str, ...]] = {}


def _children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """A node's child nodes without the layout ones, in field order (decorators first).

    libcst's own ``node.children`` rebuilds the node to find them, several times slower.
    """
    names = _FIELDS.get(type(node))
    if names is None:
        names = tuple(f.name for f in dataclasses.fields(node))
        if "decorators" in names:
            names = ("decorators",) + tuple(n for n in names if n != "decorators")
        _FIELDS[type(node)] = names
    out = []
    for name in names:
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            if not isinstance(value, _LAYOUT):
                out.append(value)
        elif type(value) in (list, tuple):
            out.extend(v for v in value if isinstance(v, cst.CSTNode) and not isinstance(v, _LAYOUT))
    return out


class SourceModel:
    """A parsed module: nodes in source order, parents, positions, qualified names.

    The tree is walked once here for parents, order and a by-type index; qualified names
    come from the scope-aware resolver in ``_names.py``; libcst's ``PositionProvider`` is
    resolved only when a finding needs a position.
    """

    def __init__(self, text: str, path: str = "<string>") -> None:
        self.text, self.path = text, path
        try:
            module = cst.parse_module(text)
        except cst.ParserSyntaxError as exc:
            raise SourceError(
                f"{path}:{exc.editor_line}:{exc.editor_column}: not valid Python: {exc.message}"
            ) from None
        except (cst.CSTValidationError, RecursionError, ValueError) as exc:  # e.g. a name no identifier may have
            raise SourceError(f"{path}:1:1: not valid Python: {exc}") from None
        self.module = module
        self._wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        self.nodes: list[cst.CSTNode] = []
        self.parent: dict[cst.CSTNode, cst.CSTNode] = {}
        self.order: dict[cst.CSTNode, int] = {}
        self.kids: dict[cst.CSTNode, list[cst.CSTNode]] = {}
        self._by_type: dict[type, list[cst.CSTNode]] = {}
        stack: list[cst.CSTNode] = [module]
        while stack:
            node = stack.pop()
            self.order[node] = len(self.nodes)
            self.nodes.append(node)
            self._by_type.setdefault(type(node), []).append(node)
            children = _children(node)
            self.kids[node] = children
            for child in children:
                self.parent[child] = node
            stack.extend(reversed(children))
        self._names = NameResolver(self.nodes, self.parent)
        self._qualified: dict[cst.CSTNode, set[str]] = {}
        self._positions = None
        self._imports = None
        self.memo: dict = {}  # what helpers work out once per file (auditors/_values.py)
        self.probe_vars = self._find_probe_vars()

    # -- basic questions ------------------------------------------------------------------
    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node).strip()

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        """(line, column), both from 1, of where ``node`` starts."""
        if self._positions is None:
            self._positions = self._wrapper.resolve(PositionProvider)
        while node not in self._positions and node in self.parent:
            node = self.parent[node]
        pos = self._positions.get(node)
        return (pos.start.line, pos.start.column + 1) if pos else (1, 1)

    def qnames(self, node: cst.CSTNode) -> set[str]:
        """What a name, attribute or call's function resolves to through imports and aliases."""
        if isinstance(node, cst.Call):
            node = node.func
        cached = self._qualified.get(node)
        if cached is None:
            cached = {q for q in self._names.qnames(node)} if isinstance(node, (cst.Name, cst.Attribute)) else set()
            self._qualified[node] = cached
        return cached

    def resolves_to(self, node: cst.CSTNode, *names: str) -> bool:
        """True when ``node`` resolves to one of ``names`` (or something inside one of them)."""
        for q in self.qnames(node):
            for name in names:
                if q == name or q.startswith(name + "."):
                    return True
        return False

    def of_type(self, *types: type) -> list[cst.CSTNode]:
        """Nodes that are instances of ``types``, in source order."""
        found = [n for t, nodes in self._by_type.items() if issubclass(t, types) for n in nodes]
        if len(types) > 1 or len({type(n) for n in found}) > 1:
            found.sort(key=self.order.__getitem__)
        return found

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        while node in self.parent:
            node = self.parent[node]
            yield node

    def inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        return node is container or any(a is container for a in self.ancestors(node))

    def children(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        kids = self.kids.get(node)
        return kids if kids is not None else _children(node)

    def descendants(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        stack = [node]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(reversed(self.children(current)))

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The simple or compound statement that holds ``node``."""
        for current in (node, *self.ancestors(node)):
            if isinstance(current, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return current
        return node

    def functions(self) -> dict[str, cst.FunctionDef]:
        """Functions and methods by name (methods also as ``Class.name``), for following calls."""
        out: dict[str, cst.FunctionDef] = {}
        for node in self.of_type(cst.FunctionDef):
            out.setdefault(node.name.value, node)
            owner = next((a for a in self.ancestors(node) if isinstance(a, cst.ClassDef)), None)
            if owner is not None:
                out[f"{owner.name.value}.{node.name.value}"] = node
        return out

    def imports(self) -> list[tuple[cst.CSTNode, str, str]]:
        """``(statement, what is imported, the name it is bound to)`` per imported name.

        ``import time as t`` gives ``("time", "t")``; ``from a.b import c`` gives
        ``("a.b.c", "c")``; ``from a import *`` gives ``("a.*", "*")``.
        """
        if self._imports is None:
            found = []
            for node in self.of_type(cst.Import, cst.ImportFrom):
                module = dotted(node.module) if isinstance(node, cst.ImportFrom) and node.module else None
                if isinstance(node.names, cst.ImportStar):
                    found.append((node, f"{module}.*", "*"))
                    continue
                for alias in node.names:
                    name = dotted(alias.name) or ""
                    real = f"{module}.{name}" if module else name
                    found.append((node, real, dotted(alias.asname.name) if alias.asname else name))
            self._imports = found
        return self._imports

    # -- the probe ------------------------------------------------------------------------
    def is_probe_factory(self, call: cst.CSTNode) -> bool:
        """A call of ``infrarsi.probe.from_env()`` (however imported or aliased)."""
        return isinstance(call, cst.Call) and self.resolves_to(call.func, PROBE_MODULE + ".from_env")

    def _find_probe_vars(self) -> set[str]:
        found: set[str] = set()
        for node in self.of_type(cst.Assign, cst.AnnAssign):
            if node.value is None or not self.is_probe_factory(node.value):
                continue
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            found.update(name for name in (dotted(t) for t in targets) if name)
        return found

    def probe_object(self, expr: cst.CSTNode) -> bool:
        """True when ``expr`` is a probe from ``infrarsi.probe.from_env()``."""
        if self.is_probe_factory(expr):
            return True
        name = dotted(expr)
        return name is not None and name in self.probe_vars
