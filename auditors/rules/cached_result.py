"""cached_result: the loss and the outputs it comes from are computed afresh every step."""

from __future__ import annotations

import libcst as cst

from .._loop import loop_model
from .._rule import AuditContext, Finding, Rule
from .._source import SourceModel, dotted


class CachedResult(Rule):
    id = "cached_result"
    message = "a result is computed once and reused across steps"
    VALID = [
        "for step in range(steps):\n    loss = model(x, y)\n    loss.backward()\n    opt.step()\n",
        "def train_step(batch):\n    loss = model(batch)\n    loss.backward()\n    opt.step()\n"
        "for batch in loader:\n    train_step(batch)\n",
        "_MASKS = {}\ndef mask(t):\n    if t not in _MASKS:\n        _MASKS[t] = build(t)\n    return _MASKS[t]\n"
        "for step in range(steps):\n    loss = model(x, mask(8))\n    loss.backward()\n    opt.step()\n",
    ]
    INVALID = [
        "loss = model(x, y)\nfor step in range(steps):\n    loss.backward(retain_graph=True)\n    opt.step()\n",
        "cached = None\nfor step in range(steps):\n    if cached is None:\n        cached = model(x, y)\n"
        "    cached.backward(retain_graph=True)\n    opt.step()\n",
        "for step in range(steps):\n    if step == 1:\n        out = model(x)\n    loss = crit(out, y)\n"
        "    loss.backward(retain_graph=True)\n    opt.step()\n",
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        model = loop_model(source)
        assignments = model.work.loss_assignments()
        findings = []
        for op in model.ops:
            if op.kind != "backward" or not isinstance(op.node.func, cst.Attribute):
                continue
            loop = self._loop_in_function(source, op.node)
            name = model.work.loss_name(op.node)
            computed = [s for s in assignments.get(name, []) if model.work.owner(s) is model.work.owner(op.node)]
            if loop is not None and computed and not any(source.inside(s, loop) for s in computed):
                findings.append(
                    self.finding(
                        source,
                        op.node,
                        f"`{name}` is computed once, outside the loop, and backward() reuses it every step",
                    )
                )
        for op in model.ops:
            if op.kind not in ("loss", "forward"):
                continue
            guard = self._memo_guard(source, op.node)
            if guard is not None:
                findings.append(
                    self.finding(
                        source,
                        op.node,
                        f"`{source.code(op.node)}` runs only when "
                        f"`{source.code(guard.test)}`: computed once, reused after",
                    )
                )
        return findings

    @staticmethod
    def _loop_in_function(source: SourceModel, node: cst.CSTNode) -> cst.CSTNode | None:
        for a in source.ancestors(node):
            if isinstance(a, (cst.For, cst.While)):
                return a
            if isinstance(a, cst.FunctionDef):
                return None
        return None

    @staticmethod
    def _memo_test(test: cst.CSTNode) -> bool:
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return True
        return isinstance(test, cst.Comparison) and any(
            isinstance(c.operator, (cst.Is, cst.Equal)) for c in test.comparisons
        )

    def _memo_guard(self, source: SourceModel, stmt: cst.CSTNode) -> cst.If | None:
        """An ``if X is None`` / ``if not X`` / ``if step == k`` that lets ``stmt`` run once and persist.

        It persists when the guard sits inside a loop (a local kept across iterations) or
        the result goes to an attribute or global (kept across calls of a step function).
        """
        targets = [dotted(t.target) or "" for t in getattr(stmt, "targets", [])] or [
            dotted(getattr(stmt, "target", stmt)) or ""
        ]
        guard = None
        for a in source.ancestors(stmt):
            if isinstance(a, cst.If) and guard is None and not (a.orelse is not None and source.inside(stmt, a.orelse)):
                if self._memo_test(a.test):
                    guard = a
            if isinstance(a, (cst.For, cst.While)):
                return guard
            if isinstance(a, (cst.FunctionDef, cst.Module)):
                return guard if guard is not None and any("." in t for t in targets) else None
        return None


RULE = CachedResult()
