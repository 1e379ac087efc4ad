"""The built-in catalog: libcst codemods that rewrite a slow idiom into a faster equivalent.

Each codemod matches one common idiom and rewrites only what it matched; libcst keeps the
rest of the file byte for byte. A codemod that cannot see that its rewrite trains the same
job (the same losses in fp32, up to rounding) does not apply: the search verifies every
speedup anyway, but a proposal that cannot pass is wasted budget. :class:`CatalogProposer`
turns each codemod that changes something into one proposal, a ``git apply``-able diff.
"""

from __future__ import annotations

import difflib
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import MetadataWrapper, ParentNodeProvider, QualifiedNameProvider

from infrarsi._candidate import PatchRef

from ._proposers import Proposal, ProposalContext

__all__ = ["CATALOG", "CatalogProposer", "Codemod", "unified_diff"]


@dataclass(frozen=True)
class Codemod:
    """One rewrite. ``transform`` gives the new module text, or None where it does not apply."""

    name: str
    description: str
    rewrite: Callable[[cst.Module], cst.Module]  # returns the module unchanged where nothing matches

    def transform(self, source: str) -> str | None:
        try:
            module = cst.parse_module(source)
        except (cst.ParserSyntaxError, RecursionError):
            return None
        out = self.rewrite(module).code
        return None if out == source else out


# ---------------------------------------------------------------- matching helpers

def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _same(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return "".join(_code(a).split()) == "".join(_code(b).split())


def _number(node: cst.CSTNode, value: float) -> bool:
    """``node`` is the literal ``value``; a negative one is a unary minus on a literal."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return value < 0 and _number(node.expression, -value)
    return isinstance(node, (cst.Integer, cst.Float)) and node.evaluated_value == value


def _name(node: cst.CSTNode, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


def _simple(node: cst.CSTNode) -> bool:
    """A name, attribute chain, integer or constant subscript: moving or repeating it is harmless."""
    if isinstance(node, (cst.Name, cst.Integer)):
        return True
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return isinstance(node.expression, cst.Integer)
    if isinstance(node, cst.Attribute):
        return _simple(node.value)
    if isinstance(node, cst.Subscript):
        return _simple(node.value) and all(isinstance(e.slice, cst.Index) and _simple(e.slice.value)
                                           for e in node.slice)
    return False


def _positional(call: cst.Call) -> list[cst.BaseExpression] | None:
    """The call's arguments when all are plain positional ones, else None."""
    if any(a.keyword is not None or a.star for a in call.args):
        return None
    return [a.value for a in call.args]


class _Find(cst.CSTVisitor):
    def __init__(self, pred: Callable[[cst.CSTNode], bool]) -> None:
        self.pred, self.found = pred, []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.pred(node):
            self.found.append(node)
        return True


def _find(root: cst.CSTNode, pred: Callable[[cst.CSTNode], bool]) -> list:
    finder = _Find(pred)
    root.visit(finder)
    return finder.found


def _is_use(node: cst.CSTNode, parent: cst.CSTNode | None) -> bool:
    """A name node that is a name, not an attribute's or a keyword's label."""
    if isinstance(parent, cst.Attribute) and parent.attr is node:
        return False
    return not (isinstance(parent, cst.Arg) and parent.keyword is node)


class _NameCounts(cst.CSTVisitor):
    """Every appearance of each name (bindings included), nested scopes included: conservative."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def visit_Name(self, node: cst.Name) -> None:
        self.counts[node.value] += 1

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False


def _counts(*nodes: cst.CSTNode) -> Counter[str]:
    visitor = _NameCounts()
    for node in nodes:
        node.visit(visitor)
    return visitor.counts


class _Bindings(cst.CSTVisitor):
    """Each name a function binds, how often, and its line where it is one plain ``name = value``."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.plain: dict[str, cst.SimpleStatementLine] = {}

    def _bind(self, target: cst.CSTNode) -> None:
        if isinstance(target, cst.Name):
            self.count[target.value] += 1
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        stmt = node.body[0]
        if len(node.body) == 1 and isinstance(stmt, cst.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0].target, cst.Name):
            self.plain[stmt.targets[0].target.value] = node

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target)

    def visit_AsName(self, node: cst.AsName) -> None:
        self._bind(node.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name)

    def visit_Global(self, node: cst.Global) -> None:
        for item in node.names:
            self._bind(item.name)

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        for item in node.names:
            self._bind(item.name)

    def single(self, name: str) -> cst.SimpleStatementLine | None:
        """The one ``name = value`` line, if the function binds ``name`` nowhere else."""
        return self.plain.get(name) if self.count[name] == 1 else None


