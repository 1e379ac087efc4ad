"""The catalog's codemods, exact before/after texts and the places they must leave alone, and the
proposer's diffs over a copy of the bundled TinyGPT: they apply, compile and pass the source audit."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from infrarsi._search.strategy._catalog import CATALOG, CatalogProposer, unified_diff
from infrarsi._search.strategy._proposers import ProposalContext, editable_sources
from infrarsi.auditors import check_sources
from infrarsi.contract._contract import load_contract

TINYGPT = Path(__file__).parents[2] / "examples" / "tinygpt"
CODEMODS = {codemod.name: codemod for codemod in CATALOG}


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _applies(name: str, before: str, after: str) -> None:
    assert CODEMODS[name].transform(_src(before)) == _src(after)


def _leaves(name: str, source: str) -> None:
    assert CODEMODS[name].transform(_src(source)) is None


def test_the_catalog_names_are_unique_kebab_case_with_one_line_descriptions():
    assert len(CODEMODS) == len(CATALOG) >= 4
    for codemod in CATALOG:
        assert codemod.name == codemod.name.lower() and " " not in codemod.name and "_" not in codemod.name
        assert codemod.description and "\n" not in codemod.description


@pytest.mark.parametrize("name", sorted(CODEMODS))
def test_no_codemod_applies_to_text_that_does_not_parse(name):
    assert CODEMODS[name].transform("def broken(:\n    pass\n") is None


# ---------------------------------------------------------------- sdpa-attention


def test_sdpa_replaces_the_manual_branch_and_drops_the_mask_it_no_longer_needs():
    _applies(
        "sdpa-attention",
        """
        import math
        import torch
        import torch.nn.functional as F


        def causal_attention(q, k, v, kind):
            if kind == "sdpa":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            t = q.shape[-2]
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=q.device))
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
            scores = scores.masked_fill(~mask, float("-inf"))
            return torch.softmax(scores, dim=-1) @ v
        """,
        """
        import math
        import torch
        import torch.nn.functional as F


        def causal_attention(q, k, v, kind):
            if kind == "sdpa":
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        """,
    )


def test_sdpa_takes_weights_named_like_the_scores_a_division_by_sqrt_and_mask_eq_zero():
    _applies(
        "sdpa-attention",
        """
        import math
        import torch
        import torch.nn.functional as F


        def attend(q, k, v):
            T = q.size(-2)
            causal = torch.tril(torch.ones(T, T, device=q.device))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            att = att.masked_fill(causal == 0, float('-inf'))
            att = F.softmax(att, dim=-1)
            y = att @ v
            return y
        """,
        """
        import math
        import torch
        import torch.nn.functional as F


        def attend(q, k, v):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return y
        """,
    )


def test_sdpa_without_an_f_alias_keeps_a_custom_scale_and_takes_an_in_place_future_mask():
    _applies(
        "sdpa-attention",
        """
        import torch


        def attend(q, k, v, scale):
            n = q.shape[-2]
            future = torch.ones(n, n, dtype=torch.bool).triu(1)
            scores = torch.matmul(q, k.mT) * scale
            scores.masked_fill_(future, -torch.inf)
            return torch.matmul(scores.softmax(-1), v).transpose(1, 2)
        """,
        """
        import torch


        def attend(q, k, v, scale):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale).transpose(1, 2)
        """,
    )


def test_sdpa_turns_a_division_into_a_scale_and_reads_through_bool_and_logical_not():
    _applies(
        "sdpa-attention",
        """
        import torch


        def attend(self, q, k, v, n):
            m = torch.tril(torch.ones(n, n)).bool()
            s = q @ k.transpose(-2, -1) / self.temperature
            s = s.masked_fill(m.logical_not(), float("-inf"))
            return torch.softmax(s, -1) @ v
        """,
        """
        import torch


        def attend(self, q, k, v, n):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / self.temperature)
        """,
    )


def test_sdpa_keeps_a_mask_still_used_elsewhere():
    _applies(
        "sdpa-attention",
        """
        import math
        import torch
        from torch.nn import functional as fn


        def attend(q, k, v):
            t = q.shape[-2]
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
            scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            scores = scores.masked_fill(~mask, float("-inf"))
            out = torch.softmax(scores, -1) @ v
            return out, mask
        """,
        """
        import math
        import torch
        from torch.nn import functional as fn


        def attend(q, k, v):
            t = q.shape[-2]
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
            out = fn.scaled_dot_product_attention(q, k, v, is_causal=True)
            return out, mask
        """,
    )


_ATTENTION = """
    import math
    import torch
    import torch.nn.functional as F


    def attend(self, q, k, v, pad):
        t = q.shape[-2]
        {mask}
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        scores = scores.masked_fill({hide}, {fill})
        {tail}
    """
_CAUSAL = "mask = torch.tril(torch.ones(t, t))"
_FINAL = "return torch.softmax(scores, dim=-1) @ v"


@pytest.mark.parametrize(
    "mask, hide, fill, tail",
    [
        ("pass", "self.bias[:, :, :t, :t] == 0", 'float("-inf")', _FINAL),  # a buffer: not visible here
        ("pass", "~pad", 'float("-inf")', _FINAL),  # a padding mask
        ("mask = torch.tril(torch.ones(t, t), diagonal=-1)", "mask == 0", 'float("-inf")', _FINAL),
        ("mask = torch.tril(torch.ones(t, t + 1))", "mask == 0", 'float("-inf")', _FINAL),  # not square
        ("mask = torch.triu(torch.ones(t, t), diagonal=1)", "mask == 0", 'float("-inf")', _FINAL),  # wrong polarity
        (_CAUSAL, "mask == 0", "-1e9", _FINAL),  # not -inf
        (
            _CAUSAL,
            "mask == 0",
            'float("-inf")',
            "att = torch.softmax(scores, dim=-1)\n        att = self.drop(att)\n        return att @ v",
        ),  # dropout
        (_CAUSAL, "mask == 0", 'float("-inf")', "out = torch.softmax(scores, dim=-1) @ v\n        return out, scores"),
        (_CAUSAL, "mask == 0", 'float("-inf")', "return torch.softmax(scores, dim=-2) @ v"),
        (_CAUSAL, "mask == 0", 'float("-inf")', "return torch.softmax(scores, dim=-1) @ self.v(x)"),  # v is a call
        ("mask = torch.tril(torch.ones(t, t))\n        mask = mask.to(q.device)", "mask == 0", 'float("-inf")', _FINAL),
    ],
)
def test_sdpa_leaves_attention_it_cannot_prove_causal_and_plain(mask, hide, fill, tail):
    _leaves("sdpa-attention", _ATTENTION.format(mask=mask, hide=hide, fill=fill, tail=tail))


def test_sdpa_needs_torch_imported_by_name():
    _leaves(
        "sdpa-attention",
        _ATTENTION.format(mask=_CAUSAL, hide="~mask", fill='float("-inf")', tail=_FINAL)
        .replace("import torch\n", "")
        .replace("import torch.nn.functional as F\n", ""),
    )


def test_sdpa_rewrite_computes_the_same_outputs_and_gradients():
    torch = pytest.importorskip("torch")
    before = _src(_ATTENTION.format(mask=_CAUSAL, hide="mask == 0", fill='float("-inf")', tail=_FINAL))
    after = CODEMODS["sdpa-attention"].transform(before)
    assert after is not None and "scaled_dot_product_attention" in after
    results = []
    for text in (before, after):
        namespace: dict = {}
        exec(compile(text, "<attend>", "exec"), namespace)
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2, 3, 17, 8, generator=gen, requires_grad=True) for _ in range(3))
        out = namespace["attend"](None, q, k, v, None)
        out.square().sum().backward()
        results.append((out.detach(), q.grad, k.grad, v.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- foreach-optimizer


def test_foreach_is_added_however_the_optimizer_is_imported_keeping_the_call_layout():
    _applies(
        "foreach-optimizer",
        """
        import torch
        from torch import optim
        from torch.optim import SGD as Plain

        a = torch.optim.AdamW(model.parameters(), lr=1e-3)
        b = optim.Adam(params)
        c = Plain(
            params,
            lr=0.1,
            momentum=0.9,
        )
        d = torch.optim.RMSprop(params, lr=0.01,
                                alpha=0.9)
        """,
        """
        import torch
        from torch import optim
        from torch.optim import SGD as Plain

        a = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        b = optim.Adam(params, foreach=True)
        c = Plain(
            params,
            lr=0.1,
            momentum=0.9,
            foreach=True,
        )
        d = torch.optim.RMSprop(params, lr=0.01,
                                alpha=0.9,
                                foreach=True)
        """,
    )


@pytest.mark.parametrize(
    "call",
    [
        "torch.optim.AdamW(params, lr=1e-3, foreach=False)",
        "torch.optim.AdamW(params, fused=True)",
        "torch.optim.Adam(params, differentiable=True)",
        "torch.optim.SGD(params, **settings)",
        "torch.optim.LBFGS(params)",
        "AdamW(params)",  # a local class of that name, not torch's
    ],
)
def test_foreach_leaves_optimizers_that_chose_or_cannot_take_it(call):
    _leaves("foreach-optimizer", f"import torch\n\n\nclass AdamW:\n    pass\n\n\nopt = {call}\n")


def test_foreach_does_not_apply_to_tinygpt_which_has_a_knob_for_it():
    _leaves("foreach-optimizer", (TINYGPT / "train.py").read_text())


# ---------------------------------------------------------------- cached-causal-mask


def test_cached_mask_adds_the_helper_before_its_first_user_and_functools_in_isort_order():
    _applies(
        "cached-causal-mask",
        '''
        """Model."""

        from __future__ import annotations

        import math
        from dataclasses import dataclass

        import torch


        @dataclass
        class Config:
            n: int = 1


        # Attention with a causal mask.
        def causal_attention(q, k, v):
            t = q.shape[-2]
            mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=q.device))
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
            scores = scores.masked_fill(~mask, float("-inf"))
            return torch.softmax(scores, dim=-1) @ v
        ''',
        '''
        """Model."""

        from __future__ import annotations

        import functools
        import math
        from dataclasses import dataclass

        import torch


        @dataclass
        class Config:
            n: int = 1


        @functools.lru_cache(maxsize=32)
        def _causal_mask(rows, cols, dtype, device):
            """The causal mask, built once per size, dtype and device and shared: never modify it in place."""
            return torch.tril(torch.ones(rows, cols, dtype=dtype, device=device))


        # Attention with a causal mask.
        def causal_attention(q, k, v):
            t = q.shape[-2]
            mask = _causal_mask(t, t, torch.bool, q.device)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
            scores = scores.masked_fill(~mask, float("-inf"))
            return torch.softmax(scores, dim=-1) @ v
        ''',
    )


def test_cached_mask_inline_in_a_method_with_functools_imported_and_the_helper_name_taken():
    _applies(
        "cached-causal-mask",
        '''
        """Doc."""
        import functools

        import torch

        _causal_mask = None


        class Attn(torch.nn.Module):
            def forward(self, x):
                t = x.shape[1]
                return x.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device)), 0.0)
        ''',
        '''
        """Doc."""
        import functools

        import torch

        _causal_mask = None


        @functools.lru_cache(maxsize=32)
        def _causal_mask_cached(rows, cols, dtype, device):
            """The causal mask, built once per size, dtype and device and shared: never modify it in place."""
            return torch.tril(torch.ones(rows, cols, dtype=dtype, device=device))


        class Attn(torch.nn.Module):
            def forward(self, x):
                t = x.shape[1]
                return x.masked_fill(~_causal_mask_cached(t, t, torch.bool, x.device), 0.0)
        ''',
    )


@pytest.mark.parametrize(
    "body",
    [
        "self.register_buffer('mask', torch.tril(torch.ones(t, t)))",  # in __init__, see below
        "return torch.tril(torch.ones(t, t))",  # escapes to the caller
        "mask = torch.tril(torch.ones(t, t))\n    mask[0, 0] = 0\n    return x * mask",
        "mask = torch.tril(torch.ones(t, t))\n    mask.mul_(2)\n    return x * mask",
        "mask = torch.tril(torch.ones(t, t))\n    self.keep = mask\n    return x",
        "mask = torch.tril(torch.ones(len(x), len(x)))\n    return x * mask",  # sizes are calls
        "mask = torch.tril(torch.ones(t, t, requires_grad=True))\n    return x * mask",
        "mask = torch.tril(torch.ones(t, t), diagonal=1)\n    return x * mask",
    ],
)
def test_cached_mask_leaves_masks_that_could_be_changed_kept_or_are_not_plain(body):
    name = "__init__" if "register_buffer" in body else "forward"
    _leaves("cached-causal-mask", f"import torch\n\n\ndef {name}(self, x, t):\n    {body}\n")


def test_cached_mask_leaves_module_level_masks_and_modules_without_import_torch():
    _leaves("cached-causal-mask", "import torch\n\nMASK = torch.tril(torch.ones(8, 8))\n")
    _leaves(
        "cached-causal-mask",
        "from torch import ones, tril\n\n\ndef f(x, t):\n    mask = tril(ones(t, t))\n    return x * mask\n",
    )


# ---------------------------------------------------------------- no-checkpoint


def test_no_checkpoint_calls_the_function_directly_and_drops_the_unused_import():
    _applies(
        "no-checkpoint",
        """
        import torch
        from torch.utils.checkpoint import checkpoint


        def forward(self, x):
            for block in self.blocks:
                if self.training:
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            return x
        """,
        """
        import torch


        def forward(self, x):
            for block in self.blocks:
                if self.training:
                    x = block(x)
                else:
                    x = block(x)
            return x
        """,
    )


def test_no_checkpoint_handles_each_import_style_lambdas_and_trailing_commas():
    _applies(
        "no-checkpoint",
        """
        import torch
        import torch.utils.checkpoint as cp
        from torch.utils.checkpoint import checkpoint as ckpt


        def run(self, x, y):
            a = torch.utils.checkpoint.checkpoint(self.block, x, y, use_reentrant=False, preserve_rng_state=True)
            b = cp.checkpoint(lambda z: z * 2, a, use_reentrant=False)
            return ckpt(
                self.head,
                b,
                use_reentrant=False,
            )
        """,
        """
        import torch
        import torch.utils.checkpoint as cp


        def run(self, x, y):
            a = self.block(x, y)
            b = (lambda z: z * 2)(a)
            return self.head(
                b,
            )
        """,
    )


@pytest.mark.parametrize(
    "source",
    [
        "import torch\n\n\ndef checkpoint(path):\n    torch.save({}, path)\n\n\ncheckpoint('model.pt')\n",
        "from torch.utils.checkpoint import checkpoint_sequential\n\ny = checkpoint_sequential(layers, 2, x)\n",
        "from torch.utils.checkpoint import checkpoint\n\ny = checkpoint(block, x, **options)\n",
        "from torch.utils.checkpoint import checkpoint\n\ny = checkpoint(function=block)\n",
    ],
)
def test_no_checkpoint_leaves_other_checkpoints_and_calls_it_cannot_unwrap(source):
    _leaves("no-checkpoint", source)


# ---------------------------------------------------------------- the proposer and its diffs


def test_a_diff_marks_a_missing_final_newline_and_git_applies_it(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\ny = 2")
    diff = unified_diff("a.py", "x = 1\ny = 2", "x = 1\ny = 3")
    assert diff.endswith("\n") and "\\ No newline at end of file\n" in diff
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=diff, text=True, check=True, capture_output=True)
    assert (tmp_path / "a.py").read_text() == "x = 1\ny = 3"


def test_a_diff_keeps_crlf_lines_and_git_applies_it(tmp_path):
    before = "import torch\r\n\r\nopt = torch.optim.Adam(p)\r\n"
    after = CODEMODS["foreach-optimizer"].transform(before)
    assert after == "import torch\r\n\r\nopt = torch.optim.Adam(p, foreach=True)\r\n"
    (tmp_path / "a.py").write_bytes(before.encode())
    subprocess.run(
        ["git", "apply", "-"],
        cwd=tmp_path,
        input=unified_diff("a.py", before, after).encode(),
        check=True,
        capture_output=True,
    )
    assert (tmp_path / "a.py").read_bytes() == after.encode()


@pytest.fixture
def tinygpt(tmp_path: Path) -> Path:
    dest = tmp_path / "tinygpt"
    shutil.copytree(TINYGPT, dest, ignore=shutil.ignore_patterns(".infrarsi", "__pycache__"))
    return dest


def _context(workspace: Path) -> ProposalContext:
    contract = load_contract(workspace / "infrarsi.toml")
    return ProposalContext(workspace, contract, editable_sources(contract))


def test_catalog_proposals_for_tinygpt_apply_compile_and_pass_the_source_audit(tinygpt):
    context = _context(tinygpt)
    before = {path: (tinygpt / path).read_text() for path in context.editable}
    proposals = CatalogProposer().propose(context)
    assert {p.patch.name for p in proposals} == {
        "catalog:sdpa-attention",
        "catalog:cached-causal-mask",
        "catalog:no-checkpoint",
    }
    for proposal in proposals:
        assert proposal.origin == "catalog" and proposal.rationale
        diff = proposal.patch.text
        assert diff.startswith("diff --git a/model.py b/model.py\n--- a/model.py\n+++ b/model.py\n@@ ")
        assert diff.endswith("\n")
        check = subprocess.run(
            ["git", "apply", "--check", "-"], cwd=tinygpt, input=diff, text=True, capture_output=True
        )
        assert check.returncode == 0, (proposal.patch.name, check.stderr)
        codemod = CODEMODS[proposal.patch.name.split(":", 1)[1]]
        after = {path: codemod.transform(text) or text for path, text in before.items()}
        for path, text in after.items():
            compile(text, path, "exec")
        changed = {path: (before[path], after[path]) for path in before if after[path] != before[path]}
        results = check_sources(changed, context.contract.numerics.precision, context.contract.protected_globs)
        assert results and all(r.status == "pass" for r in results), [
            r.to_json() for r in results if r.status != "pass"
        ]
    assert {path: (tinygpt / path).read_text() for path in before} == before  # the workspace is untouched


def test_applied_catalog_diffs_give_the_codemod_text(tinygpt):
    for proposal in CatalogProposer().propose(_context(tinygpt)):
        work = tinygpt.parent / proposal.patch.name.replace(":", "-")
        shutil.copytree(tinygpt, work)
        subprocess.run(
            ["git", "apply", "-"], cwd=work, input=proposal.patch.text, text=True, check=True, capture_output=True
        )
        codemod = CODEMODS[proposal.patch.name.split(":", 1)[1]]
        assert (work / "model.py").read_text() == codemod.transform((tinygpt / "model.py").read_text())


def test_one_proposal_covers_every_file_a_codemod_changes(tinygpt):
    (tinygpt / "extra.py").write_text("import torch\n\nopt = torch.optim.SGD(params, lr=0.1)")
    (tinygpt / "more.py").write_text("import torch\n\nopt = torch.optim.Adam(params)\n")
    contract = load_contract(tinygpt / "infrarsi.toml")
    context = ProposalContext(
        tinygpt,
        contract,
        {
            **editable_sources(contract),
            "extra.py": (tinygpt / "extra.py").read_text(),
            "more.py": (tinygpt / "more.py").read_text(),
        },
    )
    (foreach,) = [p for p in CatalogProposer().propose(context) if p.patch.name == "catalog:foreach-optimizer"]
    assert foreach.patch.text.count("diff --git ") == 2
    subprocess.run(
        ["git", "apply", "-"], cwd=tinygpt, input=foreach.patch.text, text=True, check=True, capture_output=True
    )
    assert (tinygpt / "extra.py").read_text().endswith("lr=0.1, foreach=True)")
    assert (tinygpt / "more.py").read_text().endswith("Adam(params, foreach=True)\n")


def test_a_proposer_with_nothing_to_change_proposes_nothing(tinygpt):
    context = _context(tinygpt)
    quiet = ProposalContext(tinygpt, context.contract, {"train.py": context.editable["train.py"]})
    assert CatalogProposer().propose(quiet) == []


# -- the proposer explains itself: applied, or why not, by file and line -----------------------

_BRANCHED = """
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, attn="manual"):
        super().__init__()
        self.heads, self.attn = heads, attn
        self.qkv = nn.Linear(dim, 3 * dim)
        self.drop = nn.Dropout(0.1)
        self.register_buffer("causal", torch.tril(torch.ones(64, 64)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        if self.attn == "manual":
            mask = torch.tril(torch.ones(T, T, device=x.device)).bool()
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            scores = scores.masked_fill(~mask, float("-inf"))
            weights = F.softmax(scores, dim=-1)
            out = weights @ v
        elif self.attn == "dropout":
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            scores = scores.masked_fill(self.causal[:T, :T] == 0, float("-inf"))
            out = self.drop(F.softmax(scores, dim=-1)) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out


def optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
"""


def _explained(tmp_path, source: str) -> dict[str, dict]:
    (tmp_path / "model.py").write_text(_src(source))
    proposer = CatalogProposer()
    proposals = proposer.propose(ProposalContext(tmp_path, None, {"model.py": _src(source)}, {}))
    explained = {e["codemod"]: e for e in proposer.explained}
    assert [p.patch.name for p in proposals] == [f"catalog:{n}" for n, e in explained.items() if e["applied"]]
    return explained


def test_attention_inside_a_branch_on_a_flag_is_rewritten_and_the_forms_it_leaves_say_why(tmp_path):
    explained = _explained(tmp_path, _BRANCHED)
    sdpa = explained["sdpa-attention"]
    assert sdpa["applied"] == ["model.py"]  # the manual branch, inside the if/elif of a method
    [left] = sdpa["not_applied"]  # the dropout branch: a buffer mask, then dropout before @ v
    assert left.startswith("model.py:26: attention scores in forward(): the mask self.causal[:T, :T] == 0")
    assert "not visibly causal" in left
    masks = explained["cached-causal-mask"]
    assert masks["applied"] == ["model.py"]  # the mask rebuilt on every forward
    assert any(w.startswith("model.py:14:") and "built once in __init__ already" in w for w in masks["not_applied"])
    foreach = explained["foreach-optimizer"]
    assert foreach["applied"] == [] and foreach["not_applied"] == [
        "model.py:35: torch.optim.AdamW(...): it already says fused="
    ]
    assert explained["no-checkpoint"] == {
        "codemod": "no-checkpoint",
        "applied": [],
        "not_applied": ["not found in the editable files (model.py)"],
    }


def test_dropout_between_softmax_and_v_is_named_as_the_reason(tmp_path):
    source = _BRANCHED.replace(
        'scores = scores.masked_fill(self.causal[:T, :T] == 0, float("-inf"))',
        'scores = scores.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf"))',
    )
    reasons = _explained(tmp_path, source)["sdpa-attention"]["not_applied"]
    assert len(reasons) == 1 and "is not followed directly by a product with v" in reasons[0], reasons
