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
    rewrite: Callable[[cst.Module], cst.Module]  # returns the module unchanged where nothing matches

    def transform(self, source: str) -> str | None:
        """The rewritten text; None where it does not parse or nothing changes."""
        try:
            module = cst.parse_module(source)
        except (cst.ParserSyntaxError, RecursionError):
            return None
        out = self.rewrite(module).code
        return None if out == source else out


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
    """One proposal per codemod that changes at least one editable file: a diff over all it changed."""

    name = "catalog"

    def __init__(self, codemods: tuple[Codemod, ...] = CATALOG) -> None:
        self.codemods = codemods

    def propose(self, context: ProposalContext) -> list[Proposal]:
        """The proposals for this workspace's editable files, in catalog order."""
        out = []
        for codemod in self.codemods:
            diffs = []
            for path, text in sorted(context.editable.items()):
                after = codemod.transform(text) if _plain_path(path) else None
                if after is not None:
                    diffs.append(unified_diff(path, text, after))
            if diffs:
                out.append(
                    Proposal(PatchRef(f"catalog:{codemod.name}", "".join(diffs)), self.name, codemod.description)
                )
        return out