def _bindings(func: cst.FunctionDef) -> _Bindings:
    visitor = _Bindings()
    func.visit(visitor)
    return visitor


def _assign(stmt: cst.CSTNode) -> tuple[str, cst.BaseExpression] | None:
    """``(name, value)`` for a line that is exactly ``name = value``."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
        assign = stmt.body[0]
        if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
            return assign.targets[0].target.value, assign.value
    return None


def _module_binds_torch(module: cst.Module) -> bool:
    """Whether a top-level ``import torch`` (or ``import torch.x``) binds the name ``torch``."""
    return any(isinstance(s, cst.Import) and any(a.asname is None and _code(a.name).split(".")[0] == "torch"
                                                 for a in s.names)
               for line in module.body if isinstance(line, cst.SimpleStatementLine) for s in line.body)


class _Edits(cst.CSTTransformer):
    """Applies edits found on the original tree: node -> replacement, REMOVE, or f(updated node)."""

    def __init__(self, edits: dict) -> None:
        self.edits = edits

    def on_leave(self, original_node, updated_node):
        edit = self.edits.get(original_node, updated_node)
        return edit(updated_node) if callable(edit) else edit


class _Qualified(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider, ParentNodeProvider)

    def qn(self, node: cst.CSTNode) -> set[str]:
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}


# ---------------------------------------------------------------- masks

def _ones(node: cst.CSTNode, qn) -> cst.Call | None:
    """``torch.ones(a, b, ...)`` with two positional sizes."""
    if isinstance(node, cst.Call) and "torch.ones" in qn(node.func) and not any(a.star for a in node.args):
        if sum(a.keyword is None for a in node.args) == 2 and all(a.keyword is not None for a in node.args[2:]):
            return node
    return None


def _triangle(node: cst.CSTNode, qn) -> tuple[str, cst.Call] | None:
    """``("tril", ones)`` for ``tril(ones(..))``, ``("triu", ones)`` for ``triu(ones(..), diagonal=1)``."""
    if not isinstance(node, cst.Call) or any(a.star for a in node.args):
        return None
    func = node.func
    if isinstance(func, cst.Attribute) and func.attr.value in ("tril", "triu") and _ones(func.value, qn):
        kind, base, extra = func.attr.value, func.value, list(node.args)
    else:
        names = qn(func)
        kind = "tril" if "torch.tril" in names else "triu" if "torch.triu" in names else None
        if kind is None or not node.args or node.args[0].keyword is not None:
            return None
        base, extra = node.args[0].value, list(node.args[1:])
    ones = _ones(base, qn)
    if ones is None or len(extra) > 1 or (extra and extra[0].keyword is not None
                                          and extra[0].keyword.value != "diagonal"):
        return None
    if not _number(extra[0].value if extra else cst.Integer("0"), 0 if kind == "tril" else 1):
        return None
    return kind, ones


# ---------------------------------------------------------------- sdpa-attention

def _functional_prefix(module: cst.Module) -> str | None:
    """How this module names ``torch.nn.functional``: its alias, the full path, or None."""
    for line in module.body:
        for stmt in line.body if isinstance(line, cst.SimpleStatementLine) else ():
            if isinstance(stmt, cst.Import):
                for alias in stmt.names:
                    if _code(alias.name) == "torch.nn.functional" and alias.asname is not None:
                        return _code(alias.asname.name)
            elif isinstance(stmt, cst.ImportFrom) and stmt.module is not None and _code(stmt.module) == "torch.nn" \
                    and not isinstance(stmt.names, cst.ImportStar):
                for alias in stmt.names:
                    if _code(alias.name) == "functional":
                        return _code(alias.asname.name) if alias.asname is not None else "functional"
    return "torch.nn.functional" if _module_binds_torch(module) else None


class _Blocks(cst.CSTVisitor):
    """The statement blocks of one function, not of the functions or classes nested in it."""

    def __init__(self, root: cst.FunctionDef) -> None:
        self.root, self.blocks = root, []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.root

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.blocks.append(node.body)


class _FindAttention(_Qualified):
    """Finds ``s = (q @ k^T) * scale; s = s.masked_fill(<causal>, -inf); softmax(s, -1) @ v``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix, self.edits = prefix, {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        blocks, binds = _Blocks(node), _bindings(node)
        node.visit(blocks)
        own = {stmt for body in blocks.blocks for stmt in body}
        for body in blocks.blocks:
            for i in range(len(body) - 2):
                edits = self._match(node, binds, own, body, i)
                if edits:
                    self.edits.update(edits)
                    break

    def _qk(self, node) -> tuple | None:
        """``(q, k)`` for ``q @ k.transpose(-2, -1)`` (or ``torch.matmul``, or ``k.mT``)."""
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            left, right = node.left, node.right
        elif isinstance(node, cst.Call) and "torch.matmul" in self.qn(node.func) and len(_positional(node) or ()) == 2:
            left, right = _positional(node)
        else:
            return None
        if isinstance(right, cst.Attribute) and right.attr.value == "mT":
            return left, right.value
        if isinstance(right, cst.Call) and isinstance(right.func, cst.Attribute) and right.func.attr.value == "transpose":
            dims = _positional(right) or []
            if len(dims) == 2 and ((_number(dims[0], -2) and _number(dims[1], -1))
                                   or (_number(dims[0], -1) and _number(dims[1], -2))):
                return left, right.func.value
        return None

    def _head_dim(self, node, q, k) -> bool:
        """``x.shape[-1]`` or ``x.size(-1)`` for x the query or the key: SDPA's default scale uses it."""
        x = None
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index) \
                and _number(node.slice[0].slice.value, -1) and isinstance(node.value, cst.Attribute) \
                and node.value.attr.value == "shape":
            x = node.value.value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size" \
                and len(_positional(node) or ()) == 1 and _number(node.args[0].value, -1):
            x = node.func.value
        return x is not None and (_same(x, q) or _same(x, k))

    def _sqrt_head_dim(self, node, q, k) -> bool:
        return isinstance(node, cst.Call) and "math.sqrt" in self.qn(node.func) \
            and len(_positional(node) or ()) == 1 and self._head_dim(node.args[0].value, q, k)

    def _scores(self, node) -> tuple | None:
        """``(q, k, scale)``; scale is None where it is SDPA's default ``1/sqrt(head_dim)``.

        A scale that is a tensor (a learned temperature) makes SDPA raise a TypeError: the
        run fails loudly, nothing trains differently.
        """
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
            for product, scale in ((node.left, node.right), (node.right, node.left)):
                qk = self._qk(product)
                if qk is None:
                    continue
                default = (isinstance(scale, cst.BinaryOperation) and isinstance(scale.operator, cst.Divide)
                           and _number(scale.left, 1) and self._sqrt_head_dim(scale.right, *qk)) or \
                          (isinstance(scale, cst.BinaryOperation) and isinstance(scale.operator, cst.Power)
                           and _number(scale.right, -0.5) and self._head_dim(scale.left, *qk))
                return (*qk, None if default else scale)
            return None
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
            qk = self._qk(node.left)
            if qk is None:
                return None
            if self._sqrt_head_dim(node.right, *qk):
                return (*qk, None)
            divisor = node.right.with_changes(lpar=[], rpar=[])
            atom = isinstance(divisor, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float))
            return (*qk, cst.parse_expression(f"1.0 / {_code(divisor)}" if atom else f"1.0 / ({_code(divisor)})"))
        return None

    def _causal(self, node, binds: _Bindings, own) -> cst.SimpleStatementLine | bool:
        """Whether a ``masked_fill`` mask hides exactly the future; the mask's own line where it has one."""
        need, inner = "triu", node
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            need, inner = "tril", node.expression
        elif isinstance(node, cst.Comparison) and len(node.comparisons) == 1 \
                and isinstance(node.comparisons[0].operator, cst.Equal) \
                and (_number(node.comparisons[0].comparator, 0) or _name(node.comparisons[0].comparator, "False")):
            need, inner = "tril", node.left
        elif isinstance(node, cst.Call) and (_positional(node) == [] and isinstance(node.func, cst.Attribute)
                                             and node.func.attr.value == "logical_not"):
            need, inner = "tril", node.func.value
        line = binds.single(inner.value) if isinstance(inner, cst.Name) else None
        if line is not None and line not in own:    # bound in a nested function: not this mask
            return False
        value = _assign(line)[1] if line is not None else inner
        while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and (
                (value.func.attr.value == "bool" and not value.args) or value.func.attr.value == "to"):
            value = value.func.value
        found = _triangle(value, self.qn)
        if found is None or found[0] != need or not _same(found[1].args[0].value, found[1].args[1].value):
            return False
        return line if line is not None else True

    def _softmax_of(self, node, name: str) -> bool:
        if not isinstance(node, cst.Call) or any(a.star for a in node.args):
            return False
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "softmax" and _name(node.func.value, name):
            rest = node.args
        elif self.qn(node.func) & {"torch.softmax", "torch.nn.functional.softmax"} and node.args \
                and node.args[0].keyword is None and _name(node.args[0].value, name):
            rest = node.args[1:]
        else:
            return False
        return len(rest) == 1 and (rest[0].keyword is None or rest[0].keyword.value == "dim") \
            and _number(rest[0].value, -1)

    def _times_v(self, stmt, left_ok: Callable) -> list:
        """The ``x @ v`` (or ``torch.matmul(x, v)``) nodes in ``stmt`` whose x passes ``left_ok``."""
        def pred(node):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
                return left_ok(node.left) and _simple(node.right)
            return isinstance(node, cst.Call) and "torch.matmul" in self.qn(node.func) \
                and len(_positional(node) or ()) == 2 and left_ok(node.args[0].value) and _simple(node.args[1].value)
        return _find(stmt, pred)

    def _match(self, func, binds: _Bindings, own, body, i) -> dict | None:
        first = _assign(body[i])
        if first is None or self._scores(first[1]) is None:
            return None
        scores, (q, k, scale) = first[0], self._scores(first[1])
        fill = body[i + 1]
        call = _fill_call(fill, scores)
        if call is None or not _neg_inf(call.args[1].value, self.qn) or not all(map(_simple, (q, k))):
            return None
        mask_line = self._causal(call.args[0].value, binds, own)
        if mask_line is False:
            return None
        stmts, final = [body[i], fill], body[i + 2]
        found = self._times_v(final, lambda x: self._softmax_of(x, scores))
        weights = _assign(final)
        if not found and weights is not None and self._softmax_of(weights[1], scores) and i + 3 < len(body):
            stmts.append(final)
            final = body[i + 3]
            found = self._times_v(final, lambda x: _name(x, weights[0]))
        if len(found) != 1:
            return None
        product = found[0]
        v = product.right if isinstance(product, cst.BinaryOperation) else product.args[1].value
        moved = _counts(q, k, v, *([scale] if scale is not None else []))
        temps = {scores} | ({weights[0]} if len(stmts) == 3 else set())
        whole, local = _counts(func), _counts(*stmts, final)
        if any(whole[t] != local[t] or moved[t] for t in temps):
            return None
        extra = f", scale={_code(scale.with_changes(lpar=[], rpar=[]))}" if scale is not None else ""
        sdpa = cst.parse_expression(f"{self.prefix}.scaled_dot_product_attention("
                                    f"{_code(q)}, {_code(k)}, {_code(v)}, is_causal=True{extra})")
        edits = {stmt: cst.RemovalSentinel.REMOVE for stmt in stmts}
        edits[product] = sdpa.with_changes(lpar=product.lpar, rpar=product.rpar)
        if isinstance(mask_line, cst.SimpleStatementLine):
            edits.update(_dead_lines(func, binds, body, mask_line, [fill]))
        return edits


