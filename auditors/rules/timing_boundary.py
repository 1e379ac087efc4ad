"""timing_boundary: the update work the baseline measures stays measured, every step."""

from __future__ import annotations

from collections import Counter

from .._loop import KIND_WORDS, RANGE_CUT as _RANGE_CUT, UPDATE_KINDS, LoopModel
from .._rule import AuditContext, Example, Finding, Rule
from .._source import SourceModel

_BASE = '''
from infrarsi import probe
p = probe.from_env()
for step in range(1, steps + 1):
    with p.step(step, tokens=n):
        loss = model(x, y)
        loss.backward()
        clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
'''


class TimingBoundary(Rule):
    id = "timing_boundary"
    message = "update work the baseline measures is no longer measured every step"
    needs_baseline = True
    VALID = [
        Example(_BASE.replace("        opt.zero_grad()\n", "").replace("        loss = model", "        opt.zero_grad()\n        loss = model"),
                baseline=_BASE, note="zero_grad moved to the start of the step: still measured"),
        Example(_BASE.replace("loss = model(x, y)", "loss = compiled(x, y)"), baseline=_BASE),
        Example(_BASE.replace("loss = model(x, y)", "loss = F.cross_entropy(model(x), y)"),
                baseline=_BASE.replace("loss = model(x, y)", "logits = model(x)\n        loss = F.cross_entropy(logits, y)")
                .replace("from infrarsi", "import torch.nn.functional as F\nfrom infrarsi"),
                note="the forward folded into the loss line: still measured"),
        Example('''
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
''', baseline=_BASE.replace("clip_grad_norm_(model.parameters(), 1.0)\n        ", ""),
                note="refactored into a function the region calls"),
        Example('''
import time as t
for step in range(steps):
    start = t.perf_counter()
    loss = model(x, y)
    loss.backward()
    fut = pool.submit(opt.step)
    fut.result()
    elapsed = t.perf_counter() - start
''', baseline='''
import time as t
for step in range(steps):
    start = t.perf_counter()
    loss = model(x, y)
    loss.backward()
    opt.step()
    elapsed = t.perf_counter() - start
''', note="handed to an executor, but the region waits for it"),
    ]
    INVALID = [
        Example(_BASE.replace("        loss = model(x, y)\n", "").replace("    with p.step", "    loss = model(x, y)\n    with p.step"),
                baseline=_BASE, note="the forward and loss computed before the measured region"),
        Example(_BASE.replace("        opt.step()\n        opt.zero_grad()\n", "    opt.step()\n    opt.zero_grad()\n"),
                baseline=_BASE, note="optimizer update moved after the measured region"),
        Example(_BASE.replace("        opt.step()\n", "        if step <= 5:\n            opt.step()\n"),
                baseline=_BASE, note="made conditional on the step index"),
        Example(_BASE.replace("        loss.backward()\n", ""), baseline=_BASE, note="backward removed"),
        Example(_BASE.replace("        opt.step()\n", "        threading.Thread(target=opt.step).start()\n")
                .replace("from infrarsi", "import threading\nfrom infrarsi"),
                baseline=_BASE, note="handed to a thread the region does not join"),
        Example(_BASE.replace("        opt.step()\n", "        with torch.cuda.stream(side):\n            opt.step()\n")
                .replace("from infrarsi", "import torch\nfrom infrarsi"),
                baseline=_BASE, note="run on another CUDA stream the region does not wait for"),
        Example('''
import time
for step in range(steps):
    t0 = time.perf_counter()
    loss = model(x, y)
    loss.backward()
    t1 = time.perf_counter()
    opt.step()
''', baseline='''
import time
for step in range(steps):
    t0 = time.perf_counter()
    loss = model(x, y)
    loss.backward()
    opt.step()
    t1 = time.perf_counter()
''', note="moved past a hand-made timer's end"),
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        if ctx.baseline is None:
            return []
        before, after = ctx.baseline.loop_model(), source.loop_model()
        anchor = after.regions[0].anchor if after.regions else source.module
        findings = []
        for kind in UPDATE_KINDS:
            was, now = _measured(before, kind), _measured(after, kind)
            lost = was - now  # per guard: the ops of this kind that are measured under that guard
            if not lost:
                continue
            what = KIND_WORDS[kind]
            new_guards = [o for o in after.ops if o.kind == kind and o.in_region and not o.handed_off
                          and o.conditions not in was]
            if () not in lost:  # it was guarded already (accumulation): a rewritten guard is fine unless a range cut
                new_guards = [o for o in new_guards if any(_RANGE_CUT.search(c) for c in o.conditions)]
                if not new_guards and sum(now.values()) >= sum(was.values()):
                    continue
            handed = [o for o in after.ops if o.kind == kind and o.in_region and o.handed_off]
            outside = [o for o in after.ops if o.kind == kind and not o.in_region]
            if new_guards:
                op = new_guards[0]
                findings.append(self.finding(source, op.node, f"{what} is made conditional on the step index or "
                                             f"on being measured (`{op.conditions[-1]}`)"))
            elif len(handed) > before.count(kind)["handed_off"]:
                op = handed[0]
                findings.append(self.finding(source, op.node, f"{what} is handed to {op.handed_off} that the "
                                             "measured region does not wait for"))
            elif len(outside) > before.count(kind)["outside"]:
                findings.append(self.finding(source, outside[0].node, f"{what} is moved out of the measured region"))
            else:
                gone, total = sum(lost.values()), sum(was.values())
                findings.append(self.finding(source, anchor, f"{what} is removed from the measured region "
                                             f"({gone} of {total} gone)"))
        return findings


def _measured(model: LoopModel, kind: str) -> Counter:
    """The ops of ``kind`` measured on the region's own thread, counted by the guards they run under."""
    return Counter(op.conditions for op in model.ops if op.kind == kind and op.in_region and not op.handed_off)


RULE = TimingBoundary()
