"""measured_detection: the job does the same work whether or not it is being measured.

The probe tells the job the step count (``p.total_steps``) and whether it is recording
(``p.enabled``); the runner's ``INFRARSI_*`` variables say the same. The only use of
either that can't change the work is the loop bound, ``steps = p.total_steps or
args.steps`` (also inside ``range(...)``, or as ``if p.total_steps and i >=
p.total_steps: break``), and printing under ``if not p.enabled``. Anything else (a
batch size, a branch, a value kept for later) lets a patch train differently when
InfraRSI isn't looking, and earn a receipt for work production never does. The
environment is read by name: names built at run time (``"INFRA" + "RSI_STEPS"``) are
folded, names the audit can't read and scans of the whole environment are findings.
"""

from __future__ import annotations

import libcst as cst

from .._rule import AuditContext, Example, Finding, Rule
from .._source import PROBE_MODULE, SourceModel, dotted, string_value
from .._values import call_args, const_str, is_reference, last_name, object_paths, under

_REPORTING = {
    "print",
    "log",
    "info",
    "debug",
    "warning",
    "warn",
    "write",
    "flush",
    "set_postfix",
    "update",
    "add_scalar",
    "log_dict",
    "pass",
}
_PROBE_STATE = {"enabled", "_file", "recording", "active"}
_ENVIRON = ("os.environ", "os.environb", "posix.environ", "nt.environ")
_GETENV = ("os.getenv", "os.getenvb", "posix.getenv")
_BY_NAME = {"get", "pop", "setdefault", "__getitem__", "__contains__", "__setitem__", "__delitem__"}
_MARK = "INFRARSI_"
_ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "getattr"}

_LOOP = """
import argparse
from infrarsi import probe
p = probe.from_env()
steps = p.total_steps or args.steps
for step in range(1, steps + 1):
    x, y = get_batch(step, args.batch)
    with p.step(step):
        train(x, y)
"""


def _marks_infrarsi(text: str) -> bool:
    upper = text.upper()
    if _MARK in upper:
        return True
    return len(text) >= 4 and text == upper and text in _MARK and text not in ("RSI_", "SI_")