def _fill_call(line: cst.CSTNode, scores: str) -> cst.Call | None:
    """The call in ``s = s.masked_fill(mask, value)`` or ``s.masked_fill_(mask, value)``."""
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    stmt = line.body[0]
    if isinstance(stmt, cst.Expr):
        call, method = stmt.value, "masked_fill_"
    elif _assign(line) is not None and _assign(line)[0] == scores:
        call, method = stmt.value, "masked_fill"
    else:
        return None
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == method \
            and _name(call.func.value, scores) and len(_positional(call) or ()) == 2:
        return call
    return None


def _neg_inf(node: cst.CSTNode, qn) -> bool:
    """``float("-inf")``, ``-float("inf")``, ``-math.inf`` or ``-torch.inf``."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = node.expression
        if qn(inner) & {"math.inf", "torch.inf"}:
            return True
        return _float_of(inner) == "inf"
    return _float_of(node) == "-inf"


def _float_of(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.Call) and _name(node.func, "float") and len(_positional(node) or ()) == 1 \
            and isinstance(node.args[0].value, cst.SimpleString):
        return str(node.args[0].value.evaluated_value).lower()
    return None


def _dead_lines(func, binds: _Bindings, body, line, users) -> dict:
    """REMOVE edits for ``line`` (a pure ``name = value``) once ``users`` go, then for the sizes it used."""
    name, value = _assign(line)
    if line not in body or _counts(func)[name] != _counts(line, *users)[name]:
        return {}
    edits = {line: cst.RemovalSentinel.REMOVE}
    for size in set(_counts(value)):
        size_line = binds.single(size)
        if size_line is not None and size_line is not line and size_line in body \
                and _pure(_assign(size_line)[1]) and _counts(func)[size] == _counts(size_line, line)[size]:
            edits[size_line] = cst.RemovalSentinel.REMOVE
    return edits


def _pure(node: cst.CSTNode) -> bool:
    """Simple, or ``x.size(...)`` of simple arguments: nothing lost by not evaluating it."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size":
        args = _positional(node)
        return args is not None and _simple(node.func.value) and all(map(_simple, args))
    return _simple(node)


