"""The sdpa-attention codemod: manual causal softmax attention becomes one
``scaled_dot_product_attention(q, k, v, is_causal=True)`` call, under the name the module already
gives ``torch.nn.functional``.

It matches, in one block of one function: ``s = (q @ k^T) * scale``; the ``masked_fill`` of ``s``
with -inf under a mask that hides exactly the future; and ``softmax(s, -1) @ v``, directly or through
a weights line. The call keeps a scale that is not SDPA's default ``1/sqrt(head_dim)``. The mask's own
line, and the size lines only it used, go where nothing else reads them.
"""

from __future__ import annotations

from typing import Callable

import libcst as cst
from libcst.metadata import MetadataWrapper

from ._cst import (_assign, _Bindings, _bindings, _code, _counts, _Edits, _find, _module_binds_torch, _name,
                   _number, _positional, _Qualified, _same, _simple, _triangle)

__all__ = ["sdpa_attention"]


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
    """The lower-cased text of ``float("...")``, such as ``"-inf"``; None for anything else."""
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


def sdpa_attention(module: cst.Module) -> cst.Module:
    """``module`` with each matched manual attention replaced by one SDPA call; the same object where
    nothing matches or the module cannot name ``torch.nn.functional``."""
    prefix = _functional_prefix(module)
    if prefix is None:
        return module
    wrapper = MetadataWrapper(module)
    finder = _FindAttention(prefix)
    wrapper.visit(finder)
    return wrapper.module.visit(_Edits(finder.edits)) if finder.edits else module
