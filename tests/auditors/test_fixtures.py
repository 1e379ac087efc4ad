"""Training-script fixtures through the source auditor: honest styles stay clean, planted cheats are caught.

Each folder under fixtures/ is one way people really write training loops (a nanoGPT-style
single file, a class-based trainer, gradient accumulation, bf16 AMP, DDP with no_sync). Its
``honest*.py`` files must produce no findings at all; each ``planted_<what>.py`` is a copy of an
honest file with one cheat planted and must trigger the rule ids listed in ``cases.toml``.
Fixtures are parsed, never executed.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

try:
    from infrarsi.auditors import RULES, audit_diff, audit_source
except ImportError as exc:  # the auditor API is not there (yet): static checks still run
    RULES = audit_diff = audit_source = None
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

FIXTURES = Path(__file__).parent / "fixtures"
MANIFEST = FIXTURES / "cases.toml"
DEFAULT_PRECISION = ("fp32",)
# The rule modules this corpus was written against; RULES must know every id a case expects.
KNOWN_RULES = {
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
DIFF_ONLY_RULES = {"timing_boundary"}  # skipped by audit_source, which has no baseline


def _load_cases() -> list[dict]:
    return tomllib.loads(MANIFEST.read_text(encoding="utf-8"))["case"]


CASES = _load_cases()


def _case_id(case: dict, seen: set[str]) -> str:
    base = case["file"] + ("-vs-baseline" if case.get("against") else "")
    if base in seen:  # the same file under another contract
        base += "-" + "+".join(case.get("precision", DEFAULT_PRECISION))
    seen.add(base)
    return base


_seen: set[str] = set()
CASE_IDS = [_case_id(case, _seen) for case in CASES]


def _is_planted(file: str) -> bool:
    return Path(file).name.startswith("planted_")


def _read(rel: str) -> str:
    return (FIXTURES / rel).read_text(encoding="utf-8")


def _describe(findings) -> str:
    if not findings:
        return "  (no findings)"
    return "\n".join(f"  {f.line}:{f.col} {f.rule} {f.message}" for f in findings)


def _require_auditor() -> None:
    if _IMPORT_ERROR is not None:
        pytest.fail(f"infrarsi.auditors does not provide audit_source/audit_diff/RULES: {_IMPORT_ERROR}")


# -- the auditor on every case ------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_case(case: dict):
    _require_auditor()
    precision = tuple(case.get("precision", DEFAULT_PRECISION))
    protected = tuple(case.get("protected", ()))
    # The script is audited as if it sat at the workspace root (as train.py does), so a path
    # built from its own folder, like HERE / "data" / "train.bin", is data/train.bin there.
    path = Path(case["file"]).name
    patched = _read(case["file"])
    if case.get("against"):
        findings = audit_diff(_read(case["against"]), patched, path=path, precision=precision, protected=protected)
    else:
        findings = audit_source(patched, path=path, precision=precision, protected=protected)
    expect = case["expect"]
    where = f"{case['file']}" + (f" against {case['against']}" if case.get("against") else "")
    if not expect:
        assert not findings, f"{where}: expected no findings, got:\n{_describe(findings)}"
    else:
        missing = sorted(set(expect) - {f.rule for f in findings})
        assert not missing, f"{where}: expected {missing} among the findings, got:\n{_describe(findings)}"


def test_every_rule_is_exercised_by_a_planted_case():
    _require_auditor()
    planted_expect = {rule for case in CASES if _is_planted(case["file"]) for rule in case["expect"]}
    missing = sorted(set(RULES) - planted_expect)
    assert not missing, f"rules no planted fixture triggers: {missing}"


def test_every_expected_rule_exists():
    _require_auditor()
    unknown = sorted({rule for case in CASES for rule in case["expect"]} - set(RULES))
    assert not unknown, f"cases expect rule ids the auditor does not have: {unknown}"


# -- the corpus itself (no auditor needed) --------------------------------------------------------


def test_manifest_loads_and_has_the_expected_shape():
    assert CASES, "cases.toml has no [[case]] tables"
    allowed = {"file", "against", "precision", "protected", "expect", "note"}
    for case in CASES:
        assert set(case) <= allowed, (case["file"], sorted(set(case) - allowed))
        assert isinstance(case["expect"], list), case
        assert (FIXTURES / case["file"]).is_file(), case["file"]
        if case.get("against"):
            assert (FIXTURES / case["against"]).is_file(), case["against"]
            assert Path(case["against"]).name.startswith("honest"), f"{case['file']}: baseline must be honest"
            assert Path(case["against"]).parent == Path(case["file"]).parent, case
        assert set(case["expect"]) <= KNOWN_RULES, (case["file"], case["expect"])
        if not case.get("against"):
            assert not set(case["expect"]) & DIFF_ONLY_RULES, f"{case['file']}: timing_boundary needs a baseline"
    assert len(set(CASE_IDS)) == len(CASE_IDS)


def test_every_fixture_file_is_referenced_by_a_case():
    referenced = {case["file"] for case in CASES} | {case["against"] for case in CASES if case.get("against")}
    on_disk = {p.relative_to(FIXTURES).as_posix() for p in FIXTURES.rglob("*.py")}
    assert on_disk - referenced == set(), f"fixtures no case uses: {sorted(on_disk - referenced)}"


def test_every_fixture_parses_as_python_311():
    files = sorted(FIXTURES.rglob("*.py"))
    assert files
    for file in files:
        ast.parse(file.read_text(encoding="utf-8"), filename=str(file), feature_version=(3, 11))


def test_honest_and_planted_cases_follow_the_corpus_rules():
    by_file: dict[str, list[dict]] = {}
    for case in CASES:
        by_file.setdefault(case["file"], []).append(case)
    for file, cases in by_file.items():
        name = Path(file).name
        standalone = [c for c in cases if not c.get("against")]
        diffed = [c for c in cases if c.get("against")]
        if name.startswith("honest"):
            assert any(c["expect"] == [] for c in standalone), f"{file}: honest file needs a clean standalone case"
            assert all(c["expect"] == [] for c in diffed), f"{file}: honest against a baseline must stay clean"
        else:
            assert _is_planted(file), f"{file}: fixture names start with honest or planted_"
            assert len(diffed) == 1 and diffed[0]["expect"], f"{file}: needs one case against its honest file"
            if set(diffed[0]["expect"]) - DIFF_ONLY_RULES:
                assert standalone and all(c["expect"] for c in standalone), f"{file}: needs a standalone case"
                assert set(diffed[0]["expect"]) - DIFF_ONLY_RULES <= {r for c in standalone for r in c["expect"]}
            assert (FIXTURES / file).read_text() != (FIXTURES / diffed[0]["against"]).read_text()


def test_every_rule_is_planted_in_at_least_two_styles():
    styles: dict[str, set[str]] = {}
    for case in CASES:
        if _is_planted(case["file"]):
            for rule in case["expect"]:
                styles.setdefault(rule, set()).add(Path(case["file"]).parent.as_posix())
    thin = {rule: sorted(s) for rule, s in styles.items() if len(s) < 2}
    assert set(styles) == KNOWN_RULES and not thin, (sorted(KNOWN_RULES - set(styles)), thin)
