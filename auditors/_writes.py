"""Attribute writes, however spelled: ``obj.attr = v``, ``del obj.attr``, ``setattr(obj, name, v)``,
``vars(obj)[name] = v`` and ``obj.__dict__.update(...)``; and the attribute paths each changes."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ._source import SourceModel
from ._values import call_args, const_str, namespace_of, object_paths

__all__ = ["Write", "attribute_writes", "written_paths"]

_SETATTR = {
    "builtins.setattr",
    "builtins.delattr",
    "builtins.object.__setattr__",
    "builtins.object.__delattr__",
    "builtins.type.__setattr__",
    "builtins.type.__delattr__",
    "unittest.mock.patch.object",
}
_DICT_WRITERS = {"update", "setdefault", "__setitem__", "__delitem__", "pop", "popitem", "clear"}


@dataclass(frozen=True)
class Write:
    """One write to an attribute of an object: where, to what, which attribute (None: computed)."""

    node: cst.CSTNode
    obj: cst.CSTNode
    attr: str | None
    value: cst.CSTNode | None
    how: str  # "assigned", "deleted", "setattr", "namespace"


def _targets(expr: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(expr, (cst.Tuple, cst.List)):
        return [t for e in expr.elements for t in _targets(e.value)]
    if isinstance(expr, cst.StarredElement):
        return _targets(expr.value)
    return [expr]


def _subscript_key(source: SourceModel, node: cst.Subscript) -> str | None:
    if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        return const_str(source, node.slice[0].slice.value)
    return None


def attribute_writes(source: SourceModel) -> list[Write]:
    """Every attribute write in the file, however spelled (computed once per source)."""
    cached = source.memo.get("writes")
    if cached is not None:
        return cached
    out: list[Write] = []
    for node in source.of_type(cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Del):
        if isinstance(node, cst.Assign):
            targets = [t for a in node.targets for t in _targets(a.target)]
        else:
            targets = _targets(node.target)
        value = getattr(node, "value", None)
        how = "deleted" if isinstance(node, cst.Del) else "assigned"
        for target in targets:
            if isinstance(target, cst.Attribute):
                out.append(Write(node, target.value, target.attr.value, value, how))
            elif isinstance(target, cst.Subscript) and (owner := namespace_of(source, target.value)) is not None:
                out.append(Write(node, owner, _subscript_key(source, target), value, "namespace"))
    for call in source.of_type(cst.Call):
        args = call_args(call)
        if len(args) >= 2 and source.qnames(call.func) & _SETATTR:
            out.append(Write(call, args[0], const_str(source, args[1]), args[2] if len(args) > 2 else None, "setattr"))
        elif (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value in _DICT_WRITERS
            and (owner := namespace_of(source, call.func.value)) is not None
        ):
            key = const_str(source, args[0]) if args and call.func.attr.value != "update" else None
            out.append(Write(call, owner, key, args[-1] if args else None, "namespace"))
    source.memo["writes"] = out
    return out


def written_paths(source: SourceModel, write: Write) -> set[str]:
    """The attribute paths a write changes (``?`` for a computed attribute name)."""
    return {f"{p}.{write.attr or '?'}" for p in object_paths(source, write.obj)}
