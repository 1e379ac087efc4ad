"""`infrarsi report` end to end: a real search's ledger read back as Markdown and HTML,
the HTML opened in a real headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from infrarsi._report._document import Document
from infrarsi.examples.landscape import Landscape, make_workspace

# Beside other tests (the parallel pass): its jobs sleep (a landscape, `timing_sensitive = false`),
# so an A/B resolves on a busy machine; steps of 60 ms keep a scheduler hiccup a small part of one.

CLI = [sys.executable, "-m", "infrarsi.cli"]
PATIENCE_S = 300  # a safety net against a hang, never a performance assertion
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _cli(*args, cwd: Path):
    done = subprocess.run(CLI + list(args), cwd=cwd, capture_output=True, text=True, timeout=PATIENCE_S)
    payload = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else None
    return done, payload


def _landscape() -> Landscape:
    """`fast` alone runs out of memory (`saver` rescues it); `threads=2` crashes beside `tidy`."""
    return Landscape(
        name="report-fixture",
        patches=["tidy"],
        knobs={"fast": (["0", "1"], "0"), "saver": (["0", "1"], "0"), "threads": (["1", "2"], "1")},
        base_ms=60.0,
        base_mb=70.0,
        limit_mb=130.0,
        noise=0.01,
        time={"fast=1": 0.5, "saver=1": 1.04, "threads=2": 0.97, "+tidy": 0.98},
        memory={"fast=1": 60.0, "saver=1": -40.0},
        crash=["threads=2&+tidy"],
    )


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> Path:
    """init, baseline, a search, and one `verify` of a candidate with a patch (so a diff is shown)."""
    root = make_workspace(tmp_path_factory.mktemp("report") / "ws", _landscape(), ab_pairs=2, starts=1)
    for verb in (["init"], ["baseline", "--runs", "3"], ["search", "--budget", "18"]):
        done, _ = _cli(*verb, "--json", cwd=root)
        assert done.returncode in (0, 1), done.stderr
    done, out = _cli("verify", "--set", "fast=1", "--set", "saver=1", "--patch", "tidy", "--json", cwd=root)
    assert done.returncode in (0, 1), done.stderr
    return root


def _receipts(root: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (root / ".infrarsi" / "receipts").glob("*.json")}


def test_report_shows_every_receipt_with_its_checks_diff_and_costs(searched, tmp_path):
    out_dir = tmp_path / "rep"
    done, out = _cli("report", "--out", str(out_dir), "--json", cwd=searched)
    assert done.returncode == 0, done.stderr
    receipts = _receipts(searched)
    assert receipts, "the fixture's search promoted nothing: no receipt to report"
    assert {p["receipt"] for p in out["promoted"]} == set(receipts)
    assert out["chain_ok"] is True and out["bad_receipts"] == []
    with sqlite3.connect(searched / ".infrarsi" / "ledger.db") as db:
        assert out["executions"] == db.execute("select count(*) from executions").fetchone()[0]
        by_status = dict(db.execute("select status, count(*) from executions group by status"))
    md = Path(out["markdown"]).read_text()
    for section in (
        "## Baseline diagnosis",
        "## Promoted candidates",
        "## The search",
        "### Crashes and timeouts",
        "### Incompatibilities found",
        "## Resource ledger",
        "## Honest limits",
    ):
        assert section in md
    for rid, receipt in receipts.items():
        body = receipt["receipt"]
        assert f"### Receipt {rid}: {body['speedup']['median']:.3f}x" in md
        for check in body["checks"]:
            assert f"| {check['id']} | {check['status']} |" in md
    # The diff itself, readable, from the ledger's blob of the patch.
    assert "+ON = True" in md and "-ON = False" in md
    # Failures are reported, not hidden: the crash with its reason, the OOMs, the incompatibility.
    assert by_status.get("crash") and "cannot be combined" in md
    assert by_status.get("oom") and f"{by_status['oom']} run(s) out of memory" in md
    assert "incompatible: `tidy + threads=2`" in md
    assert "say nothing about full-run convergence" in md
    assert re.search(r"paid back after about \*\*[\d,]+ training steps\*\*", md)
    # Plots beside the Markdown, as files it links.
    for plot in out["plots"]:
        assert Path(plot).stat().st_size > 1000 and Path(plot).read_text().startswith("<svg")
        assert f"(plots/{Path(plot).name})" in md


def test_the_html_page_is_self_contained(searched, tmp_path):
    done, out = _cli("report", "--out", str(tmp_path / "rep"), "--json", cwd=searched)
    assert done.returncode == 0, done.stderr
    page = Path(out["html"]).read_text()
    # Two plots of the search, and one of each receipt's A/B as its pairs accumulated.
    assert page.count("<svg") == 2 + len(_receipts(searched)) and "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|file:)""", page), "the page must fetch nothing"
    assert "Content-Security-Policy" in page


