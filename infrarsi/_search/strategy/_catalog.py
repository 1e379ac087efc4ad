"""The built-in catalog: libcst codemods that rewrite a slow idiom into a faster equivalent.

Each codemod matches one common idiom and rewrites only what it matched; libcst keeps the
rest of the file byte for byte. A codemod that cannot see that its rewrite trains the same
job (the same losses in fp32, up to rounding) does not apply: the search verifies every
speedup anyway, but a proposal that cannot pass is wasted budget. :class:`CatalogProposer`
turns each codemod that changes something into one proposal, a ``git apply``-able diff.
The codemods themselves live in :mod:`infrarsi._search.strategy.codemods`, one module each.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from infrarsi.contract import PatchRef

from ._proposers import Proposal, ProposalContext
from .codemods import cached_causal_mask, foreach_optimizer, no_checkpoint, sdpa_attention

__all__ = ["CATALOG", "CatalogProposer", "Codemod", "unified_diff"]


@dataclass(frozen=True)
class Codemod:
    """One rewrite. ``transform`` gives the new module text, or None where it does not apply."""

    name: str
    description: str
    # (module, notes) -> the module, unchanged where nothing matches; notes get what it saw and left.
    rewrite: Callable[..., cst.Module]

    def transform(self, source: str) -> str | None:
        """The rewritten text; None where it does not parse or nothing changes."""
        return self.attempt(source)[0]

    def attempt(self, source: str) -> tuple[str | None, list[tuple[int, str]]]:
        """The rewritten text (None where nothing changes) and, by line, the idiom it saw and left, and why."""
        try:
            module = cst.parse_module(source)
        except (cst.ParserSyntaxError, RecursionError) as exc:
            return None, [(getattr(exc, "raw_line", 0) or 0, "the file does not parse")]
        notes: list[tuple[int, str]] = []
        out = self.rewrite(module, notes).code
        return (None if out == source else out), notes


# ---------------------------------------------------------------- the catalog

CATALOG: tuple[Codemod, ...] = (
    Codemod(
        "sdpa-attention",
        "manual causal softmax attention -> F.scaled_dot_product_attention(is_causal=True): one fused kernel, "
        "no T x T scores or mask materialised",
        sdpa_attention,
    ),
    Codemod(
        "foreach-optimizer",
        "torch.optim optimizers get foreach=True: one multi-tensor kernel per update step instead of a "
        "Python loop over parameters",
        foreach_optimizer,
    ),
    Codemod(
        "cached-causal-mask",
        "the causal tril(ones(T, T)) mask built on every forward is built once per size, dtype and device "
        "(functools.lru_cache)",
        cached_causal_mask,
    ),
    Codemod(
        "no-checkpoint",
        "activation checkpointing off: checkpoint(fn, *args) -> fn(*args), no recomputed forward in "
        "backward, at the cost of keeping the activations",
        no_checkpoint,
    ),
)


def _lines(text: str) -> list[str]:
    """Lines split at ``\\n`` only (str.splitlines also splits at form feeds and the like)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def unified_diff(path: str, before: str, after: str) -> str:
    """One file's change as ``git apply`` reads it: ``a/``/``b/`` paths, 3 lines of context."""
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in difflib.unified_diff(_lines(before), _lines(after), f"a/{path}", f"b/{path}", n=3):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _plain_path(path: str) -> bool:
    """A path git writes unquoted in a diff header; others would need git's quoting."""
    return path.isascii() and path.isprintable() and not any(c in path for c in ' \t"\\')


class CatalogProposer:
    """One proposal per codemod that changes at least one editable file: a diff over all it changed.

    ``explained`` says, after :meth:`propose`, for every codemod: applied (to which files), or why
    not (its idiom not found, or found in a form it does not rewrite, with file:line and the reason).
    """

    name = "catalog"

    def __init__(self, codemods: tuple[Codemod, ...] = CATALOG) -> None:
        self.codemods = codemods
        self.explained: list[dict] = []

    def propose(self, context: ProposalContext) -> list[Proposal]:
        """The proposals for this workspace's editable files, in catalog order."""
        out = []
        self.explained = []
        for codemod in self.codemods:
            diffs, applied, why = [], [], []
            for path, text in sorted(context.editable.items()):
                if not _plain_path(path):
                    why.append(f"{path}: a path git would quote in a diff; not rewritten")
                    continue
                after, notes = codemod.attempt(text)
                if after is not None:
                    diffs.append(unified_diff(path, text, after))
                    applied.append(path)
                why += [f"{path}:{line}: {note}" for line, note in notes]
            if diffs:
                out.append(
                    Proposal(PatchRef(f"catalog:{codemod.name}", "".join(diffs)), self.name, codemod.description)
                )
            if not applied and not why:
                why = [f"not found in the editable files ({', '.join(sorted(context.editable)) or 'none'})"]
            self.explained.append({"codemod": codemod.name, "applied": applied, "not_applied": why})
        return out
