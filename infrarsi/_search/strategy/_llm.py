"""The LLM proposer: asks an OpenAI-compatible endpoint for unified diffs.

The model is outside code: nothing it says is trusted. Every reply becomes
:class:`Proposal` objects as it is, malformed or out of scope; the search screens
each one (``scope.*``, the source audit) and records the rejected ones with the
tokens they cost. A failed request is a proposal too (``llm:error``), so the spend
and the reason are in the ledger instead of a traceback.

The API key only ever travels in the ``Authorization`` header the ``openai`` client
sets; it is kept out of reprs and scrubbed from error texts.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infrarsi._search.strategy._proposers import Proposal, ProposalContext
from infrarsi.contract import PatchRef

__all__ = ["LLMConfig", "LLMProposer", "llm_config", "extract_diffs", "DEFAULT_KEY_ENV"]

DEFAULT_KEY_ENV = "INFRARSI_LLM_API_KEY"
BASE_URL_ENV = "INFRARSI_LLM_BASE_URL"
MODEL_ENV = "INFRARSI_LLM_MODEL"
RATIONALE_CHARS = 200

# Diagnosis keys in the order a person reads them; anything else follows.
_DIAGNOSIS_ORDER = ("step_time_s", "within_run_cv", "tokens_per_step", "tokens_per_s", "peak_mem_mb", "mfu", "runs")
# Per-step trajectories and bookkeeping: long, and no help to a model writing a patch.
_DIAGNOSIS_SKIP = {"reference", "reference_spread", "run_step_times_s", "executions", "knobs"}


@dataclass(frozen=True)
class LLMConfig:
    base_url: str
    model: str
    api_key: str = field(repr=False)
    max_proposals: int = 3
    cost_per_1k_tokens: float = 0.0
    timeout_s: float = 120.0


def llm_config(search_section_values: dict, environ: Mapping[str, str]) -> tuple[LLMConfig | None, str]:
    """The LLM proposer's settings from the contract's [search] values and the environment,
    or None and why it is off (naming the missing setting)."""
    values = search_section_values

    def setting(key: str, env: str) -> str | None:
        return (values.get(key) or "").strip() or (environ.get(env) or "").strip() or None

    base_url = setting("llm_base_url", BASE_URL_ENV)
    if base_url is None:
        return None, f"off: no endpoint (set [search] llm_base_url or ${BASE_URL_ENV})"
    model = setting("llm_model", MODEL_ENV)
    if model is None:
        return None, f"off: no model (set [search] llm_model or ${MODEL_ENV})"
    key_env = (values.get("llm_api_key_env") or "").strip() or DEFAULT_KEY_ENV
    api_key = (environ.get(key_env) or "").strip()
    if not api_key and key_env == DEFAULT_KEY_ENV:
        api_key = (environ.get("OPENAI_API_KEY") or "").strip()
    if not api_key:
        also = " or $OPENAI_API_KEY" if key_env == DEFAULT_KEY_ENV else ""
        return None, (f"off: no API key (${key_env}{also} is not set; [search] llm_api_key_env names the variable)")
    raw_max = values.get("llm_max_proposals")
    max_proposals = 3 if raw_max is None else int(raw_max)
    if max_proposals <= 0:
        return None, "off: [search] llm_max_proposals is 0"
    if importlib.util.find_spec("openai") is None:
        return None, "off: the openai package is not installed (pip install 'infrarsi[llm]')"
    config = LLMConfig(
        base_url=base_url,
        model=model,
        api_key=api_key,
        max_proposals=max_proposals,
        cost_per_1k_tokens=float(values.get("llm_cost_per_1k_tokens") or 0.0),
    )
    return config, f"on: {model} at {base_url}"


def _default_client(config: LLMConfig) -> Any:
    import openai

    # No retries: one request per search, and a retry storm against a paid endpoint is the
    # caller's decision, not ours.
    return openai.OpenAI(base_url=config.base_url, api_key=config.api_key, timeout=config.timeout_s, max_retries=0)


class LLMProposer:
    """Patches from a chat-completions endpoint, one request per search."""

    name = "llm"

    def __init__(self, config: LLMConfig, client_factory: Callable[[LLMConfig], Any] | None = None) -> None:
        self.config = config
        self._client_factory = client_factory or _default_client

    def __repr__(self) -> str:
        return f"LLMProposer({self.config.model!r} at {self.config.base_url!r})"

    def propose(self, context: ProposalContext) -> list[Proposal]:
        if self.config.max_proposals <= 0:
            return []
        import openai

        messages = build_messages(context, self.config.max_proposals)
        try:
            client = self._client_factory(self.config)
            response = client.chat.completions.create(model=self.config.model, messages=messages, temperature=0)
        except openai.OpenAIError as exc:  # status errors, connection errors, timeouts
            text = self._scrub(f"the LLM request failed: {type(exc).__name__}: {exc}")
            return [self._proposal("error", text, "the LLM request failed", 0)]
        tokens = _total_tokens(response)
        reply = _reply_text(response)
        blocks = extract_diffs(reply)[: self.config.max_proposals]
        if not blocks:
            return [self._proposal("malformed", reply, "the reply holds no unified diff", tokens)]
        share, remainder = divmod(tokens, len(blocks))
        return [
            self._proposal(str(n), text, rationale, share + (remainder if n == 1 else 0))
            for n, (rationale, text) in enumerate(blocks, start=1)
        ]

    def _proposal(self, short: str, text: str, rationale: str, tokens: int) -> Proposal:
        cost = tokens / 1000 * self.config.cost_per_1k_tokens
        return Proposal(PatchRef(f"llm:{short}", text), self.name, rationale, llm_tokens=tokens, llm_cost=cost)

    def _scrub(self, text: str) -> str:
        # Some endpoints echo (part of) a rejected key; the text ends up in the ledger.
        key = self.config.api_key
        return text.replace(key, "***") if key else text


# -- the conversation ---------------------------------------------------------------------


def build_messages(context: ProposalContext, max_proposals: int) -> list[dict[str, str]]:
    """The system rules and the user request (diagnosis, knobs, editable files) for one ask."""
    contract = context.contract
    editable = sorted(context.editable)
    protected = ", ".join(contract.protected_globs) or "none"
    precision = ", ".join(contract.numerics.precision)
    system = "\n".join(
        [
            "You make a PyTorch training step faster without changing the training job.",
            "Every patch you write is checked mechanically and measured; a patch that breaks a rule is thrown away.",
            "Rules:",
            f"- Edit only these files: {', '.join(editable) or '(none)'}. Create, delete or rename no file.",
            "- Keep the training job identical: the same loss and grad-norm trajectory (within "
            f"rtol {contract.numerics.loss_rtol} on the loss), the same data in the same order, the same precision "
            f"({precision}), the same number of steps and the same tokens per step.",
            "- Do not touch timing or measurement, the probe (infrarsi.probe), receipts, the infrarsi contract, "
            f"or protected files ({protected}).",
            "- The launch knobs listed below are tuned by the search itself; do not hard-code them. "
            "A patch should be correct under every knob setting.",
            "- Reply with unified diffs in ```diff fenced blocks, one block per independent idea, each preceded by "
            "one or two sentences saying why it is faster. Paths are relative to the workspace with a/ and b/ "
            "prefixes (--- a/model.py, +++ b/model.py), with correct @@ hunk headers and enough context lines "
            "for `git apply`.",
        ]
    )
    parts = [
        f"Propose up to {max_proposals} independent patches that make one training step faster.",
        "",
        "Baseline diagnosis:",
        *_format_diagnosis(context.diagnosis),
        "",
        "Launch knobs (searched separately):",
    ]
    parts += [
        f"- {name}: choices {list(knob.choices)}, baseline {knob.baseline}" + _knob_how(knob)
        for name, knob in sorted(contract.knobs.items())
    ] or ["- (none)"]
    parts += ["", "Editable files:"]
    for path in editable:
        text = context.editable[path]
        parts += [f"File {path}:", "```python", text.rstrip("\n"), "```", ""]
    parts.append(f"Reply with at most {max_proposals} ```diff blocks.")
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(parts)}]


def _knob_how(knob: Any) -> str:
    launch = getattr(knob, "launch", None)
    if launch is not None and launch.form != "set":
        return f" ({launch.form} {launch.target})"
    if getattr(knob, "flag", None):
        return f" (flag {knob.flag})"
    if getattr(knob, "env", None):
        return f" (env {knob.env})"
    return ""


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.6g}"


def _format_diagnosis(diagnosis: Mapping[str, Any]) -> list[str]:
    keys = [k for k in _DIAGNOSIS_ORDER if k in diagnosis]
    keys += sorted(k for k in diagnosis if k not in keys and k not in _DIAGNOSIS_SKIP)
    lines = []
    for key in keys:
        value = diagnosis[key]
        if value is None:
            continue
        if isinstance(value, Mapping):
            inner = ", ".join(f"{k} {_number(v)}" for k, v in value.items() if not isinstance(v, (list, dict)))
            lines.append(f"- {key}: {inner}")
        elif not isinstance(value, (list, tuple)):
            lines.append(f"- {key}: {_number(value)}")
    return lines or ["- (no measurements)"]


# -- reading the reply --------------------------------------------------------------------

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.MULTILINE | re.DOTALL)


def _looks_like_diff(text: str) -> bool:
    return text.lstrip("\n").startswith(("diff --git ", "--- "))


def extract_diffs(reply: str) -> list[tuple[str, str]]:
    """(rationale, diff text) for every ```diff / ```patch block of a reply (or an unlabelled
    block holding a diff); a reply that is itself a bare diff is one block. Texts are kept
    as written, with a trailing newline; nothing is checked here."""
    out: list[tuple[str, str]] = []
    previous_end = 0
    for match in _FENCE.finditer(reply):
        lang, body = match.group(1).lower(), match.group(2)
        if lang in ("diff", "patch", "udiff") or (not lang and _looks_like_diff(body)):
            out.append((_rationale(reply[previous_end : match.start()]), _with_newline(body)))
        previous_end = match.end()
    if not out and _looks_like_diff(reply):
        out.append(("", _with_newline(reply.lstrip("\n"))))
    return out


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _rationale(prose: str) -> str:
    """The paragraph nearest the block, on one line, at most RATIONALE_CHARS."""
    paragraphs = [p for p in re.split(r"\n\s*\n", prose.strip()) if p.strip()]
    text = " ".join(paragraphs[-1].split()) if paragraphs else ""
    return text if len(text) <= RATIONALE_CHARS else text[: RATIONALE_CHARS - 3].rstrip() + "..."


def _reply_text(response: Any) -> str:
    # Compatible endpoints differ; a missing field is an empty reply, not a crash.
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, KeyError, TypeError):
        return response if isinstance(response, str) else ""
    return content if isinstance(content, str) else ""


def _total_tokens(response: Any) -> int:
    usage = getattr(response, "usage", None)
    total = getattr(usage, "total_tokens", None)
    return int(total) if isinstance(total, (int, float)) and total > 0 else 0
