"""receipts_touched: the job writes its evidence only through the probe's public API."""

from __future__ import annotations

import re

import libcst as cst

from .._rule import AuditContext, Finding, Rule
from .._source import SourceModel, string_value
from .._values import call_args, const_str

_WORKSPACE_DIR = re.compile(r"(^|[/\\])\.infrarsi([/\\]|$)")
# Every part of the framework but the probe (and the autoprobe that wraps it); private modules by prefix.
_INTERNAL_PACKAGES = (
    "infrarsi.ledger",
    "infrarsi.verifiers",
    "infrarsi.auditors",
    "infrarsi.runner",
    "infrarsi.contract",
    "infrarsi.cli",
    "infrarsi.errors",
    "infrarsi.signing",
)


def _internal(module: str) -> bool:
    return module.startswith("infrarsi._") or any(module == p or module.startswith(p + ".") for p in _INTERNAL_PACKAGES)


class ReceiptsTouched(Rule):
    id = "receipts_touched"
    message = "receipts or the ledger are touched directly"
    VALID = [
        "from infrarsi import probe\np = probe.from_env()\np.log(1, loss=0.5, grad_norm=1.0)\np.close()\n",
        "import os\nout = os.path.join('runs', 'receipts.txt')\n",
        "print('results are in .infrarsi_cache_free_dir')\n",
    ]
    INVALID = [
        "import os\npath = os.environ['INFRARSI_RECEIPTS']\nopen(path, 'a').write('{}')\n",
        "from pathlib import Path\nPath('.infrarsi/ledger.db').unlink()\n",
        'from infrarsi import probe\np = probe.from_env()\np._file.write(\'{"type": "step"}\')\n',
        "from infrarsi import probe\np = probe.from_env()\np._write({'type': 'step', 'step': 1})\n",
        "from infrarsi.ledger import Ledger\n",
        "import infrarsi.runner._receipts\n",
        "from infrarsi.runner import LocalExecutor\n",
        "from infrarsi import probe\np = probe.from_env()\ngetattr(p, '_fi' + 'le').write('{}')\n",
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = []
        for node in source.of_type(cst.SimpleString, cst.FormattedString, cst.ConcatenatedString):
            if isinstance(source.parent.get(node), cst.ConcatenatedString):
                continue
            text = string_value(node) or ""
            if "INFRARSI_RECEIPTS" in text:
                findings.append(self.finding(source, node, "reads INFRARSI_RECEIPTS, the probe's receipt file"))
            elif _WORKSPACE_DIR.search(text):
                findings.append(
                    self.finding(
                        source,
                        node,
                        f"names the workspace's .infrarsi/ folder ({text!r}): the ledger, keys and receipts live there",
                    )
                )
        for node in source.of_type(cst.Attribute):
            if (
                node.attr.value.startswith("_")
                and not node.attr.value.startswith("__")
                and source.probe_object(node.value)
            ):
                findings.append(
                    self.finding(
                        source,
                        node,
                        f"`{source.code(node)}` reaches into the probe's "
                        "internals (receipts must go through p.step / p.log)",
                    )
                )
        for call in source.of_type(cst.Call):  # getattr(p, "_fi" + "le"): the same reach, spelled at run time
            args = call_args(call)
            if len(args) >= 2 and source.resolves_to(call.func, "builtins.getattr") and source.probe_object(args[0]):
                name = const_str(source, args[1]) or ""
                if name.startswith("_") and not name.startswith("__"):
                    findings.append(
                        self.finding(
                            source,
                            call,
                            f"`{source.code(call)}` reaches into the probe's "
                            "internals (receipts must go through p.step / p.log)",
                        )
                    )
        reported = set()
        for node, real, _ in source.imports():
            module = real.rsplit(".", 1)[0] if isinstance(node, cst.ImportFrom) else real
            hit = module if _internal(module) else real.removesuffix(".*")
            if _internal(hit) and id(node) not in reported:
                reported.add(id(node))
                findings.append(
                    self.finding(
                        source,
                        node,
                        f"imports `{hit}`: the framework's ledger, verifiers and internals are not the job's to touch",
                    )
                )
        return findings


RULE = ReceiptsTouched()