def _sdpa_attention(module: cst.Module) -> cst.Module:
    prefix = _functional_prefix(module)
    if prefix is None:
        return module
    wrapper = MetadataWrapper(module)
    finder = _FindAttention(prefix)
    wrapper.visit(finder)
    return wrapper.module.visit(_Edits(finder.edits)) if finder.edits else module


# ---------------------------------------------------------------- foreach-optimizer

_OPTIMIZERS = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam")
_OPTIMIZER_NAMES = {f"torch.optim.{n}" for n in _OPTIMIZERS} | {f"torch.optim.{n.lower()}.{n}" for n in _OPTIMIZERS}
# Already chosen an implementation, or asked for one foreach cannot give (autograd through the step).
_IMPLEMENTATION_KEYWORDS = {"foreach", "fused", "differentiable"}


def _append_arg(args: list[cst.Arg], new: cst.Arg) -> list[cst.Arg]:
    """``args`` plus ``new`` at the end, laid out like the last separator (and trailing comma) there."""
    last = args[-1]
    sep = args[-2].comma if len(args) > 1 else None
    if not isinstance(sep, cst.Comma):
        sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if isinstance(last.comma, cst.Comma):
        return [*args[:-1], last.with_changes(comma=sep), new.with_changes(comma=last.comma)]
    return [*args[:-1], last.with_changes(comma=sep), new]


