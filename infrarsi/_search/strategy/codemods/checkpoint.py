"""The no-checkpoint codemod: activation checkpointing off, ``checkpoint(fn, *args)`` becomes
``fn(*args)`` with the checkpoint-only keywords dropped, so backward recomputes no forward at the cost of
keeping the activations. A ``from torch.utils.checkpoint import checkpoint`` left unused goes too.
"""

from __future__ import annotations

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from ._cst import Notes, source_of

__all__ = ["no_checkpoint"]


_CHECKPOINT_ONLY = {"use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug"}


class _Uncheckpoint(cst.CSTTransformer):
    """Rewrites each ``torch.utils.checkpoint.checkpoint(fn, *args)`` call into ``fn(*args)``."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider)

    def __init__(self) -> None:
        super().__init__()
        self.notes: Notes = []

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        names = {q.name for q in self.get_metadata(QualifiedNameProvider, original_node.func, set())}
        args = updated_node.args
        if "torch.utils.checkpoint.checkpoint" not in names:
            return updated_node
        if not args or args[0].keyword is not None or args[0].star or any(a.star == "**" for a in args):
            line = self.get_metadata(PositionProvider, original_node).start.line
            self.notes.append((line, "checkpoint(...): the function is not its first positional argument"))
            return updated_node
        fn = args[0].value
        if not isinstance(fn, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not fn.lpar:
            fn = fn.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        kept = [a for a in args[1:] if a.keyword is None or a.keyword.value not in _CHECKPOINT_ONLY]
        if kept:
            kept[-1] = kept[-1].with_changes(comma=args[-1].comma)
        return updated_node.with_changes(func=fn, args=kept)


def no_checkpoint(module: cst.Module, notes: Notes | None = None) -> cst.Module:
    """``module`` with every checkpoint call unwrapped; the same object where there is none.
    ``notes`` gets the calls it could not unwrap."""
    transformer = _Uncheckpoint()
    new = MetadataWrapper(module).visit(transformer)
    if notes is not None:
        notes.extend(transformer.notes)
    if new.deep_equals(module):
        return module
    context = CodemodContext()
    for line in new.body:
        for stmt in line.body if isinstance(line, cst.SimpleStatementLine) else ():
            if (
                isinstance(stmt, cst.ImportFrom)
                and stmt.module is not None
                and source_of(stmt.module) == "torch.utils.checkpoint"
                and not isinstance(stmt.names, cst.ImportStar)
            ):
                for alias in stmt.names:
                    if source_of(alias.name) == "checkpoint":
                        asname = source_of(alias.asname.name) if alias.asname is not None else None
                        RemoveImportsVisitor.remove_unused_import(
                            context, "torch.utils.checkpoint", "checkpoint", asname
                        )
    return RemoveImportsVisitor(context).transform_module(new)
