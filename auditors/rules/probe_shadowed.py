"""probe_shadowed: the probe that times each step is ``infrarsi.probe``, untouched."""

from __future__ import annotations

import libcst as cst

from .._rule import AuditContext, Example, Finding, Rule
from .._source import PROBE_MODULE, SourceModel, dotted
from .._values import is_probe, object_paths, under
from .._writes import attribute_writes


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
        Example(
            "from infrarsi import probe\np = probe.from_env()\n_exit = type(p.step(0)).__exit__\n"
            "type(p.step(0)).__exit__ = lambda self, *exc: (flush(), _exit(self, *exc))[1]\n",
            note="the class of the probe's region object rewritten",
        ),
        (
            "from infrarsi import probe\np = probe.from_env()\nregion = p.step(0).__class__\n"
            "setattr(region, '__en' + 'ter__', late_enter)\n"
        ),
        "import infrarsi.probe as ip\nvars(ip)['from_env'] = fake\n",
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = []
        probe_bound = set()
        for node, real, bound in source.imports():
            if real == PROBE_MODULE or real.startswith(PROBE_MODULE + "."):
                probe_bound.add(bound)
            elif bound == "probe" or real.rsplit(".", 1)[-1] in ("probe", "from_env"):
                findings.append(
                    self.finding(source, node, f"`{bound}` is imported from `{real}`, not `{PROBE_MODULE}`")
                )
        for write in attribute_writes(source):
            paths = object_paths(source, write.obj)
            if not any(is_probe(f"{path}.x") for path in paths):
                continue
            owner = "the probe module" if any(under(path, PROBE_MODULE) for path in paths) else "the probe"
            what = f"`{source.code(write.obj)}.{write.attr or '<computed>'}` of {owner}"
            findings.append(
                self.finding(
                    source,
                    write.node,
                    f"{what} is reassigned" if write.how == "assigned" else f"{what} is patched ({write.how})",
                )
            )
        for node in source.of_type(cst.AssignTarget, cst.AugAssign, cst.AnnAssign):
            name = dotted(node.target)
            if name in probe_bound:
                findings.append(self.finding(source, node, f"`{name}` (infrarsi.probe) is rebound"))
            elif name in source.probe_vars:
                value = source.parent.get(node)
                value = getattr(value, "value", None)
                if value is not None and not source.is_probe_factory(value):
                    findings.append(
                        self.finding(source, node, f"`{name}`, the probe, is rebound to `{source.code(value)}`")
                    )
        for node in source.of_type(cst.ClassDef):
            for base in node.bases:
                if source.resolves_to(base.value, PROBE_MODULE):
                    findings.append(self.finding(source, node, f"class {node.name.value} subclasses the probe"))
        for node in source.of_type(cst.FunctionDef):
            if node.name.value in probe_bound:
                findings.append(self.finding(source, node, f"`{node.name.value}` (infrarsi.probe) is shadowed"))
        findings += self._foreign_step_regions(source)
        return findings

    def _foreign_step_regions(self, source: SourceModel) -> list[Finding]:
        """``with X.step(...)`` where X looks like the probe but does not come from from_env()."""
        uses_probe = bool(source.probe_vars) or any(real.startswith("infrarsi") for _, real, _ in source.imports())
        out = []
        for node in source.of_type(cst.With):
            for item in node.items:
                call = item.item
                if not (
                    isinstance(call, cst.Call)
                    and isinstance(call.func, cst.Attribute)
                    and call.func.attr.value == "step"
                ):
                    continue
                holder = call.func.value
                name = dotted(holder) or ""
                looks_like_probe = uses_probe or "probe" in name.lower()
                if looks_like_probe and not source.probe_object(holder):
                    out.append(
                        self.finding(
                            source,
                            node,
                            f"the timed region `with {source.code(call)}` does not "
                            f"use a probe from infrarsi.probe.from_env()",
                        )
                    )
        return out


RULE = ProbeShadowed()