class _AddForeach(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        names = {q.name for q in self.get_metadata(QualifiedNameProvider, original_node.func, set())}
        args = list(updated_node.args)
        if not names & _OPTIMIZER_NAMES or not args or any(
                a.star == "**" or (a.keyword is not None and a.keyword.value in _IMPLEMENTATION_KEYWORDS)
                for a in args):
            return updated_node
        foreach = cst.ensure_type(cst.parse_expression("f(foreach=True)"), cst.Call).args[0]
        return updated_node.with_changes(args=_append_arg(args, foreach))


def _foreach_optimizer(module: cst.Module) -> cst.Module:
    return MetadataWrapper(module).visit(_AddForeach())


# ---------------------------------------------------------------- cached-causal-mask

# Calls that could keep the shared mask or change it: then it is not safe to share.
_KEEPERS = {"register_buffer", "Parameter", "Buffer", "setattr", "append", "extend", "insert", "add", "update",
            "setdefault"}

_MASK_HELPER = '''@functools.lru_cache(maxsize=32)
def {name}(rows, cols, dtype, device):
    """The causal mask, built once per size, dtype and device and shared: never modify it in place."""
    return torch.tril(torch.ones(rows, cols, dtype=dtype, device=device))
'''


class _FindMasks(_Qualified):
    """``torch.tril(torch.ones(a, b, dtype=.., device=..))`` built in a function (not ``__init__``),
    with simple arguments, whose result is only read there."""

    def __init__(self) -> None:
        super().__init__()
        self.functions: list[cst.FunctionDef] = []
        self.found: list[tuple[cst.Call, list, dict]] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.functions.pop()

    def visit_Call(self, node: cst.Call) -> None:
        if not self.functions or self.functions[-1].name.value == "__init__":
            return
        found = _triangle(node, self.qn)
        if found is None or found[0] != "tril":
            return
        sizes = [a.value for a in found[1].args if a.keyword is None]
        extra = {a.keyword.value: a.value for a in found[1].args if a.keyword is not None}
        if all(map(_simple, sizes)) and set(extra) <= {"dtype", "device"} \
                and all(_simple(v) or isinstance(v, cst.SimpleString) for v in extra.values()) \
                and self._only_read(node, self.functions[-1]):
            self.found.append((node, sizes, extra))

    def _parent(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.get_metadata(ParentNodeProvider, node)

    def _only_read(self, call: cst.Call, func: cst.FunctionDef) -> bool:
        parent = self._parent(call)
        if isinstance(parent, (cst.UnaryOperation, cst.Comparison, cst.ComparisonTarget)):
            return True
        if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1
                and isinstance(parent.targets[0].target, cst.Name)):
            return False
        name = parent.targets[0].target.value
        if _bindings(func).single(name) is None:
            return False
        uses = [n for n in _find(func, lambda n: _name(n, name)) if _is_use(n, self._parent(n))]
        return all(self._read(n) for n in uses)

    def _read(self, node: cst.Name) -> bool:
        """Whether this use of the mask only reads it: no in-place op, no escape from the function."""
        parent = self._parent(node)
        if isinstance(parent, (cst.AssignTarget, cst.UnaryOperation, cst.BinaryOperation, cst.Comparison,
                               cst.ComparisonTarget, cst.Index)):
            return True
        if isinstance(parent, cst.Attribute):
            return not parent.attr.value.endswith("_") and parent.attr.value != "data"
        if isinstance(parent, cst.Subscript):
            return not isinstance(self._parent(parent), (cst.AssignTarget, cst.AugAssign))
        if isinstance(parent, cst.Arg) and parent.star == "" and (parent.keyword is None
                                                                  or parent.keyword.value != "out"):
            func = self._parent(parent).func
            label = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", "")
            return label not in _KEEPERS
        return False


def _import_at(body: list, before: int) -> int:
    """Where ``import functools`` goes among the top-level imports above ``before``, isort's way."""
    imports = [(i, line.body[0]) for i, line in enumerate(body[:before]) if isinstance(line, cst.SimpleStatementLine)
               and isinstance(line.body[0], (cst.Import, cst.ImportFrom))
               and not (isinstance(line.body[0], cst.ImportFrom) and line.body[0].module is not None
                        and _code(line.body[0].module) == "__future__")]

    def root(stmt) -> str:
        name = stmt.names[0].name if isinstance(stmt, cst.Import) else stmt.module
        return _code(name).split(".")[0] if name is not None else ""
    std = [(i, s) for i, s in imports if root(s) in sys.stdlib_module_names]
    for i, stmt in std:
        if isinstance(stmt, cst.ImportFrom) or _code(stmt.names[0].name) > "functools":
            return i
    if std:
        return std[-1][0] + 1
    return imports[0][0] if imports else before


def _insert(body: list, at: int, line: cst.BaseStatement, blank_after: int) -> None:
    """Insert ``line`` before ``body[at]``, taking over the blank lines above it."""
    if at < len(body):
        ahead = body[at].leading_lines
        blank = 0
        while blank < len(ahead) and ahead[blank].comment is None:
            blank += 1
        line = line.with_changes(leading_lines=ahead[:blank])
        body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine()] * blank_after + list(ahead[blank:]))
    body.insert(at, line)


