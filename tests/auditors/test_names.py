"""The audit's qualified-name resolver agrees with libcst's QualifiedNameProvider."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, QualifiedNameSource

from infrarsi.auditors import RULES, SourceModel
from infrarsi.auditors._rule import as_example

FIXTURES = Path(__file__).parent / "fixtures"
TINYGPT = Path(__file__).parents[2] / "examples" / "tinygpt"
SOURCES = sorted(FIXTURES.rglob("*.py")) + [TINYGPT / "train.py", TINYGPT / "model.py"]
SNIPPETS = [as_example(e).code for rule in RULES.values() for e in (*rule.VALID, *rule.INVALID)]


class _Reference(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.names: dict[cst.CSTNode, set[str]] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Name, cst.Attribute)):
            found = self.get_metadata(QualifiedNameProvider, node, set())
            # libcst names `super().x` just `builtins.super`; only what imports resolve is compared.
            imported = {q.name for q in found if q.source is QualifiedNameSource.IMPORT}
            if imported and len(imported) == len(found):
                self.names[node] = imported
        return True


def _compare(text: str) -> list[str]:
    model = SourceModel(text, "x.py")
    reference = _Reference()
    MetadataWrapper(model.module, unsafe_skip_copy=True).visit(reference)
    return [
        f"{model.code(node)!r}: libcst {sorted(want)}, ours {sorted(model.qnames(node))}"
        for node, want in reference.names.items()
        if model.qnames(node) != want
    ]


@pytest.mark.parametrize(
    "path", SOURCES, ids=[p.name if p.parent.name == "tinygpt" else f"{p.parent.name}/{p.name}" for p in SOURCES]
)
def test_agrees_with_libcst_on_imported_names(path):
    assert _compare(path.read_text()) == []


def test_agrees_on_every_rule_example():
    assert [m for text in SNIPPETS for m in _compare(text)] == []


def test_shadowing_by_scope():
    model = SourceModel("import time\ndef f(time):\n    return time.perf_counter()\ntime.perf_counter()\n")
    calls = model.of_type(cst.Call)
    assert model.qnames(calls[0]) == set() and model.qnames(calls[1]) == {"time.perf_counter"}
    builtin = SourceModel("x = len([])\n")
    assert builtin.qnames(builtin.of_type(cst.Call)[0]) == {"builtins.len"}
