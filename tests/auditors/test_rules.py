"""Every rule's own VALID / INVALID examples, run automatically, plus the registry's promises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from infrarsi.auditors import RULES, AuditContext, SourceError, SourceModel, audit_diff, audit_source
from infrarsi.auditors._rule import as_example

CASES = [
    (rule_id, kind, i, as_example(item))
    for rule_id, rule in RULES.items()
    for kind, items in (("VALID", rule.VALID), ("INVALID", rule.INVALID))
    for i, item in enumerate(items)
]


def _run(rule_id, example):
    baseline = SourceModel(example.baseline, "baseline.py") if example.baseline is not None else None
    ctx = AuditContext(example.precision, example.protected, baseline)
    return RULES[rule_id].check(SourceModel(example.code, "example.py"), ctx)


@pytest.mark.parametrize("rule_id,kind,i,example", CASES, ids=[f"{r}-{k}-{i}" for r, k, i, _ in CASES])
def test_rule_example(rule_id, kind, i, example):
    found = _run(rule_id, example)
    if kind == "VALID":
        assert not found, [str(f) for f in found]
    else:
        assert found, f"{rule_id} INVALID[{i}] ({example.note}) was not flagged:\n{example.code}"
        assert all(f.rule == rule_id and f.line >= 1 and f.col >= 1 and f.message for f in found)


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_every_rule_has_examples_both_ways_and_a_message(rule_id):
    rule = RULES[rule_id]
    assert rule.message and len(rule.VALID) >= 2 and len(rule.INVALID) >= 2
    assert (rule.__doc__ or type(rule).__module__) and rule.id == rule_id


def test_the_issue_rules_are_all_there():
    assert set(RULES) >= {
        "timing_boundary",
        "clock_patched",
        "probe_shadowed",
        "receipts_touched",
        "measured_detection",
        "framework_write",
        "precision_downgrade",
        "step_skip",
        "cached_result",
        "dynamic_code",
        "monkeypatch",
        "introspection",
    }


def test_aliases_resolve():
    """`import time as t` and `clip_grad_norm_ as clip` are seen through."""
    src = SourceModel(
        "import time as t\nfrom torch.nn.utils import clip_grad_norm_ as clip\nt.perf_counter()\nclip(params, 1.0)\n"
    )
    calls = [n for n in src.nodes if type(n).__name__ == "Call"]
    assert src.resolves_to(calls[0], "time.perf_counter")
    assert src.resolves_to(calls[1], "torch.nn.utils.clip_grad_norm_")
    assert audit_source("import time as t\nt.perf_counter = lambda: 0\n")[0].rule == "clock_patched"


def test_diff_audit_reports_only_what_the_patch_adds():
    base = "import torch\nmodel = model.half()\n"
    assert [f.rule for f in audit_source(base)] == ["precision_downgrade"]
    assert audit_diff(base, base + "x = 1\n") == []
    assert [f.rule for f in audit_diff(base, base + "other = other.half()\n")] == ["precision_downgrade"]


def test_a_file_that_does_not_parse_is_a_clear_error():
    with pytest.raises(SourceError, match=r"train\.py:\d+:\d+: not valid Python"):
        SourceModel("def f(:\n", "train.py")


_SNIPPETS = [e.code for _, _, _, e in CASES]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_SNIPPETS), st.integers(0, 400), st.integers(0, 30), st.text(max_size=8))
def test_mangled_sources_never_crash_the_audit(snippet, at, cut, junk):
    """Any text: either a SourceError (a clear message) or a list of findings, never a traceback."""
    text = snippet[:at] + junk + snippet[at + cut :]
    try:
        findings = audit_diff(snippet, text, "fuzz.py", ("fp32",), ("data/**",))
    except SourceError as exc:
        assert "fuzz.py" in str(exc)
    else:
        assert all(f.path == "fuzz.py" for f in findings)


def test_audit_rules_doc_is_generated_from_the_rules():
    from pathlib import Path

    from infrarsi.auditors._docs import audit_rules_reference

    doc = Path(__file__).parents[2] / "docs" / "audit-rules.md"
    assert doc.read_text() == audit_rules_reference(), "run: python -m infrarsi.auditors._docs > docs/audit-rules.md"
