"""Qualified names through imports and aliases, by scope, in one pass over the libcst tree.

libcst's ``QualifiedNameProvider`` answers the same question, but its scope analysis
visits every node of the tree in Python and costs about 0.7 s per 2,000-line file on
the 2-core CI machine, most of the audit's 1 s budget. This resolver keeps what the
rules need: the bindings of each scope (module, function, lambda, class,
comprehension), imports with their aliases, and shadowing by any other binding in a
nearer scope. ``tests/auditors/test_names.py`` checks that it agrees with libcst's
provider on every import-resolved name of the fixtures.
"""

from __future__ import annotations

import builtins

import libcst as cst

__all__ = ["NameResolver"]

_SCOPES = (
    cst.Module,
    cst.FunctionDef,
    cst.Lambda,
    cst.ClassDef,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
)
_BUILTIN_NAMES = frozenset(dir(builtins))
_LOCAL = None  # a binding that is not an import
_BINDERS = {
    cst.Import,
    cst.ImportFrom,
    cst.FunctionDef,
    cst.ClassDef,
    cst.Param,
    cst.AssignTarget,
    cst.AnnAssign,
    cst.AugAssign,
    cst.For,
    cst.CompFor,
    cst.WithItem,
    cst.NamedExpr,
    cst.ExceptHandler,
    cst.Global,
    cst.Nonlocal,
}


def _dotted(expr: cst.CSTNode) -> str | None:
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute):
        base = _dotted(expr.value)
        return f"{base}.{expr.attr.value}" if base else None
    return None


def _target_names(expr: cst.CSTNode) -> list[str]:
    if isinstance(expr, cst.Name):
        return [expr.value]
    if isinstance(expr, (cst.Tuple, cst.List)):
        return [n for e in expr.elements for n in _target_names(e.value)]
    if isinstance(expr, cst.StarredElement):
        return _target_names(expr.value)
    return []


class NameResolver:
    """Maps a Name or Attribute to the qualified names it may refer to."""

    def __init__(self, nodes: list[cst.CSTNode], parent: dict[cst.CSTNode, cst.CSTNode]) -> None:
        self.parent = parent
        self.bindings: dict[cst.CSTNode, dict[str, set[str | None]]] = {}
        self.globals: dict[cst.CSTNode, set[str]] = {}
        self._scope_of: dict[cst.CSTNode, cst.CSTNode] = {}
        self.module = nodes[0]
        for node in nodes:
            if type(node) in _BINDERS:
                self._bind(node)

    # -- scopes ------------------------------------------------------------------------------
    def scope(self, node: cst.CSTNode) -> cst.CSTNode:
        """The scope ``node`` is evaluated in (a def's own name belongs to the enclosing one)."""
        cached = self._scope_of.get(node)
        if cached is not None:
            return cached
        current, child = self.parent.get(node), node
        while current is not None:
            if isinstance(current, (cst.FunctionDef, cst.ClassDef)):
                if child is current.body or (isinstance(current, cst.FunctionDef) and child is current.params):
                    break
            elif isinstance(current, _SCOPES):
                break
            child, current = current, self.parent.get(current)
        found = current if current is not None else self.module
        self._scope_of[node] = found
        return found

    def _add(self, scope: cst.CSTNode, name: str, qualified: str | None) -> None:
        self.bindings.setdefault(scope, {}).setdefault(name, set()).add(qualified)

    def _bind(self, node: cst.CSTNode) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = _dotted(alias.name) or ""
                if alias.asname is not None:
                    self._add(self.scope(node), _dotted(alias.asname.name) or "", full)
                else:
                    head = full.split(".")[0]
                    self._add(self.scope(node), head, head)
        elif isinstance(node, cst.ImportFrom):
            if isinstance(node.names, cst.ImportStar):
                return
            module = ("." * len(node.relative)) + (_dotted(node.module) or "" if node.module else "")
            for alias in node.names:
                name = _dotted(alias.name) or ""
                bound = _dotted(alias.asname.name) if alias.asname is not None else name
                joiner = "" if module.endswith(".") or not module else "."
                self._add(self.scope(node), bound or "", f"{module}{joiner}{name}")
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            self._add(self.scope(node), node.name.value, _LOCAL)
        elif isinstance(node, cst.Param):
            self._add(self.scope(node), node.name.value, _LOCAL)
        elif isinstance(node, cst.AssignTarget):
            for name in _target_names(node.target):
                self._add(self.scope(node), name, _LOCAL)
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
            for name in _target_names(node.target):
                self._add(self.scope(node), name, _LOCAL)
        elif isinstance(node, (cst.For, cst.CompFor)):
            # A comprehension's targets belong to the comprehension (the CompFor's parent).
            scope = self.scope(node.target) if isinstance(node, cst.CompFor) else self.scope(node)
            for name in _target_names(node.target):
                self._add(scope, name, _LOCAL)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            for name in _target_names(node.asname.name):
                self._add(self.scope(node), name, _LOCAL)
        elif isinstance(node, cst.NamedExpr):
            for name in _target_names(node.target):
                self._add(self.scope(node), name, _LOCAL)
        elif isinstance(node, cst.ExceptHandler) and node.name is not None:
            for name in _target_names(node.name.name):
                self._add(self.scope(node), name, _LOCAL)
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            self.globals.setdefault(self.scope(node), set()).update(n.name.value for n in node.names)

    # -- resolution --------------------------------------------------------------------------
    def _lookup(self, name: str, scope: cst.CSTNode) -> set[str]:
        first = True
        while True:
            if scope in self.globals and name in self.globals[scope]:
                scope = self.module
            skip_class = isinstance(scope, cst.ClassDef) and not first  # class bodies don't enclose methods
            found = None if skip_class else self.bindings.get(scope, {}).get(name)
            if found is not None:
                at_module = scope is self.module
                return {q for q in found if q is not None} | ({name} if at_module and _LOCAL in found else set())
            if scope is self.module:
                return {f"builtins.{name}"} if name in _BUILTIN_NAMES else set()
            scope, first = self.scope(scope), False

    def qnames(self, node: cst.CSTNode) -> set[str]:
        if isinstance(node, cst.Name):
            return self._lookup(node.value, self.scope(node))
        if isinstance(node, cst.Attribute):
            base = node.value.func if isinstance(node.value, cst.Call) else node.value  # f().x is named f.x
            return {f"{q}.{node.attr.value}" for q in self.qnames(base)}
        return set()
