"""The LLM proposer against the real ``openai`` client and a loopback chat-completions server."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytest.importorskip("openai")

from chat_server import ChatServer, Fail, Reply

from infrarsi._search.strategy._llm import LLMConfig, LLMProposer, extract_diffs, llm_config
from infrarsi._search.strategy._proposers import ProposalContext, Proposer, editable_sources
from infrarsi.contract._contract import load_contract
from infrarsi.verifiers import check_scope

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tinygpt"
KEY = "sk-test-0123456789abcdef"
DIAGNOSIS = {
    "runs": 3,
    "step_time_s": {"median": 0.04213, "cv": 0.0123, "mad": 0.0007},
    "within_run_cv": 0.0311,
    "tokens_per_s": 97531.5,
    "peak_mem_mb": 471.25,
    "mfu": 0.0642,
    "reference": {"loss": [4.1, 4.0, 3.9]},
    "run_step_times_s": [0.042, 0.0421, 0.0423],
}

IN_SCOPE = """\
diff --git a/model.py b/model.py
--- a/model.py
+++ b/model.py
@@ -1,3 +1,3 @@
-import math
+import math  # faster
 import os
 import sys
"""

TOUCHES_TRAIN = IN_SCOPE.replace("model.py", "train.py")

OUT_OF_SCOPE = """\
diff --git a/helpers.py b/helpers.py
--- a/helpers.py
+++ b/helpers.py
@@ -1 +1 @@
-x = 1
+x = 2
"""


def fenced(*blocks: str, lang: str = "diff") -> str:
    parts = [
        f"Idea {n}: this removes a redundant allocation in step {n}.\n\n```{lang}\n{block}```\n"
        for n, block in enumerate(blocks, start=1)
    ]
    return "Here are my ideas.\n\n" + "\n".join(parts) + "\nThat is all."


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # httpx honours proxy variables even for loopback addresses.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def context(tmp_path: Path) -> ProposalContext:
    workspace = tmp_path / "tinygpt"
    shutil.copytree(EXAMPLE, workspace, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    contract = load_contract(workspace / "infrarsi.toml")
    return ProposalContext(workspace, contract, editable_sources(contract), dict(DIAGNOSIS))


def config_for(server: ChatServer, **overrides) -> LLMConfig:
    values = {
        "base_url": server.base_url,
        "model": "test-model",
        "api_key": KEY,
        "max_proposals": 3,
        "cost_per_1k_tokens": 0.5,
        "timeout_s": 10.0,
    }
    return LLMConfig(**(values | overrides))


def scope_of(context: ProposalContext, text: str) -> dict[str, str]:
    contract = context.contract
    checks = check_scope({"p": text}, list(contract.scope.editable), list(contract.protected_globs))
    return {c.id: c.status for c in checks}


# -- configuration ------------------------------------------------------------------------

SEARCH = {
    "llm_base_url": None,
    "llm_model": None,
    "llm_api_key_env": "INFRARSI_LLM_API_KEY",
    "llm_max_proposals": 3,
    "llm_cost_per_1k_tokens": 0.002,
}
ENV = {"INFRARSI_LLM_BASE_URL": "http://env.example/v1", "INFRARSI_LLM_MODEL": "env-model", "INFRARSI_LLM_API_KEY": KEY}


def test_config_from_the_environment() -> None:
    config, why = llm_config(SEARCH, ENV)
    assert config == LLMConfig("http://env.example/v1", "env-model", KEY, 3, 0.002)
    assert why == "on: env-model at http://env.example/v1"


def test_contract_values_win_over_the_environment() -> None:
    config, why = llm_config(SEARCH | {"llm_base_url": "http://contract/v1", "llm_model": "m1"}, ENV)
    assert (config.base_url, config.model) == ("http://contract/v1", "m1")
    assert why == "on: m1 at http://contract/v1"


@pytest.mark.parametrize(
    "missing, named",
    [
        ("INFRARSI_LLM_BASE_URL", "llm_base_url"),
        ("INFRARSI_LLM_MODEL", "llm_model"),
        ("INFRARSI_LLM_API_KEY", "$INFRARSI_LLM_API_KEY"),
    ],
)
def test_each_missing_setting_turns_it_off_by_name(missing: str, named: str) -> None:
    env = {k: v for k, v in ENV.items() if k != missing}
    config, why = llm_config(SEARCH, env)
    assert config is None
    assert why.startswith("off: ") and named in why and missing in why


def test_an_empty_value_counts_as_missing() -> None:
    config, why = llm_config(SEARCH, ENV | {"INFRARSI_LLM_MODEL": "  "})
    assert config is None and "llm_model" in why


def test_the_key_comes_from_the_named_variable() -> None:
    env = {k: v for k, v in ENV.items() if k != "INFRARSI_LLM_API_KEY"} | {"MY_KEY": "sk-mine"}
    config, _ = llm_config(SEARCH | {"llm_api_key_env": "MY_KEY"}, env)
    assert config.api_key == "sk-mine"
    config, why = llm_config(SEARCH | {"llm_api_key_env": "OTHER_KEY"}, env)
    assert config is None and "$OTHER_KEY" in why and "OPENAI_API_KEY" not in why


def test_openai_api_key_is_the_fallback_of_the_default_name_only() -> None:
    env = {k: v for k, v in ENV.items() if k != "INFRARSI_LLM_API_KEY"} | {"OPENAI_API_KEY": "sk-openai"}
    config, _ = llm_config(SEARCH, env)
    assert config.api_key == "sk-openai"
    config, why = llm_config(SEARCH | {"llm_api_key_env": "MY_KEY"}, env)
    assert config is None and "$MY_KEY" in why


def test_zero_proposals_is_off() -> None:
    config, why = llm_config(SEARCH | {"llm_max_proposals": 0}, ENV)
    assert config is None and "llm_max_proposals" in why


def test_without_the_openai_package_it_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openai" else real(name, *a))
    config, why = llm_config(SEARCH, ENV)
    assert config is None
    assert why == "off: the openai package is not installed (pip install 'infrarsi[llm]')"


def test_the_key_is_not_in_reprs() -> None:
    config, _ = llm_config(SEARCH, ENV)
    assert KEY not in repr(config) and KEY not in repr(LLMProposer(config))


# -- proposals ----------------------------------------------------------------------------


def test_two_diffs_give_two_proposals(context: ProposalContext) -> None:
    with ChatServer([Reply(fenced(IN_SCOPE, TOUCHES_TRAIN), prompt_tokens=100, completion_tokens=23)]) as server:
        proposals = LLMProposer(config_for(server)).propose(context)
    assert [p.patch.name for p in proposals] == ["llm:1", "llm:2"]
    assert [p.patch.text for p in proposals] == [IN_SCOPE, TOUCHES_TRAIN]
    assert {p.origin for p in proposals} == {"llm"}
    assert proposals[0].rationale == "Idea 1: this removes a redundant allocation in step 1."
    assert proposals[1].rationale == "Idea 2: this removes a redundant allocation in step 2."
    assert [p.llm_tokens for p in proposals] == [62, 61]
    assert sum(p.llm_tokens for p in proposals) == 123
    assert sum(p.llm_cost for p in proposals) == pytest.approx(123 / 1000 * 0.5)
    assert proposals[0].llm_cost == pytest.approx(62 / 1000 * 0.5)


def test_the_request_carries_model_sources_diagnosis_and_key(context: ProposalContext) -> None:
    with ChatServer([fenced(IN_SCOPE)]) as server:
        LLMProposer(config_for(server)).propose(context)
    assert len(server.requests) == 1
    request = server.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.authorization == f"Bearer {KEY}"
    body = request.body
    assert body["model"] == "test-model" and body["temperature"] == 0
    system, user = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    assert "model.py" in system["content"] and "infrarsi.probe" in system["content"]
    assert "```diff" in system["content"]
    text = user["content"]
    for source in context.editable.values():
        assert source.rstrip("\n") in text
    for number in ("0.04213", "0.0123", "0.0311", "97531.5", "471.25", "0.0642"):
        assert number in text
    assert "4.1, 4.0" not in text  # per-step trajectories stay out
    assert "micro_batch" in text and "up to 3" in text
    assert KEY not in str(body)


def test_a_reply_without_a_diff_is_one_malformed_proposal(context: ProposalContext) -> None:
    reply = "I would try torch.compile, but I cannot write a diff."
    with ChatServer([Reply(reply, prompt_tokens=40, completion_tokens=10)]) as server:
        proposals = LLMProposer(config_for(server)).propose(context)
    assert len(proposals) == 1
    (p,) = proposals
    assert p.patch.name == "llm:malformed" and p.patch.text == reply and p.origin == "llm"
    assert p.llm_tokens == 50 and p.llm_cost == pytest.approx(0.025)
    assert scope_of(context, p.patch.text)["scope.parse"] == "fail"


def test_an_empty_reply_is_malformed(context: ProposalContext) -> None:
    with ChatServer([""]) as server:
        (p,) = LLMProposer(config_for(server)).propose(context)
    assert p.patch.name == "llm:malformed" and p.patch.text == ""
    assert scope_of(context, p.patch.text)["scope.parse"] == "fail"


def test_a_server_error_is_an_error_proposal(context: ProposalContext) -> None:
    with ChatServer([Fail(500, "the model is overloaded")]) as server:
        proposals = LLMProposer(config_for(server)).propose(context)
    assert len(server.requests) == 1  # no retries
    (p,) = proposals
    assert p.patch.name == "llm:error" and p.origin == "llm"
    assert "InternalServerError" in p.patch.text and "overloaded" in p.patch.text
    assert p.llm_tokens == 0 and p.llm_cost == 0.0
    assert scope_of(context, p.patch.text)["scope.parse"] == "fail"


def test_a_rejected_key_is_scrubbed_from_the_error(context: ProposalContext) -> None:
    with ChatServer([Fail(401, f"Incorrect API key provided: {KEY}")]) as server:
        (p,) = LLMProposer(config_for(server)).propose(context)
    assert p.patch.name == "llm:error" and "AuthenticationError" in p.patch.text
    assert KEY not in p.patch.text and KEY not in p.rationale


def test_an_unreachable_endpoint_is_an_error_proposal(context: ProposalContext) -> None:
    server = ChatServer()
    url = server.base_url
    server.close()  # nothing listens on the port now
    (p,) = LLMProposer(LLMConfig(url, "m", KEY, timeout_s=5.0)).propose(context)
    assert p.patch.name == "llm:error" and "APIConnectionError" in p.patch.text


def test_a_timeout_is_an_error_proposal(context: ProposalContext) -> None:
    with ChatServer([Reply(fenced(IN_SCOPE), delay_s=1.5)]) as server:
        (p,) = LLMProposer(config_for(server, timeout_s=0.3)).propose(context)
    assert p.patch.name == "llm:error" and "Timeout" in p.patch.text


def test_max_proposals_caps_the_count(context: ProposalContext) -> None:
    blocks = [IN_SCOPE.replace("# faster", f"# faster {n}") for n in range(5)]
    with ChatServer([Reply(fenced(*blocks), prompt_tokens=90, completion_tokens=11)]) as server:
        proposals = LLMProposer(config_for(server, max_proposals=2)).propose(context)
    assert [p.patch.text for p in proposals] == blocks[:2]
    assert [p.llm_tokens for p in proposals] == [51, 50]
    assert "up to 2" in server.requests[0].body["messages"][1]["content"]


def test_a_bare_diff_reply_is_one_proposal(context: ProposalContext) -> None:
    with ChatServer([IN_SCOPE.rstrip("\n")]) as server:
        (p,) = LLMProposer(config_for(server)).propose(context)
    assert p.patch.name == "llm:1" and p.patch.text == IN_SCOPE


def test_a_reply_without_usage_costs_nothing(context: ProposalContext) -> None:
    with ChatServer([Reply(fenced(IN_SCOPE), usage=False)]) as server:
        (p,) = LLMProposer(config_for(server)).propose(context)
    assert p.patch.name == "llm:1" and p.llm_tokens == 0 and p.llm_cost == 0.0


def test_out_of_scope_diffs_are_returned_for_the_caller_to_reject(context: ProposalContext) -> None:
    with ChatServer([fenced(OUT_OF_SCOPE, IN_SCOPE)]) as server:
        outside, inside = LLMProposer(config_for(server)).propose(context)
    assert outside.patch.text == OUT_OF_SCOPE and inside.patch.text == IN_SCOPE
    assert scope_of(context, outside.patch.text)["scope.editable"] == "fail"
    assert set(scope_of(context, inside.patch.text).values()) == {"pass"}


def test_a_diff_of_a_protected_file_fails_scope(context: ProposalContext) -> None:
    protected = OUT_OF_SCOPE.replace("helpers.py", "infrarsi.toml")
    with ChatServer([fenced(protected)]) as server:
        (p,) = LLMProposer(config_for(server)).propose(context)
    assert p.patch.text == protected
    assert scope_of(context, p.patch.text)["scope.protected"] == "fail"


def test_the_proposer_fits_the_protocol() -> None:
    proposer: Proposer = LLMProposer(LLMConfig("http://x/v1", "m", KEY))
    assert proposer.name == "llm"


def test_the_server_also_answers_without_the_v1_prefix(context: ProposalContext) -> None:
    with ChatServer([fenced(IN_SCOPE)]) as server:
        url = server.base_url.removesuffix("/v1")
        (p,) = LLMProposer(config_for(server, base_url=url)).propose(context)
    assert p.patch.name == "llm:1" and server.requests[0].path == "/chat/completions"


# -- reading replies ----------------------------------------------------------------------


def test_extract_keeps_patch_blocks_and_skips_code() -> None:
    reply = (
        "Some code:\n```python\nprint(1)\n```\n\nFirst, cache it.\n```patch\n" + IN_SCOPE + "```\n"
        "Unlabelled:\n```\n" + TOUCHES_TRAIN + "```\n"
    )
    assert extract_diffs(reply) == [("First, cache it.", IN_SCOPE), ("Unlabelled:", TOUCHES_TRAIN)]


def test_extract_keeps_an_unclosed_block_and_trims_the_rationale() -> None:
    prose = "word " * 100
    ((rationale, text),) = extract_diffs(prose + "\n```diff\n" + IN_SCOPE)
    assert text == IN_SCOPE
    assert len(rationale) <= 200 and rationale.endswith("...")


def test_extract_keeps_context_lines_exactly() -> None:
    body = "--- a/model.py\n+++ b/model.py\n@@ -1,2 +1,2 @@\n \n-a\n+b\n \n"
    assert extract_diffs(f"```diff\n{body}```") == [("", body)]
