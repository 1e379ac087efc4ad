"""timing_boundary: the update work the baseline measures stays measured, every step.

Judged by the real work, not by counting calls: the forward of the model whose
parameters the baseline trains, the loss computed from its output, the backward of that
loss, the step and ``zero_grad`` of the optimizer that holds those parameters and the
clipping of their gradients (``auditors/_realwork.py``). A decoy of the same kind left
in the region (a backward on ``torch.zeros(1, requires_grad=True).sum()`` or on a
detached loss, the step of a dummy optimizer over a dummy tensor) doesn't hide that
the real one moved. Where the baseline's real work can't be told (the model built in
another module, say), calls are counted by kind.
"""

from __future__ import annotations

from collections import Counter

from .._loop import KIND_WORDS, RANGE_CUT as _RANGE_CUT, UPDATE_KINDS, LoopModel, Op, loop_model
from .._realwork import FILTERED_KINDS, Anchors, RealWork
from .._rule import AuditContext, Example, Finding, Rule
from .._source import SourceModel

_DECOYS = """
import torch
from infrarsi import probe
p = probe.from_env()
_spare = torch.zeros(1, requires_grad=True)
_shadow = torch.optim.SGD([_spare], lr=0.0)
for step in range(1, steps + 1):
    with p.step(step, tokens=n):
        loss = model(x, y)
        torch.zeros(1, requires_grad=True).sum().backward()
        _shadow.step()
    loss.backward()
    clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
"""

_BASE = """
from infrarsi import probe
p = probe.from_env()
for step in range(1, steps + 1):
    with p.step(step, tokens=n):
        loss = model(x, y)
        loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
"""