def _cached_causal_mask(module: cst.Module) -> cst.Module:
    if not _module_binds_torch(module):
        return module
    wrapper = MetadataWrapper(module)
    finder = _FindMasks()
    wrapper.visit(finder)
    if not finder.found:
        return module
    taken = _counts(wrapper.module)
    helper = next(n for n in ("_causal_mask", "_causal_mask_cached", *(f"_causal_mask_{i}" for i in range(2, 99)))
                  if not taken[n])
    edits = {}
    for call, (rows, cols), extra in finder.found:
        args = [_code(rows), _code(cols), *(_code(extra[k]) if k in extra else "None" for k in ("dtype", "device"))]
        edits[call] = cst.parse_expression(f"{helper}({', '.join(args)})").with_changes(lpar=call.lpar,
                                                                                          rpar=call.rpar)
    first = finder.found[0][0]
    while wrapper.resolve(ParentNodeProvider)[first] is not wrapper.module:
        first = wrapper.resolve(ParentNodeProvider)[first]
    at = list(wrapper.module.body).index(first)
    new = wrapper.module.visit(_Edits(edits))
    body = list(new.body)
    config = new.config_for_parsing
    _insert(body, at, cst.parse_statement(_MASK_HELPER.format(name=helper), config), blank_after=2)
    binds_functools = any(isinstance(s, cst.Import) and any(_code(a.name) == "functools" and a.asname is None
                                                            for a in s.names)
                          for line in body if isinstance(line, cst.SimpleStatementLine) for s in line.body)
    if not binds_functools:
        _insert(body, _import_at(body, at), cst.parse_statement("import functools\n", config), blank_after=0)
    return new.with_changes(body=body)


