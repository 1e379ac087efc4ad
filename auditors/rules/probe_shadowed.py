"""probe_shadowed: the probe that times each step is ``infrarsi.probe``, untouched."""

from __future__ import annotations

import libcst as cst

from .._rule import AuditContext, Finding, Rule
from .._source import PROBE_MODULE, SourceModel, dotted


class ProbeShadowed(Rule):
    id = "probe_shadowed"
    message = "the probe is replaced, wrapped or shadowed"
    VALID = [
        "from infrarsi import probe\np = probe.from_env()\nwith p.step(1, tokens=8):\n    work()\n",
        "from infrarsi import probe as pr\np = pr.from_env()\nwith p.step(1):\n    work()\np.log(1, loss=0.5)\n",
        "import infrarsi.probe\nrec = infrarsi.probe.from_env()\nwith rec.step(1):\n    work()\n",
        "from infrarsi.probe import from_env\nclass T:\n    def __init__(self):\n        self.probe = from_env()\n"
        "    def fit(self):\n        with self.probe.step(1):\n            work()\n",
        "with torch.no_grad():\n    opt.step()\n",
    ]
    INVALID = [
        "from infrarsi import probe\nimport time as _t\nprobe.time = FakeTime()\n",
        "from mylib import probe\np = probe.from_env()\nwith p.step(1):\n    work()\n",
        "from trainkit.metrics import probe as pr\np = pr.from_env()\n",
        "from infrarsi import probe\np = Wrapper(probe.from_env())\nwith p.step(1):\n    work()\n",
        "from infrarsi import probe\np = probe.from_env()\np = FakeProbe()\nwith p.step(1):\n    work()\n",
        "from infrarsi import probe\nclass Quiet(probe.Probe):\n    pass\n",
        "from infrarsi import probe\np = probe.from_env()\np.step = lambda *a, **k: contextlib.nullcontext()\n",
        "from infrarsi import probe\nsetattr(probe, 'from_env', fake)\n",
        "from infrarsi import probe\nprobe = FakeModule()\n",
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = []
        probe_bound = set()
        for node, real, bound in source.imports():
            if real == PROBE_MODULE or real.startswith(PROBE_MODULE + "."):
                probe_bound.add(bound)
            elif bound == "probe" or real.rsplit(".", 1)[-1] in ("probe", "from_env"):
                findings.append(self.finding(source, node, f"`{bound}` is imported from `{real}`, not "
                                             f"`{PROBE_MODULE}`"))
        for node in source.of_type(cst.AssignTarget, cst.AugAssign, cst.AnnAssign):
            target = node.target
            name = dotted(target)
            if isinstance(target, cst.Attribute) and source.resolves_to(target.value, PROBE_MODULE):
                findings.append(self.finding(source, node, f"`{source.code(target)}` of the probe module is "
                                             "reassigned"))
            elif isinstance(target, cst.Attribute) and source.probe_object(target.value):
                findings.append(self.finding(source, node, f"`{source.code(target)}` of the probe is reassigned"))
            elif name in probe_bound:
                findings.append(self.finding(source, node, f"`{name}` (infrarsi.probe) is rebound"))
            elif name in source.probe_vars:
                value = source.parent.get(node)
                value = getattr(value, "value", None)
                if value is not None and not source.is_probe_factory(value):
                    findings.append(self.finding(source, node, f"`{name}`, the probe, is rebound to "
                                                 f"`{source.code(value)}`"))
        for node in source.of_type(cst.ClassDef):
            for base in node.bases:
                if source.resolves_to(base.value, PROBE_MODULE):
                    findings.append(self.finding(source, node, f"class {node.name.value} subclasses the probe"))
        for node in source.of_type(cst.FunctionDef):
            if node.name.value in probe_bound:
                findings.append(self.finding(source, node, f"`{node.name.value}` (infrarsi.probe) is shadowed"))
        for call in source.of_type(cst.Call):
            if dotted(call.func) == "setattr" and call.args and (
                    source.resolves_to(call.args[0].value, PROBE_MODULE) or source.probe_object(call.args[0].value)):
                findings.append(self.finding(source, call, "the probe is patched with setattr"))
        findings += self._foreign_step_regions(source)
        return findings

    def _foreign_step_regions(self, source: SourceModel) -> list[Finding]:
        """``with X.step(...)`` where X looks like the probe but does not come from from_env()."""
        uses_probe = bool(source.probe_vars) or any(real.startswith("infrarsi") for _, real, _ in source.imports())
        out = []
        for node in source.of_type(cst.With):
            for item in node.items:
                call = item.item
                if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                        and call.func.attr.value == "step"):
                    continue
                holder = call.func.value
                name = dotted(holder) or ""
                looks_like_probe = uses_probe or "probe" in name.lower()
                if looks_like_probe and not source.probe_object(holder):
                    out.append(self.finding(source, node, f"the timed region `with {source.code(call)}` does not "
                                            f"use a probe from infrarsi.probe.from_env()"))
        return out


RULE = ProbeShadowed()
