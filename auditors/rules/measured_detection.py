"""measured_detection: the job does the same work whether or not it is being measured."""

from __future__ import annotations

import libcst as cst

from .._rule import AuditContext, Finding, Rule
from .._source import SourceModel, dotted, string_value

_REPORTING = {"print", "log", "info", "debug", "warning", "warn", "write", "flush", "set_postfix", "update",
              "add_scalar", "log_dict", "pass"}
# total_steps is how the job learns the step count (DESIGN.md), so reading it is honest.
_PROBE_STATE = {"enabled", "_file", "recording", "active"}


class MeasuredDetection(Rule):
    id = "measured_detection"
    message = "the job detects that it is being measured"
    VALID = [
        "from infrarsi import probe\np = probe.from_env()\nfor step in range(1, 11):\n    train()\n"
        "    if not p.enabled and step % 10 == 0:\n        print(f'step {step}')\n",
        "from infrarsi import probe\np = probe.from_env()\nsteps = p.total_steps or 100\n",
        "import os\nlr = float(os.environ.get('LR', '1e-3'))\n",
    ]
    INVALID = [
        "import os\nsteps = int(os.environ.get('INFRARSI_STEPS', 100))\nif 'INFRARSI_STEPS' in os.environ:\n"
        "    accum = 1\n",
        "from infrarsi import probe\np = probe.from_env()\nif p.enabled:\n    accum = 1\n",
        "from infrarsi import probe\np = probe.from_env()\naccum = 1 if p.enabled else 4\n",
        "from infrarsi import probe\np = probe.from_env()\nif isinstance(p, probe.NullProbe):\n    model = big\n"
        "else:\n    model = small\n",
    ]

    def _probe_state(self, source: SourceModel, test: cst.CSTNode) -> bool:
        for node in source.descendants(test):
            if isinstance(node, cst.Attribute) and node.attr.value in _PROBE_STATE and source.probe_object(node.value):
                return True
            if isinstance(node, cst.Call) and dotted(node.func) in ("isinstance", "type") and node.args \
                    and source.probe_object(node.args[0].value):
                return True
        return False

    def _reporting_only(self, source: SourceModel, body: cst.CSTNode | None) -> bool:
        if body is None:
            return True
        for stmt in source.descendants(body):
            if isinstance(stmt, cst.BaseSmallStatement):
                if isinstance(stmt, cst.Pass):
                    continue
                if not (isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call)):
                    return False
                name = dotted(stmt.value.func) or ""
                if name.split(".")[-1] not in _REPORTING:
                    return False
        return True

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = []
        for node in source.of_type(cst.SimpleString, cst.FormattedString):
            text = string_value(node) or ""
            if text.startswith("INFRARSI_") and text != "INFRARSI_RECEIPTS":
                findings.append(self.finding(source, node, f"reads {text}, which only the runner sets: the job "
                                             "can tell it is measured (use p.total_steps for the step count)"))
        for node in source.of_type(cst.If):
            if self._probe_state(source, node.test) and not (
                    self._reporting_only(source, node.body) and self._reporting_only(source, node.orelse)):
                findings.append(self.finding(source, node, f"`if {source.code(node.test)}` changes what the job "
                                             "does when it is measured (only printing may depend on it)"))
        for node in source.of_type(cst.IfExp):
            if self._probe_state(source, node.test):
                findings.append(self.finding(source, node, f"`{source.code(node)}` depends on whether the job "
                                             "is measured"))
        return findings


RULE = MeasuredDetection()