# ---------------------------------------------------------------- no-checkpoint

_CHECKPOINT_ONLY = {"use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug"}


class _Uncheckpoint(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        names = {q.name for q in self.get_metadata(QualifiedNameProvider, original_node.func, set())}
        args = updated_node.args
        if "torch.utils.checkpoint.checkpoint" not in names or not args or args[0].keyword is not None \
                or args[0].star or any(a.star == "**" for a in args):
            return updated_node
        fn = args[0].value
        if not isinstance(fn, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not fn.lpar:
            fn = fn.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        kept = [a for a in args[1:] if a.keyword is None or a.keyword.value not in _CHECKPOINT_ONLY]
        if kept:
            kept[-1] = kept[-1].with_changes(comma=args[-1].comma)
        return updated_node.with_changes(func=fn, args=kept)


def _no_checkpoint(module: cst.Module) -> cst.Module:
    new = MetadataWrapper(module).visit(_Uncheckpoint())
    if new.deep_equals(module):
        return module
    context = CodemodContext()
    for line in new.body:
        for stmt in line.body if isinstance(line, cst.SimpleStatementLine) else ():
            if isinstance(stmt, cst.ImportFrom) and stmt.module is not None \
                    and _code(stmt.module) == "torch.utils.checkpoint" and not isinstance(stmt.names, cst.ImportStar):
                for alias in stmt.names:
                    if _code(alias.name) == "checkpoint":
                        asname = _code(alias.asname.name) if alias.asname is not None else None
                        RemoveImportsVisitor.remove_unused_import(context, "torch.utils.checkpoint", "checkpoint",
                                                                  asname)
    return RemoveImportsVisitor(context).transform_module(new)


# ---------------------------------------------------------------- the catalog

CATALOG: tuple[Codemod, ...] = (
    Codemod("sdpa-attention",
            "manual causal softmax attention -> F.scaled_dot_product_attention(is_causal=True): one fused kernel, "
            "no T x T scores or mask materialised",
            _sdpa_attention),
    Codemod("foreach-optimizer",
            "torch.optim optimizers get foreach=True: one multi-tensor kernel per update step instead of a "
            "Python loop over parameters",
            _foreach_optimizer),
    Codemod("cached-causal-mask",
            "the causal tril(ones(T, T)) mask built on every forward is built once per size, dtype and device "
            "(functools.lru_cache)",
            _cached_causal_mask),
    Codemod("no-checkpoint",
            "activation checkpointing off: checkpoint(fn, *args) -> fn(*args), no recomputed forward in "
            "backward, at the cost of keeping the activations",
            _no_checkpoint),
)


def _lines(text: str) -> list[str]:
    """Lines split at ``\\n`` only (str.splitlines also splits at form feeds and the like)."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def unified_diff(path: str, before: str, after: str) -> str:
    """One file's change as ``git apply`` reads it: ``a/``/``b/`` paths, 3 lines of context."""
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in difflib.unified_diff(_lines(before), _lines(after), f"a/{path}", f"b/{path}", n=3):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _plain_path(path: str) -> bool:
    """A path git writes unquoted in a diff header; others would need git's quoting."""
    return path.isascii() and path.isprintable() and not any(c in path for c in ' \t"\\')


class CatalogProposer:
    """One proposal per codemod that changes at least one editable file: a diff over all it changed."""

    name = "catalog"

    def __init__(self, codemods: tuple[Codemod, ...] = CATALOG) -> None:
        self.codemods = codemods

    def propose(self, context: ProposalContext) -> list[Proposal]:
        out = []
        for codemod in self.codemods:
            diffs = []
            for path, text in sorted(context.editable.items()):
                after = codemod.transform(text) if _plain_path(path) else None
                if after is not None:
                    diffs.append(unified_diff(path, text, after))
            if diffs:
                out.append(Proposal(PatchRef(f"catalog:{codemod.name}", "".join(diffs)), self.name,
                                    codemod.description))
        return out