def test_the_report_opens_in_headless_chromium_without_console_errors(searched, tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have Debian's chromium (.ci/run installs it)")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    done, out = _cli("report", "--out", str(tmp_path / "rep"), "--json", cwd=searched)
    assert done.returncode == 0, done.stderr
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.on(
                "console",
                lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None,
            )
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on(
                "request",
                lambda r: problems.append(f"fetched {r.url}") if not r.url.startswith(("file:", "data:")) else None,
            )
            page.goto(Path(out["html"]).as_uri())
            page.wait_for_load_state("load")
            for name in ("best-so-far", "memory-speed"):
                box = page.locator(f"#plot-{name} svg").bounding_box()
                assert box and box["width"] > 200 and box["height"] > 100, (name, box)
            assert page.locator("h2", has_text="Promoted candidates").is_visible()
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert (ARTIFACTS / "report.png").stat().st_size > 10_000


def test_a_tampered_ledger_or_forged_receipt_is_reported_and_exits_1(searched, tmp_path):
    copy = tmp_path / "ws"
    shutil.copytree(searched, copy)
    # A forged receipt beside the ledger: a better speedup, an id and signature that don't fit.
    original = next(iter(_receipts(copy).values()))
    forged = json.loads(json.dumps(original))
    forged["receipt"]["speedup"]["median"] = 9.0
    forged["id"] = "f" * 16
    (copy / ".infrarsi" / "receipts" / f"{forged['id']}.json").write_text(json.dumps(forged))
    done, out = _cli("report", "--json", cwd=copy)
    assert done.returncode == 1, done.stderr
    assert [b["receipt"] for b in out["bad_receipts"]] == [forged["id"]]
    assert all(p["speedup"]["median"] != 9.0 for p in out["promoted"])
    md = Path(out["markdown"]).read_text()
    assert "do not verify** and are not shown" in md and f"Receipt {forged['id']}" not in md
    # An execution row edited in place (the append-only trigger dropped first).
    with sqlite3.connect(copy / ".infrarsi" / "ledger.db") as db:
        db.execute("drop trigger executions_no_update")
        db.execute("update executions set device_s = device_s + 1 where id = 2")
    done, out = _cli("report", "--json", cwd=copy)
    assert done.returncode == 1 and out["chain_ok"] is False
    assert "DO NOT VERIFY" in Path(out["markdown"]).read_text()


def test_a_ledger_with_only_a_baseline_reports_nothing_promoted(tmp_path):
    root = make_workspace(tmp_path / "ws", _landscape())
    for verb in (["init"], ["baseline", "--runs", "2"]):
        done, _ = _cli(*verb, "--json", cwd=root)
        assert done.returncode == 0, done.stderr
    done, out = _cli("report", "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    assert out["promoted"] == [] and out["executions"] == 3  # two timed runs and the reference run
    md = Path(out["markdown"]).read_text()
    assert "No candidate holds a verified receipt" in md and "Net: no promoted candidate" in md
    assert Path(out["html"]).is_file() and len(out["plots"]) == 2


def test_no_ledger_is_a_usage_error(tmp_path):
    root = make_workspace(tmp_path / "ws", _landscape())
    done, out = _cli("report", "--json", cwd=root)
    assert done.returncode == 2 and "no ledger here" in out["error"] and "Traceback" not in done.stderr
    done, out = _cli("report", "--ledger", str(tmp_path / "nope.db"), "--json", cwd=root)
    assert done.returncode == 2 and "nope.db" in out["error"]


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=60), st.lists(st.text(max_size=20), max_size=4))
def test_document_text_never_escapes_into_markup(text, cells):
    doc = Document(text)
    doc.heading(text)
    doc.para(text)
    doc.bullets([text])
    doc.table(["h"] + cells, [[text] + cells])
    doc.code(text)
    page = doc.html()
    body = page.split("<body>", 1)[1]
    # Whatever the text holds, the only tags are the ones the document writes.
    tags = set(re.findall(r"<\s*/?\s*([a-zA-Z0-9]+)", body))
    assert tags <= {
        "h1",
        "h2",
        "p",
        "ul",
        "li",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "pre",
        "code",
        "strong",
        "body",
        "html",
    }
    md = doc.markdown("plots")
    assert md.endswith("\n")


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="`~\n ab", max_size=40), st.text(max_size=30))
def test_a_code_block_keeps_its_text_inside_the_fence(code, title):
    doc = Document(title)
    doc.heading(title)
    doc.code(code)
    lines = doc.markdown("plots").split("\n")
    assert lines[0].startswith("# ") and lines[1] == ""  # the title stays one line
    opener = next(i for i, line in enumerate(lines) if line.startswith("```"))
    fence = lines[opener]
    closer = next(i for i in range(opener + 1, len(lines)) if lines[i].lstrip(" ").startswith(fence))
    # The block closes where the document closes it: after every line of the code.
    assert lines[opener + 1 : closer] == code.rstrip("\n").split("\n")
