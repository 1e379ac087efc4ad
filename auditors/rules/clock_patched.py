"""clock_patched: the clocks and synchronisation the measurement relies on are left alone."""

from __future__ import annotations

import libcst as cst

from .._rule import AuditContext, Finding, Rule
from .._source import SourceModel, dotted, string_value
from .._values import CLOCK_MODULES, DEVICE_CLOCKS, is_clock
from .._writes import attribute_writes, written_paths


class ClockPatched(Rule):
    id = "clock_patched"
    message = "the clock or device synchronisation is patched or shadowed"
    VALID = [
        "import time\nt0 = time.perf_counter()\nwork()\nelapsed = time.perf_counter() - t0\n",
        "import time as t\nstart = t.monotonic_ns()\n",
        "import torch\nstart = torch.cuda.Event(enable_timing=True)\nstart.record()\ntorch.cuda.synchronize()\n",
        "from time import perf_counter\nnow = perf_counter()\n",
    ]
    INVALID = [
        "import time as _t\n_real = _t.monotonic_ns\n_t.monotonic_ns = lambda: _real() // 2\n",
        "import time\ntime.perf_counter = lambda: 0.0\n",
        "import torch\ntorch.cuda.synchronize = lambda *a: None\n",
        "import torch\ntorch.cuda.Event = FakeEvent\n",
        "import time\nsetattr(time, 'time', fake)\n",
        "from time import perf_counter\ndef perf_counter():\n    return 0.0\n",
        "import sys\nsys.modules['time'] = fake_time\n",
        "import fake_clock as time\n",
        "import time\nvars(time)['monotonic' + '_ns'] = fake\n",
        "import importlib\nclock = importlib.import_module('ti' + 'me')\nclock.monotonic_ns = fake\n",
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = []
        clock_bindings = set()  # names bound to a clock by import, e.g. `from time import perf_counter`
        for node, real, bound in source.imports():
            if real.split(".")[0] in CLOCK_MODULES or real in DEVICE_CLOCKS:
                clock_bindings.add(bound)
            elif bound in CLOCK_MODULES:
                findings.append(
                    self.finding(source, node, f"`{bound}` is imported from `{real}`, not the standard clock module")
                )
        for write in attribute_writes(source):
            if any(is_clock(path) for path in written_paths(source, write)):
                what = f"`{source.code(write.obj)}.{write.attr or '<computed>'}`"
                findings.append(
                    self.finding(
                        source,
                        write.node,
                        f"{what} is reassigned" if write.how == "assigned" else f"{what} is patched ({write.how})",
                    )
                )
        for node in source.of_type(cst.AssignTarget, cst.AugAssign, cst.AnnAssign):
            target = node.target
            if isinstance(target, cst.Name) and target.value in clock_bindings:
                findings.append(self.finding(source, node, f"`{target.value}` (a clock) is rebound"))
            elif isinstance(target, cst.Subscript) and dotted(target.value) == "sys.modules":
                key = next((string_value(e.slice.value) for e in target.slice if isinstance(e.slice, cst.Index)), None)
                if key and key.split(".")[0] in ("time", "timeit", "torch"):
                    findings.append(self.finding(source, node, f"sys.modules[{key!r}] is replaced"))
        for node in source.of_type(cst.FunctionDef, cst.ClassDef):
            if node.name.value in clock_bindings:
                findings.append(
                    self.finding(source, node, f"`{node.name.value}` (a clock) is shadowed by a definition")
                )
        for call in source.of_type(cst.Call):  # monkeypatch.setattr("time.time", fake) and the like
            name = dotted(call.func)
            if name and name.split(".")[-1] == "setattr" and call.args:
                text = string_value(call.args[0].value) or ""
                if text.split(".")[0] in CLOCK_MODULES or text.startswith("torch.cuda."):
                    findings.append(self.finding(source, call, f"`{text}` is patched with setattr"))
        return findings


RULE = ClockPatched()