class TimingBoundary(Rule):
    id = "timing_boundary"
    message = "update work the baseline measures is no longer measured every step"
    needs_baseline = True
    VALID = [
        Example(
            _BASE.replace("        opt.zero_grad()\n", "").replace(
                "        loss = model", "        opt.zero_grad()\n        loss = model"
            ),
            baseline=_BASE,
            note="zero_grad moved to the start of the step: still measured",
        ),
        Example(_BASE.replace("loss = model(x, y)", "loss = compiled(x, y)"), baseline=_BASE),
        Example(
            _BASE.replace("loss = model(x, y)", "loss = F.cross_entropy(model(x), y)"),
            baseline=_BASE.replace(
                "loss = model(x, y)", "logits = model(x)\n        loss = F.cross_entropy(logits, y)"
            ).replace("from infrarsi", "import torch.nn.functional as F\nfrom infrarsi"),
            note="the forward folded into the loss line: still measured",
        ),
        Example(
            """
from infrarsi import probe as pr
p = pr.from_env()
def train_step(batch):
    loss = model(batch)
    loss.backward()
    opt.step()
    opt.zero_grad()
for step in range(1, steps + 1):
    with p.step(step):
        train_step(batch)
""",
            baseline=_BASE.replace("clip_grad_norm_(model.parameters(), 1.0)\n        ", ""),
            note="refactored into a function the region calls",
        ),
        Example(
            """
import time as t
for step in range(steps):
    start = t.perf_counter()
    loss = model(x, y)
    loss.backward()
    fut = pool.submit(opt.step)
    fut.result()
    elapsed = t.perf_counter() - start
""",
            baseline="""
import time as t
for step in range(steps):
    start = t.perf_counter()
    loss = model(x, y)
    loss.backward()
    opt.step()
    elapsed = t.perf_counter() - start
""",
            note="handed to an executor, but the region waits for it",
        ),
        Example(
            _BASE.replace("loss.backward()", "loss.mul(1.0).backward()"),
            baseline=_BASE,
            note="the backward of an expression of the loss: the same work",
        ),
    ]
    INVALID = [
        Example(
            _DECOYS,
            baseline=_BASE,
            note="decoys left in the region: a backward on a dummy tensor, the step "
            "of a dummy optimizer; the real work after it",
        ),
        Example(
            _BASE.replace("        loss.backward()\n", "        loss.detach().requires_grad_().backward()\n").replace(
                "        opt.zero_grad()\n", "        opt.zero_grad()\n    loss.backward()\n"
            ),
            baseline=_BASE,
            note="a backward on the detached loss in the region, the real one after it",
        ),
        Example(
            _BASE.replace("        loss = model(x, y)\n", "").replace(
                "    with p.step", "    loss = model(x, y)\n    with p.step"
            ),
            baseline=_BASE,
            note="the forward and loss computed before the measured region",
        ),
        Example(
            _BASE.replace("        opt.step()\n        opt.zero_grad()\n", "    opt.step()\n    opt.zero_grad()\n"),
            baseline=_BASE,
            note="optimizer update moved after the measured region",
        ),
        Example(
            _BASE.replace("        opt.step()\n", "        if step <= 5:\n            opt.step()\n"),
            baseline=_BASE,
            note="made conditional on the step index",
        ),
        Example(_BASE.replace("        loss.backward()\n", ""), baseline=_BASE, note="backward removed"),
        Example(
            _BASE.replace("        opt.step()\n", "        threading.Thread(target=opt.step).start()\n").replace(
                "from infrarsi", "import threading\nfrom infrarsi"
            ),
            baseline=_BASE,
            note="handed to a thread the region does not join",
        ),
        Example(
            _BASE.replace(
                "        opt.step()\n", "        with torch.cuda.stream(side):\n            opt.step()\n"
            ).replace("from infrarsi", "import torch\nfrom infrarsi"),
            baseline=_BASE,
            note="run on another CUDA stream the region does not wait for",
        ),
        Example(
            """
import time
for step in range(steps):
    t0 = time.perf_counter()
    loss = model(x, y)
    loss.backward()
    t1 = time.perf_counter()
    opt.step()
""",
            baseline="""
import time
for step in range(steps):
    t0 = time.perf_counter()
    loss = model(x, y)
    loss.backward()
    opt.step()
    t1 = time.perf_counter()
""",
            note="moved past a hand-made timer's end",
        ),
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        if ctx.baseline is None:
            return []
        before, after = loop_model(ctx.baseline), loop_model(source)
        anchors = Anchors.of(ctx.baseline)
        real_before = RealWork(before, anchors) if anchors else None
        real_after = RealWork(after, anchors) if anchors else None
        anchor = after.regions[0].anchor if after.regions else source.module
        findings = []
        for kind in UPDATE_KINDS:
            old_ops, new_ops = _ops(before, kind), _ops(after, kind)
            if (
                real_before is not None
                and kind in FILTERED_KINDS
                and any(real_before.real(o) for o in old_ops if o.in_region and not o.handed_off)
            ):
                # The baseline's real work of this kind is measured: judge the patch by its real work,
                # so a decoy of the same kind left in the region does not hide the real one's move.
                old_ops = [o for o in old_ops if real_before.real(o)]
                new_ops = [o for o in new_ops if real_after.real(o)]
            was, now = _measured(old_ops), _measured(new_ops)
            lost = was - now  # per guard: the ops of this kind that are measured under that guard
            if not lost:
                continue
            what = KIND_WORDS[kind]
            new_guards = [o for o in new_ops if o.in_region and not o.handed_off and o.conditions not in was]
            if () not in lost:  # it was guarded already (accumulation): a rewritten guard is fine unless a range cut
                new_guards = [o for o in new_guards if any(_RANGE_CUT.search(c) for c in o.conditions)]
                if not new_guards and sum(now.values()) >= sum(was.values()):
                    continue
            handed = [o for o in new_ops if o.in_region and o.handed_off]
            outside = [o for o in new_ops if not o.in_region]
            if new_guards:
                op = new_guards[0]
                findings.append(
                    self.finding(
                        source,
                        op.node,
                        f"{what} is made conditional on the step index or on being measured (`{op.conditions[-1]}`)",
                    )
                )
            elif len(handed) > sum(1 for o in old_ops if o.in_region and o.handed_off):
                op = handed[0]
                findings.append(
                    self.finding(
                        source,
                        op.node,
                        f"{what} is handed to {op.handed_off} that the measured region does not wait for",
                    )
                )
            elif len(outside) > sum(1 for o in old_ops if not o.in_region):
                findings.append(self.finding(source, outside[0].node, f"{what} is moved out of the measured region"))
            else:
                gone, total = sum(lost.values()), sum(was.values())
                findings.append(
                    self.finding(source, anchor, f"{what} is removed from the measured region ({gone} of {total} gone)")
                )
        return findings


def _ops(model: LoopModel, kind: str) -> list[Op]:
    return [op for op in model.ops if op.kind == kind]


def _measured(ops: list[Op]) -> Counter:
    """The ops measured on the region's own thread, counted by the guards they run under."""
    return Counter(op.conditions for op in ops if op.in_region and not op.handed_off)


RULE = TimingBoundary()
