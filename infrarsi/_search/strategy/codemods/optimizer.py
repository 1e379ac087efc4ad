"""The foreach-optimizer codemod: ``torch.optim`` optimizers built without a chosen implementation get
``foreach=True``, one multi-tensor kernel per update step instead of a Python loop over parameters. It
leaves alone a call that already says ``foreach``, ``fused`` or ``differentiable``, or passes ``**kwargs``.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from ._cst import Notes

__all__ = ["foreach_optimizer"]


_OPTIMIZERS = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam")
_OPTIMIZER_NAMES = {f"torch.optim.{n}" for n in _OPTIMIZERS} | {f"torch.optim.{n.lower()}.{n}" for n in _OPTIMIZERS}
# Already chosen an implementation, or asked for one foreach cannot give (autograd through the step).
_IMPLEMENTATION_KEYWORDS = {"foreach", "fused", "differentiable"}


def _append_arg(args: list[cst.Arg], new: cst.Arg) -> list[cst.Arg]:
    """``args`` plus ``new`` at the end, laid out like the last separator (and trailing comma) there."""
    last = args[-1]
    sep = args[-2].comma if len(args) > 1 else None
    if not isinstance(sep, cst.Comma):
        sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if isinstance(last.comma, cst.Comma):
        return [*args[:-1], last.with_changes(comma=sep), new.with_changes(comma=last.comma)]
    return [*args[:-1], last.with_changes(comma=sep), new]


class _AddForeach(cst.CSTTransformer):
    """Appends ``foreach=True`` to each ``torch.optim`` constructor that has not chosen an implementation."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider)

    def __init__(self) -> None:
        super().__init__()
        self.notes: Notes = []

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        names = {q.name for q in self.get_metadata(QualifiedNameProvider, original_node.func, set())}
        args = list(updated_node.args)
        if not names & _OPTIMIZER_NAMES:
            return updated_node
        chosen = [
            a.keyword.value for a in args if a.keyword is not None and a.keyword.value in _IMPLEMENTATION_KEYWORDS
        ]
        why = None
        if not args:
            why = "it is given no arguments"
        elif chosen:
            why = f"it already says {chosen[0]}="
        elif any(a.star == "**" for a in args):
            why = "it takes **kwargs, which may already choose an implementation"
        if why is not None:
            line = self.get_metadata(PositionProvider, original_node).start.line
            self.notes.append((line, f"{sorted(names & _OPTIMIZER_NAMES)[0]}(...): {why}"))
            return updated_node
        foreach = cst.ensure_type(cst.parse_expression("f(foreach=True)"), cst.Call).args[0]
        return updated_node.with_changes(args=_append_arg(args, foreach))


def foreach_optimizer(module: cst.Module, notes: Notes | None = None) -> cst.Module:
    """``module`` with ``foreach=True`` on every optimizer that can take it; ``notes`` gets those it left."""
    transformer = _AddForeach()
    new = MetadataWrapper(module).visit(transformer)
    if notes is not None:
        notes.extend(transformer.notes)
    return new
