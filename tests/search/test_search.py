"""`infrarsi search` end to end: real executions of a cheap synthetic job through the runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from chat_server import ChatServer, Reply
from hypothesis import given, settings, strategies as st
from ledger_rows import rows as ledger_rows

from infrarsi._receipt import verify_receipt
from infrarsi._search._pack import PACK_VERSION, validate_pack
from infrarsi.errors import UsageError
from infrarsi.examples.landscape import Landscape, make_workspace

# Beside other tests (the parallel pass): the landscape's job sleeps, so a test beside it moves
# both arms of an A/B alike, as in tests/search/test_search_convergence.py, which promotes there too.

CLI = [sys.executable, "-m", "infrarsi.cli"]
PATIENCE_S = 300  # a safety net against a hang, never a performance assertion


def _cli(*args, cwd: Path, env: dict | None = None, check_json: bool = True):
    done = subprocess.run(
        CLI + list(args), cwd=cwd, capture_output=True, text=True, timeout=PATIENCE_S, env={**os.environ, **(env or {})}
    )
    payload = json.loads(done.stdout.splitlines()[-1]) if check_json and done.stdout.strip() else None
    return done, payload


def _workspace(tmp_path: Path, land: Landscape, **kw) -> Path:
    root = make_workspace(tmp_path / land.name, land, **kw)
    for verb in (["init"], ["baseline", "--runs", "3"]):
        done, _ = _cli(*verb, "--json", cwd=root)
        assert done.returncode == 0, done.stderr
    return root


def _assert_best_is_receipted(out: dict, root: Path) -> None:
    """`best` is only ever a candidate whose receipt verifies, with every required check passing."""
    if out["best"] is None:
        return
    receipt = Path(out["best"]["receipt"])
    check = verify_receipt(receipt)
    assert check.ok, check.problems
    body = json.loads(receipt.read_text())["receipt"]
    statuses = {c["id"]: c["status"] for c in body["checks"]}
    assert all(statuses.get(cid) == "pass" for cid in body["required_checks"])
    assert body["candidate"] == {"knobs": out["best"]["knobs"], "patches": out["best"]["patches"]}
    assert out["best"] in out["promoted"]


def rescue_landscape() -> Landscape:
    """`fast` alone runs out of memory; only with `saver` (slightly slower, less memory) does it fit."""
    return Landscape(
        name="rescue",
        patches=["tidy"],
        knobs={"fast": (["0", "1"], "0"), "saver": (["0", "1"], "0"), "threads": (["1", "2"], "1")},
        base_ms=20.0,
        base_mb=70.0,
        limit_mb=130.0,
        noise=0.01,
        time={"fast=1": 0.5, "saver=1": 1.04, "threads=2": 0.97, "+tidy": 0.98},
        memory={"fast=1": 60.0, "saver=1": -40.0},
    )


def test_partner_search_rescues_an_out_of_memory_candidate(tmp_path):
    # One start (the baseline): the search has to meet the cliff before it meets the answer.
    root = _workspace(tmp_path, rescue_landscape(), ab_pairs=2, starts=1)
    done, out = _cli("search", "--budget", "18", "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    statuses = {h["execution"]: (h["status"], h["knobs"]) for h in out["history"]}
    assert any(s == "oom" and k["fast"] == "1" and k["saver"] == "0" for s, k in statuses.values()), out["history"]
    assert out["rescued"], out["history"]
    rescue = out["rescued"][0]
    assert "saver=1" in rescue["rescued_by"] and rescue["knobs"]["fast"] == "1"
    assert statuses[rescue["oom_execution"]][0] == "oom" and statuses[rescue["execution"]][0] == "ok"
    # The result is the rescued combination, with its receipt; the OOM stays in the ledger.
    assert out["best"]["knobs"]["fast"] == "1" and out["best"]["knobs"]["saver"] == "1"
    # Designed at 2x; two pairs on a busy machine have put the lower bound at 1.39.
    assert out["best"]["speedup"]["ci_low"] > 1.2
    _assert_best_is_receipted(out, root)
    rows = ledger_rows(root)
    assert (
        out["executions"]
        == sum(1 for r in rows if r["batch"].startswith(f"search-{out['search']}") and r["kind"] != "proposal")
        <= 18
    )
    assert out["cost"]["device_s"] == pytest.approx(
        sum(r["device_s"] for r in rows if r["batch"].startswith(f"search-{out['search']}")), abs=1e-3
    )
    assert out["cost"]["by_status"].get("search:oom", 0) >= 1
    # How much of the space was tried, and why it stopped where it did.
    cover = out["coverage"]
    assert cover["points"] >= cover["tried"] >= 3 and cover["untried"] == cover["points"] - cover["tried"]
    assert cover["budget"] == 18 and cover["budget_left"] == 18 - out["executions"]
    assert cover["exploration_stopped"] == "the exploration budget was spent" or cover[
        "exploration_stopped"
    ].startswith("no untried point was worth a run"), cover
    assert cover["promotion"].startswith(("promote_top = ", "every candidate the models rank", "the budget left"))
    assert out["catalog"] == []  # the landscape's contract asks for its own patches only
    # A pack of what this ledger verified.
    pack_path = tmp_path / "rescue-pack.json"
    done, exported = _cli("pack", "export", "--out", str(pack_path), "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    pack = json.loads(pack_path.read_text())
    assert exported["findings"] == 1 and pack["findings"][0]["knobs"] == out["best"]["knobs"]
    assert any(r["status"] == "oom" for r in pack["runs"]) and pack["hardware"]

    # A related workload (slower, other hardware): the pack's finding is a starting point.
    related = rescue_landscape()
    related.name, related.base_ms = "rescue-related", 28.0
    other = _workspace(tmp_path, related, ab_pairs=2)
    done, out2 = _cli("search", "--budget", "14", "--pack", str(pack_path), "--json", cwd=other)
    # (Its promotion is not what this part tests: on a loaded machine a 28 ms A/B may fail its clock check.)
    assert done.returncode in (0, 1) and out2 is not None, done.stderr
    first = out2["history"][0]
    assert first["origin"] == "start:pack" and first["knobs"] == out["best"]["knobs"], out2["history"]
    _assert_best_is_receipted(out2, other)


def test_a_patch_that_does_nothing_once_a_knob_is_on_is_dropped_before_promotion(tmp_path):
    """The issue's winner that carried dead code. `mask` pays alone (0.9x) and is dead once `fast`
    is on (8% slower there). A pack from another machine, where the two together ran at 0.3x,
    makes the speed model rank {fast, mask} first; promotion measures it without `mask`
    (a run exploration made, or one ablation run), drops the patch, and the receipt and `best`
    vouch for `fast` alone."""
    land = Landscape(
        name="deadcode",
        patches=["mask"],
        knobs={"fast": (["0", "1"], "0")},
        base_ms=60.0,  # 30 ms steps with `fast`: a scheduler hiccup is a small part of one
        base_mb=60.0,
        limit_mb=400.0,
        noise=0.01,
        time={"fast=1": 0.5, "+mask": 0.9, "fast=1&+mask": 1.08 / 0.9},
    )
    pack = {
        "kind": "infrarsi-pack",
        "version": PACK_VERSION,
        "findings": [{"knobs": {"fast": "1"}, "patches": ["mask"], "speedup": {"median": 3.3}}],
        "runs": [
            {"knobs": {"fast": "0"}, "patches": ["mask"], "status": "ok", "time_ratio": 0.9},
            {"knobs": {"fast": "1"}, "patches": ["mask"], "status": "ok", "time_ratio": 0.3},
        ],
    }
    pack_path = tmp_path / "pack.json"
    pack_path.write_text(json.dumps(pack))
    root = _workspace(tmp_path, land, ab_pairs=2, starts=2)
    done, out = _cli("search", "--budget", "8", "--pack", str(pack_path), "--json", cwd=root)
    assert done.returncode == 0, (done.stderr, out)
    history = [(h["origin"], h["knobs"], h["patches"]) for h in out["history"]]
    assert ("start:pack", {"fast": "1"}, ["mask"]) in history, history
    first = out["attempts"][0]
    assert [d["dropped"] for d in first["dropped"]] == ["mask"], (
        [(a["knobs"], a["patches"], a["dropped"]) for a in out["attempts"]],
        [(h["origin"], h["knobs"], h["patches"], h["status"], h["speedup"]) for h in out["history"]],
    )
    assert "does not pay" in first["dropped"][0]["why"]
    assert first["accepted"] and first["patches"] == [] and first["knobs"] == {"fast": "1"}, first
    assert out["best"]["patches"] == [] and out["best"]["knobs"] == {"fast": "1"}
    _assert_best_is_receipted(out, root)
    # What it was measured against without the patch is a real run of {fast}, in the ledger.
    assert any(h["knobs"] == {"fast": "1"} and h["patches"] == [] and h["status"] == "ok" for h in out["history"])


def test_a_fast_candidate_that_changes_the_job_is_never_best(tmp_path):
    """The only real speedup changes the loss: rejected when explored, never promoted, no best."""
    land = Landscape(
        name="cheat",
        patches=["skip-work"],
        knobs={"threads": (["1", "2"], "1")},
        base_ms=20.0,
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"+skip-work": 0.5, "threads=2": 1.01},
        loss={"+skip-work": 1.05},
    )
    root = _workspace(tmp_path, land, ab_pairs=2)
    done, out = _cli("search", "--budget", "8", "--json", cwd=root)
    assert done.returncode == 1, done.stderr
    assert out["best"] is None and out["promoted"] == []
    cheats = [h for h in out["history"] if "skip-work" in h["patches"]]
    assert cheats and all(h["status"] == "rejected" for h in cheats)
    assert any(i["atoms"] == ["+skip-work"] and i["learned"] for i in out["incompatibilities"])
    failed = [json.loads(r["verdicts"]) for r in ledger_rows(root) if r["status"] == "rejected"]
    assert all(any(v["id"] == "numerics.loss" and v["status"] == "fail" for v in vs) for vs in failed)
    assert not list((root / ".infrarsi" / "receipts").glob("*.json"))


def test_resume_after_sigkill_repeats_nothing_and_loses_nothing(tmp_path):
    land = Landscape(
        name="resume",
        patches=["a", "b"],
        knobs={"x": (["0", "1", "2"], "0"), "y": (["0", "1"], "0")},
        base_ms=60.0,
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"x=1": 0.8, "x=2": 0.9, "y=1": 0.95, "+a": 0.9, "+b": 1.02, "x=1&+a": 0.9},
    )
    root = _workspace(tmp_path, land, ab_pairs=2)
    budget = 16
    proc = subprocess.Popen(
        CLI + ["search", "--budget", str(budget), "--json"],
        cwd=root,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + PATIENCE_S
    while sum(1 for r in ledger_rows(root) if r["kind"] == "search") < 4:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = ledger_rows(root)
    journal = list((root / ".infrarsi" / "search").glob("*.inflight.json"))

    done, out = _cli("search", "--resume", "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    assert out["resumed"] is True
    after = ledger_rows(root)
    # Nothing recorded before the kill is lost or changed; the chain verifies.
    assert after[: len(before)] == before
    audit, report = _cli("audit", str(root / ".infrarsi" / "ledger.db"), "--json", cwd=root)
    assert audit.returncode == 0 and report["chain_ok"], audit.stdout
    # The execution the kill cut off (if one was running) is a crash row, with its device time.
    cut = [r for r in after[len(before) :] if r["status"] == "crash" and r["detail"].startswith("interrupted")]
    assert len(cut) == len(journal) <= 1
    # No finished exploration point was run twice, and the budget held across both processes.
    explored = [
        (r["knobs"], r["patches"]) for r in after if r["kind"] == "search" and not r["detail"].startswith("interrupted")
    ]
    keys = [json.dumps([json.loads(k), [p["name"] for p in json.loads(p)]], sort_keys=True) for k, p in explored]
    assert len(keys) == len(set(keys)), keys
    launched = [r for r in after if r["batch"].startswith(f"search-{out['search']}") and r["kind"] != "proposal"]
    assert len(launched) == out["executions"] <= budget
    _assert_best_is_receipted(out, root)
    assert out["best"] is not None
    # A finished search cannot be resumed again.
    done, err = _cli("search", "--resume", "--json", cwd=root)
    assert done.returncode == 2 and "finished" in err["error"]


GOOD_DIFF = textwrap.dedent("""\
    diff --git a/switches/turbo.py b/switches/turbo.py
    --- a/switches/turbo.py
    +++ b/switches/turbo.py
    @@ -1 +1 @@
    -ON = False
    +ON = True
    """)
UNSAFE = textwrap.dedent("""\
    diff --git a/switches/tidy.py b/switches/tidy.py
    --- a/switches/tidy.py
    +++ b/switches/tidy.py
    @@ -1 +1,4 @@
    -ON = False
    +import time
    +
    +time.perf_counter = lambda: 0.0
    +ON = False
    """)
OUT_OF_SCOPE = textwrap.dedent("""\
    diff --git a/train.py b/train.py
    --- a/train.py
    +++ b/train.py
    @@ -1,1 +1,1 @@
    -\"\"\"A synthetic training job: its step time and memory come from landscape.json.\"\"\"
    +\"\"\"Faster.\"\"\"
    """)


def test_llm_proposer_end_to_end_against_a_loopback_endpoint(tmp_path):
    land = Landscape(
        name="llm",
        patches=["tidy"],
        knobs={"threads": (["1", "2"], "1")},
        switches=["turbo"],
        base_ms=20.0,
        base_mb=40.0,
        limit_mb=400.0,
        noise=0.01,
        time={"+turbo": 0.6, "+tidy": 0.97, "threads=2": 0.98},
    )
    reply = (
        f"Turn on the turbo path:\n```diff\n{GOOD_DIFF}```\n"
        f"And simplify the job:\n```diff\n{OUT_OF_SCOPE}```\n"
        f"And a faster clock:\n```diff\n{UNSAFE}```\n"
    )
    with ChatServer([Reply(reply, prompt_tokens=900, completion_tokens=100)]) as server:
        extra = (
            f'llm_base_url = "{server.base_url}"\nllm_model = "scripted-model"\n'
            f"llm_cost_per_1k_tokens = 0.5\nllm_max_proposals = 3\n"
        )
        root = _workspace(tmp_path, land, ab_pairs=2, proposers=("contract", "llm"), extra_search=extra)
        done, out = _cli("search", "--budget", "12", "--json", cwd=root, env={"INFRARSI_LLM_API_KEY": "sk-loopback"})
        requests = list(server.requests)
    assert done.returncode == 0, done.stderr
    assert len(requests) == 1 and requests[0].authorization == "Bearer sk-loopback"
    assert out["cost"]["llm_tokens"] == 1000 and out["cost"]["llm_cost"] == pytest.approx(0.5)
    rows = ledger_rows(root)
    proposals = [r for r in rows if r["kind"] == "proposal"]
    assert sorted(r["status"] for r in proposals) == ["ok", "rejected", "rejected"]
    out_of_scope, unsafe = (r for r in proposals if r["status"] == "rejected")
    assert "scope.protected" in out_of_scope["detail"] and out_of_scope["llm_tokens"] > 0
    assert "audit.clock_patched" in unsafe["detail"] and unsafe["llm_tokens"] > 0
    assert sum(r["llm_tokens"] for r in proposals) == 1000
    assert out["proposals"]["llm:1"] == "llm" and "llm:2" not in out["proposals"] and "llm:3" not in out["proposals"]
    assert not any("llm:3" in h["patches"] for h in out["history"])  # a rejected proposal never runs
    assert "llm:1" in out["best"]["patches"]
    _assert_best_is_receipted(out, root)
    # The key reached the endpoint only: not the ledger, not the workload.
    assert b"sk-loopback" not in (root / ".infrarsi" / "ledger.db").read_bytes()
    # The re-audit re-screens the proposals from the ledger alone and finds nothing to object to.
    audit, report = _cli("audit", str(root / ".infrarsi" / "ledger.db"), "--json", cwd=root)
    assert audit.returncode == 0 and report["findings"] == [], audit.stdout


def test_without_a_key_the_llm_proposer_is_off_with_a_clear_message(tmp_path):
    land = Landscape(
        name="nokey",
        patches=["tidy"],
        knobs={"threads": (["1", "2"], "1")},
        base_ms=20.0,
        base_mb=40.0,
        limit_mb=400.0,
        time={"+tidy": 0.9},
    )
    root = _workspace(
        tmp_path,
        land,
        ab_pairs=2,
        proposers=("contract", "llm"),
        extra_search='llm_base_url = "http://127.0.0.1:9/v1"\nllm_model = "m"\n',
    )
    env = {k: "" for k in ("INFRARSI_LLM_API_KEY", "OPENAI_API_KEY")}
    done, out = _cli("search", "--budget", "7", "--json", cwd=root, env=env)
    assert done.returncode in (0, 1), done.stderr
    assert any("LLM proposer off" in m and "INFRARSI_LLM_API_KEY" in m for m in out["messages"]), out["messages"]
    assert out["cost"]["llm_tokens"] == 0


def test_bad_input_exits_2_with_a_clear_message(tmp_path):
    land = Landscape(
        name="bad", patches=[], knobs={"threads": (["1", "2"], "1")}, base_ms=5.0, base_mb=20.0, limit_mb=400.0
    )
    root = make_workspace(tmp_path / "bad", land, ab_pairs=2)
    _cli("init", "--json", cwd=root)
    done, err = _cli("search", "--json", cwd=root)
    assert done.returncode == 2 and "no baseline" in err["error"]
    _cli("baseline", "--runs", "2", "--json", cwd=root)
    done, err = _cli("search", "--resume", "--json", cwd=root)
    assert done.returncode == 2 and "no search has been started" in err["error"]
    done, err = _cli("search", "--budget", "4", "--json", cwd=root)
    assert done.returncode == 2 and "too small" in err["error"] and "5 executions" in err["error"]
    done, err = _cli("search", "--pack", "missing.json", "--json", cwd=root)
    assert done.returncode == 2 and "missing.json" in err["error"]
    (root / "bad-pack.json").write_text('{"kind": "infrarsi-pack", "version": 1, "findings": [{"knobs": 3}]}')
    done, err = _cli("search", "--pack", "bad-pack.json", "--json", cwd=root)
    assert done.returncode == 2 and "findings[0]" in err["error"]
    assert "Traceback" not in done.stderr


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {
                "kind": st.just("infrarsi-pack"),
                "version": st.just(1),
                "findings": st.lists(
                    st.dictionaries(
                        st.sampled_from(["knobs", "patches", "speedup", "patch_texts"]), json_values, max_size=4
                    ),
                    max_size=3,
                ),
                "runs": st.lists(
                    st.dictionaries(
                        st.sampled_from(["knobs", "patches", "status", "time_ratio"]), json_values, max_size=4
                    ),
                    max_size=3,
                ),
            }
        ),
    )
)
def test_pack_validation_never_raises_anything_but_a_usage_error(data):
    try:
        validate_pack(data, "fuzz.json")
    except UsageError as exc:
        assert "fuzz.json" in str(exc) and "expected" in str(exc)