class MeasuredDetection(Rule):
    id = "measured_detection"
    message = "the job detects that it is being measured"
    VALID = [
        (
            "from infrarsi import probe\np = probe.from_env()\nfor step in range(1, 11):\n    train()\n"
            "    if not p.enabled and step % 10 == 0:\n        print(f'step {step}')\n"
        ),
        _LOOP,
        "import os\nlr = float(os.environ.get('LR', '1e-3'))\nrank = int(os.environ['LOCAL_RANK'])\n",
        (
            "from infrarsi import probe\np = probe.from_env()\nfor i, batch in enumerate(loader):\n"
            "    if p.total_steps and i >= p.total_steps:\n        break\n    train(batch)\n"
        ),
        (
            "import os\ndef env_int(name, default):\n    return int(os.environ.get(name, default))\n"
            "world = env_int('WORLD_SIZE', 1)\nfor key in ('RANK', 'LOCAL_RANK'):\n    print(os.getenv(key))\n"
        ),
        (
            "from infrarsi import probe as pr\nclass T:\n    def __init__(self):\n        self.probe = pr.from_env()\n"
            "    def fit(self):\n        for step in range(self.probe.total_steps or 100):\n            train()\n"
        ),
    ]
    INVALID = [
        (
            "import os\nsteps = int(os.environ.get('INFRARSI_STEPS', 100))\nif 'INFRARSI_STEPS' in os.environ:\n"
            "    accum = 1\n"
        ),
        "from infrarsi import probe\np = probe.from_env()\nif p.enabled:\n    accum = 1\n",
        "from infrarsi import probe\np = probe.from_env()\naccum = 1 if p.enabled else 4\n",
        (
            "from infrarsi import probe\np = probe.from_env()\nif isinstance(p, probe.NullProbe):\n    model = big\n"
            "else:\n    model = small\n"
        ),
        Example(
            _LOOP.replace(
                "get_batch(step, args.batch)", "get_batch(step, args.batch if p.total_steps else args.batch // 2)"
            ),
            note="half the batch when InfraRSI isn't measuring",
        ),
        "from infrarsi import probe\np = probe.from_env()\nmeasured = p.total_steps is not None\n",
        "from infrarsi import probe\np = probe.from_env()\nwatched = bool(p.enabled)\n",
        "import os\nflag = os.environ.get('INFRA' + 'RSI_STEPS')\n",
        "import os\nflag = os.getenv('_'.join(['INFRARSI', 'STEPS']))\n",
        "import os\nmeasured = any(k.startswith('INFRA') for k in os.environ)\n",
        "import os\nname = os.environ.get(key_from_somewhere())\n",
        "from infrarsi import probe\nmeasured = probe.STEPS_ENV in __import__('os').environ\n",
        "from infrarsi import probe\np = probe.from_env()\nmeasured = getattr(p, 'total' + '_steps')\n",
        "import os\nraw = open(f'/proc/{os.getpid()}/environ', 'rb').read()\n",
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = self._marked_strings(source) + self._environment(source) + self._probe_module(source)
        for node in source.of_type(cst.If):
            state = any(self._state_read(source, n) for n in source.descendants(node.test))
            total = any(self._probe_attr(source, n) == "total_steps" for n in source.descendants(node.test))
            if (state or (total and not self._exits(node))) and not (
                self._reporting_only(source, node.body) and self._reporting_only(source, node.orelse)
            ):
                findings.append(
                    self.finding(
                        source,
                        node,
                        f"`if {source.code(node.test)}` changes what the job "
                        "does when it is measured (only printing may depend on it)",
                    )
                )
        for node in source.of_type(cst.IfExp):
            if self._probe_state(source, node.test):
                findings.append(
                    self.finding(source, node, f"`{source.code(node)}` depends on whether the job is measured")
                )
        findings += self._probe_reads(source)
        return findings

    # -- the probe's state -----------------------------------------------------------------------
    def _probe_attr(self, source: SourceModel, node: cst.CSTNode) -> str | None:
        """The probe attribute ``node`` reads (``p.enabled``, ``getattr(p, 'total_steps')``), else None."""
        if isinstance(node, cst.Attribute) and source.probe_object(node.value):
            return node.attr.value
        if (
            isinstance(node, cst.Call)
            and last_name(node.func) == "getattr"
            and len(node.args) >= 2
            and source.probe_object(node.args[0].value)
            and source.resolves_to(node.func, "builtins.getattr")
        ):
            return const_str(source, node.args[1].value) or "?"
        return None

    def _state_read(self, source: SourceModel, node: cst.CSTNode) -> bool:
        attr = self._probe_attr(source, node)
        if attr in _PROBE_STATE or attr == "?":
            return True
        if isinstance(node, cst.Attribute) and node.attr.value == "__class__" and source.probe_object(node.value):
            return True
        return (
            isinstance(node, cst.Call)
            and dotted(node.func) in ("isinstance", "type")
            and bool(node.args)
            and source.probe_object(node.args[0].value)
        )

    def _probe_state(self, source: SourceModel, test: cst.CSTNode) -> bool:
        return any(
            self._state_read(source, n) or self._probe_attr(source, n) == "total_steps"
            for n in source.descendants(test)
        )

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

    def _probe_reads(self, source: SourceModel) -> list[Finding]:
        """Reads of the probe's state or step count outside an ``if``/``IfExp`` test (those are judged above)."""
        out = []
        for node in source.of_type(cst.Attribute, cst.Call):
            attr = self._probe_attr(source, node)
            total = attr == "total_steps"
            if attr is not None and attr.startswith("_"):
                continue  # p._file and the like: receipts_touched reports the reach into the probe
            if not (total or self._state_read(source, node)) or self._in_test(source, node):
                continue
            if total and self._loop_bound(source, node):
                continue
            what = source.code(node)
            out.append(
                self.finding(
                    source,
                    node,
                    f"`{what}` is used beyond the loop bound: the job could train "
                    "differently when InfraRSI isn't measuring"
                    if total
                    else f"`{what}` is read outside a print-only `if`: the job could act on being measured",
                )
            )
        return out

    @staticmethod
    def _in_test(source: SourceModel, node: cst.CSTNode) -> bool:
        """Inside an ``if``/``IfExp`` test, not kept for later by a walrus (``if (w := p.enabled)``)."""
        child = node
        for parent in source.ancestors(node):
            if isinstance(parent, cst.NamedExpr):
                return False
            if isinstance(parent, (cst.If, cst.IfExp)) and parent.test is child:
                return True
            if isinstance(parent, cst.BaseStatement):
                return False
            child = parent
        return False

    @staticmethod
    def _loop_bound(source: SourceModel, node: cst.CSTNode) -> bool:
        """``X = p.total_steps or N``, ``range(p.total_steps or N)``, a ``while`` test, ``if ...: break``."""
        parent = source.parent.get(node)
        if isinstance(parent, cst.BooleanOperation) and isinstance(parent.operator, cst.Or) and parent.left is node:
            holder = source.parent.get(parent)
            if isinstance(holder, (cst.Assign, cst.AnnAssign)) and holder.value is parent:
                return True
            for a in source.ancestors(parent):
                if isinstance(a, cst.Call) and dotted(a.func) == "range":
                    return True
                if isinstance(a, cst.BaseStatement):
                    break
        for a in source.ancestors(node):
            if isinstance(a, cst.While) and source.inside(node, a.test):
                return True
            if isinstance(a, cst.If) and source.inside(node, a.test):
                return MeasuredDetection._exits(a)
            if isinstance(a, cst.BaseStatement):
                return False
        return False

    @staticmethod
    def _exits(node: cst.If) -> bool:
        """``if ...: break`` (or return) with no else: the end of the loop, the same work before it."""
        body = node.body.body if isinstance(node.body, cst.IndentedBlock) else [node.body]
        small = [s for stmt in body for s in getattr(stmt, "body", [stmt])]
        return node.orelse is None and bool(small) and all(isinstance(s, (cst.Break, cst.Return)) for s in small)

    # -- the runner's environment ----------------------------------------------------------------
    def _marked_strings(self, source: SourceModel) -> list[Finding]:
        kinds = (
            cst.SimpleString,
            cst.FormattedString,
            cst.ConcatenatedString,
            cst.BinaryOperation,
            cst.Call,
            cst.Subscript,
        )
        out = []
        for node in source.of_type(*kinds):
            text = const_str(source, node)
            if text is None or not _marks_infrarsi(text) or "INFRARSI_RECEIPTS" in text.upper():
                continue  # the receipt file is receipts_touched's to report
            parent = source.parent.get(node)
            if isinstance(parent, kinds) and (outer := const_str(source, parent)) is not None and text in outer:
                continue  # reported once, at the whole expression
            if isinstance(node, cst.SimpleString) and isinstance(source.parent.get(node), cst.Expr):
                continue  # a docstring or a bare string statement reads nothing
            out.append(
                self.finding(
                    source,
                    node,
                    f"reads {text}, which only the runner sets: the job can tell "
                    "it is measured (use p.total_steps for the step count)",
                )
            )
        return out

    def _environment(self, source: SourceModel) -> list[Finding]:
        out = []
        aliases = {bound for _, real, bound in source.imports() if under(real, *_ENVIRON, *_GETENV)}
        for node in source.of_type(cst.Name, cst.Attribute, cst.Call):
            name = last_name(node.func) if isinstance(node, cst.Call) else last_name(node)
            if name not in _ENV_NAMES and name not in aliases or isinstance(node, cst.Call) and name != "getattr":
                continue
            if not isinstance(node, cst.Call) and not is_reference(source, node):
                continue
            if self._env_root(source, node):
                out += self._environ_use(source, node)
            elif any(under(q, *_GETENV) for q in source.qnames(node)):
                call = source.parent.get(node)
                if isinstance(call, cst.Call) and call.func is node and call_args(call):
                    out += self._env_name(source, call, call_args(call)[0])
                else:
                    out.append(
                        self.finding(
                            source, node, f"`{source.code(node)}` is used other than to read a variable by name"
                        )
                    )
        for node in source.of_type(cst.SimpleString, cst.FormattedString, cst.ConcatenatedString, cst.BinaryOperation):
            text = const_str(source, node) or (string_value(node) if isinstance(node, cst.FormattedString) else "")
            parent = source.parent.get(node)
            if (
                text
                and "/proc/" in text
                and "environ" in text
                and not (
                    isinstance(parent, (cst.ConcatenatedString, cst.BinaryOperation)) and const_str(source, parent)
                )
            ):
                out.append(self.finding(source, node, f"reads {text!r}: a process's whole environment"))
        return out

    @staticmethod
    def _env_root(source: SourceModel, node: cst.CSTNode) -> bool:
        """``os.environ`` however reached: imported, aliased, ``getattr(os, 'envi' + 'ron')``."""
        if isinstance(node, cst.Call):
            return any(p in _ENVIRON for p in object_paths(source, node))
        return any(q in _ENVIRON for q in source.qnames(node)) or (
            isinstance(node, cst.Attribute) and any(p in _ENVIRON for p in object_paths(source, node))
        )

    def _environ_use(self, source: SourceModel, node: cst.CSTNode) -> list[Finding]:
        parent = source.parent.get(node)
        grand = source.parent.get(parent) if parent is not None else None
        if (
            isinstance(parent, cst.Subscript)
            and parent.value is node
            and len(parent.slice) == 1
            and isinstance(parent.slice[0].slice, cst.Index)
        ):
            return self._env_name(source, parent, parent.slice[0].slice.value)
        if (
            isinstance(parent, cst.Attribute)
            and parent.value is node
            and parent.attr.value in _BY_NAME
            and isinstance(grand, cst.Call)
            and call_args(grand)
        ):
            return self._env_name(source, grand, call_args(grand)[0])
        if (
            isinstance(parent, cst.ComparisonTarget)
            and isinstance(grand, cst.Comparison)
            and isinstance(parent.operator, (cst.In, cst.NotIn))
        ):
            return self._env_name(source, grand, grand.left)
        return [
            self.finding(
                source,
                node,
                f"`{source.code(grand if isinstance(grand, cst.Call) else node)}` scans "
                "the whole environment, where the runner's INFRARSI_* variables are",
            )
        ]

    def _env_name(self, source: SourceModel, node: cst.CSTNode, key: cst.CSTNode) -> list[Finding]:
        names = self._possible_names(source, key)
        if names is None:
            return [
                self.finding(
                    source, node, f"`{source.code(node)}` reads an environment variable whose name the audit can't read"
                )
            ]
        return []  # a constant name: _marked_strings judges it where it is written

    def _possible_names(self, source: SourceModel, key: cst.CSTNode) -> list[str] | None:
        """Every name ``key`` can be: a constant, a loop over constants, a parameter given constants."""
        text = const_str(source, key)
        if text is not None:
            return [text]
        if isinstance(key, cst.Attribute) and any(under(q, PROBE_MODULE) for q in source.qnames(key)):
            return [key.attr.value]  # probe.STEPS_ENV and friends: _probe_module reports them
        if not isinstance(key, cst.Name):
            return None
        for a in source.ancestors(key):
            if isinstance(a, (cst.For, cst.CompFor)) and isinstance(a.target, cst.Name) and a.target.value == key.value:
                items = a.iter.elements if isinstance(a.iter, (cst.Tuple, cst.List, cst.Set)) else None
                texts = [const_str(source, e.value) for e in items] if items is not None else [None]
                return None if None in texts else texts  # type: ignore[return-value]
            if isinstance(a, cst.FunctionDef):
                return self._argument_names(source, a, key.value)
        return None

    def _argument_names(self, source: SourceModel, fn: cst.FunctionDef, param: str) -> list[str] | None:
        params = [p.name.value for p in fn.params.params]
        if param not in params:
            return None
        index, found = params.index(param), []
        calls = [c for c in source.of_type(cst.Call) if dotted(c.func) == fn.name.value]
        for call in calls:
            arg = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param), None)
            positional = call_args(call)
            if arg is None and index < len(positional):
                arg = positional[index]
            text = const_str(source, arg) if arg is not None else None
            if text is None:
                return None
            found.append(text)
        return found or None

    def _probe_module(self, source: SourceModel) -> list[Finding]:
        """``probe.STEPS_ENV``, ``probe._steps_from_env``: the runner's variables through the probe module."""
        out = []
        for node in source.of_type(cst.Attribute):
            name = node.attr.value
            if (name.endswith("_ENV") or name == "_steps_from_env") and any(
                under(q, PROBE_MODULE, "infrarsi.autoprobe") for q in source.qnames(node)
            ):
                out.append(self.finding(source, node, f"`{source.code(node)}` names the runner's INFRARSI_* variables"))
        return out


RULE = MeasuredDetection()
