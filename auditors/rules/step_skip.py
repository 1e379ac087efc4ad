"""step_skip: every step does all of its update work."""

from __future__ import annotations

import libcst as cst

from .._loop import KIND_WORDS, RANGE_CUT as _RANGE_CUT, loop_model
from .._rule import AuditContext, Finding, Rule
from .._source import SourceModel

_ALWAYS = ("forward", "loss", "backward")
_SOMETIMES = ("optimizer_step", "clip", "zero_grad", "scheduler_step")

_LOOP = """
from infrarsi import probe
p = probe.from_env()
for step in range(1, steps + 1):
    with p.step(step):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
"""


class StepSkip(Rule):
    id = "step_skip"
    message = "the loop skips update work for some steps"
    VALID = [
        _LOOP,
        """
for i, (x, y) in enumerate(loader):
    loss = model(x, y) / accum
    loss.backward()
    if (i + 1) % accum == 0:
        opt.step()
        opt.zero_grad()
""",
        """
iter_num = 0
while True:
    loss = model(x, y)
    loss.backward()
    opt.step()
    iter_num += 1
    if iter_num > max_iters:
        break
""",
    ]
    INVALID = [
        _LOOP.replace("    with p.step(step):", "    if step % 2:\n        continue\n    with p.step(step):"),
        _LOOP.replace("        loss.backward()\n", "        if step % 3 != 0:\n            loss.backward()\n"),
        _LOOP.replace("        opt.step()\n", "        if step > 10:\n            opt.step()\n"),
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        model = loop_model(source)
        findings = []
        for op in model.ops:
            if not op.in_region or not op.conditions:
                continue
            guard = op.conditions[-1]
            if op.kind in _ALWAYS or (op.kind in _SOMETIMES and _RANGE_CUT.search(guard)):
                findings.append(
                    self.finding(source, op.node, f"{KIND_WORDS[op.kind]} runs only when `{guard}`: some steps skip it")
                )
        for region in model.regions:
            if not region.loops:
                continue
            loop = region.loops[0]
            steps = model.step_names(region)
            for node in source.descendants(loop.body):
                if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
                    continue
                if isinstance(node, cst.Continue) and self._innermost_loop(source, node) is loop:
                    guard = next((a for a in source.ancestors(node) if isinstance(a, cst.If)), None)
                    if guard is not None and source.inside(guard, loop) and model.measured_test(guard.test, steps):
                        findings.append(
                            self.finding(
                                source,
                                node,
                                f"`continue` when `{source.code(guard.test)}` skips the step's update work",
                            )
                        )
        return _unique(findings)

    @staticmethod
    def _innermost_loop(source: SourceModel, node: cst.CSTNode):
        return next((a for a in source.ancestors(node) if isinstance(a, (cst.For, cst.While))), None)


def _unique(findings: list[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        if (f.line, f.col, f.message) not in seen:
            seen.add((f.line, f.col, f.message))
            out.append(f)
    return out


RULE = StepSkip()
