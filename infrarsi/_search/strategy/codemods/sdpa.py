"""The sdpa-attention codemod: manual causal softmax attention becomes one
``scaled_dot_product_attention(q, k, v, is_causal=True)`` call, under the name the module already
gives ``torch.nn.functional``.

It matches, in one block of one function: ``s = (q @ k^T) * scale``; the ``masked_fill`` of ``s``
with -inf under a mask that hides exactly the future; and ``softmax(s, -1) @ v``, directly or through
a weights line. The call keeps a scale that is not SDPA's default ``1/sqrt(head_dim)``. The mask's own
line, and the size lines only it used, go where nothing else reads them. The sibling branches of an
``if`` holding the match may reuse its names (``if attn == "manual": ... else: sdpa(...)``).

Why one module: the matcher's steps (scores, fill, mask, softmax, product with v) each either match
or give the reason the search reports, and they read as one sequence; split, each half would need
the other's state.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider

from ._cst import (
    Bindings,
    Edits,
    Notes,
    Qualified,
    bindings_of,
    binds_torch,
    causal_triangle,
    find_all,
    is_name,
    is_number,
    is_simple,
    name_counts,
    positional_args,
    same_code,
    simple_assign,
    source_of,
)

__all__ = ["sdpa_attention"]


def _functional_prefix(module: cst.Module) -> str | None:
    """How this module names ``torch.nn.functional``: its alias, the full path, or None."""
    for line in module.body:
        for stmt in line.body if isinstance(line, cst.SimpleStatementLine) else ():
            if isinstance(stmt, cst.Import):
                for alias in stmt.names:
                    if source_of(alias.name) == "torch.nn.functional" and alias.asname is not None:
                        return source_of(alias.asname.name)
            elif (
                isinstance(stmt, cst.ImportFrom)
                and stmt.module is not None
                and source_of(stmt.module) == "torch.nn"
                and not isinstance(stmt.names, cst.ImportStar)
            ):
                for alias in stmt.names:
                    if source_of(alias.name) == "functional":
                        return source_of(alias.asname.name) if alias.asname is not None else "functional"
    return "torch.nn.functional" if binds_torch(module) else None


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


class _FindAttention(Qualified):
    """Finds ``s = (q @ k^T) * scale; s = s.masked_fill(<causal>, -inf); softmax(s, -1) @ v``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix, self.edits = prefix, {}
        self.notes: Notes = []  # attention scores seen and not rewritten, with the reason

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        blocks, binds = _Blocks(node), bindings_of(node)
        node.visit(blocks)
        own = {stmt for body in blocks.blocks for stmt in body}
        for body in blocks.blocks:
            for i in range(len(body)):
                first = simple_assign(body[i])
                if first is None or self._scores(first[1]) is None:
                    continue
                why = self._match(node, binds, own, body, i)
                if isinstance(why, str):
                    self.notes.append((self.line(body[i]), f"attention scores in {node.name.value}(): {why}"))
                else:
                    self.edits.update(why)
                    break

    def _qk(self, node) -> tuple | None:
        """``(q, k)`` for ``q @ k.transpose(-2, -1)`` (or ``torch.matmul``, or ``k.mT``)."""
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            left, right = node.left, node.right
        elif (
            isinstance(node, cst.Call)
            and "torch.matmul" in self.qn(node.func)
            and len(positional_args(node) or ()) == 2
        ):
            left, right = positional_args(node)
        else:
            return None
        if isinstance(right, cst.Attribute) and right.attr.value == "mT":
            return left, right.value
        if (
            isinstance(right, cst.Call)
            and isinstance(right.func, cst.Attribute)
            and right.func.attr.value == "transpose"
        ):
            dims = positional_args(right) or []
            if len(dims) == 2 and (
                (is_number(dims[0], -2) and is_number(dims[1], -1))
                or (is_number(dims[0], -1) and is_number(dims[1], -2))
            ):
                return left, right.func.value
        return None

    def _parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.get_metadata(ParentNodeProvider, node, None)

    def _within(self, node: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        while node is not None and node is not ancestor:
            node = self._parent(node)
        return node is ancestor

    def _only_in_sibling_branches(self, func, stmt, name: str, matched: list) -> bool:
        """Whether every use of ``name`` outside the ``matched`` statements sits in another branch of
        the if/elif/else whose branch holds ``stmt`` (and no loop encloses it): those never read
        what the matched statements computed, the usual ``if attn == "manual": ... else: ...``."""
        block = self._parent(stmt)
        branch = self._parent(block) if block is not None else None
        if not isinstance(branch, (cst.If, cst.Else)):
            return False
        top = branch
        while isinstance(self._parent(top), cst.If) and self._parent(top).orelse is top:
            top = self._parent(top)
        node = top
        while node is not None and node is not func:
            node = self._parent(node)
            if isinstance(node, (cst.For, cst.While)):
                return False
        for use in find_all(func, lambda n: is_name(n, name)):
            if any(self._within(use, m) for m in matched):
                continue
            if not self._within(use, top) or self._within(use, block):
                return False
        return True

    def _head_dim(self, node, q, k) -> bool:
        """``x.shape[-1]`` or ``x.size(-1)`` for x the query or the key: SDPA's default scale uses it."""
        x = None
        if (
            isinstance(node, cst.Subscript)
            and len(node.slice) == 1
            and isinstance(node.slice[0].slice, cst.Index)
            and is_number(node.slice[0].slice.value, -1)
            and isinstance(node.value, cst.Attribute)
            and node.value.attr.value == "shape"
        ):
            x = node.value.value
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "size"
            and len(positional_args(node) or ()) == 1
            and is_number(node.args[0].value, -1)
        ):
            x = node.func.value
        return x is not None and (same_code(x, q) or same_code(x, k))

    def _sqrt_head_dim(self, node, q, k) -> bool:
        return (
            isinstance(node, cst.Call)
            and "math.sqrt" in self.qn(node.func)
            and len(positional_args(node) or ()) == 1
            and self._head_dim(node.args[0].value, q, k)
        )

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
                default = (
                    isinstance(scale, cst.BinaryOperation)
                    and isinstance(scale.operator, cst.Divide)
                    and is_number(scale.left, 1)
                    and self._sqrt_head_dim(scale.right, *qk)
                ) or (
                    isinstance(scale, cst.BinaryOperation)
                    and isinstance(scale.operator, cst.Power)
                    and is_number(scale.right, -0.5)
                    and self._head_dim(scale.left, *qk)
                )
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
            return (
                *qk,
                cst.parse_expression(f"1.0 / {source_of(divisor)}" if atom else f"1.0 / ({source_of(divisor)})"),
            )
        return None

    def _causal(self, node, binds: Bindings, own) -> cst.SimpleStatementLine | bool:
        """Whether a ``masked_fill`` mask hides exactly the future; the mask's own line where it has one."""
        need, inner = "triu", node
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
            need, inner = "tril", node.expression
        elif (
            isinstance(node, cst.Comparison)
            and len(node.comparisons) == 1
            and isinstance(node.comparisons[0].operator, cst.Equal)
            and (is_number(node.comparisons[0].comparator, 0) or is_name(node.comparisons[0].comparator, "False"))
        ):
            need, inner = "tril", node.left
        elif isinstance(node, cst.Call) and (
            positional_args(node) == []
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "logical_not"
        ):
            need, inner = "tril", node.func.value
        line = binds.single(inner.value) if isinstance(inner, cst.Name) else None
        if line is not None and line not in own:  # bound in a nested function: not this mask
            return False
        value = simple_assign(line)[1] if line is not None else inner
        while (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and ((value.func.attr.value == "bool" and not value.args) or value.func.attr.value == "to")
        ):
            value = value.func.value
        found = causal_triangle(value, self.qn)
        if found is None or found[0] != need or not same_code(found[1].args[0].value, found[1].args[1].value):
            return False
        return line if line is not None else True

    def _softmax_of(self, node, name: str) -> bool:
        if not isinstance(node, cst.Call) or any(a.star for a in node.args):
            return False
        if (
            isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "softmax"
            and is_name(node.func.value, name)
        ):
            rest = node.args
        elif (
            self.qn(node.func) & {"torch.softmax", "torch.nn.functional.softmax"}
            and node.args
            and node.args[0].keyword is None
            and is_name(node.args[0].value, name)
        ):
            rest = node.args[1:]
        else:
            return False
        return (
            len(rest) == 1
            and (rest[0].keyword is None or rest[0].keyword.value == "dim")
            and is_number(rest[0].value, -1)
        )

    def _times_v(self, stmt, left_ok: Callable) -> list:
        """The ``x @ v`` (or ``torch.matmul(x, v)``) nodes in ``stmt`` whose x passes ``left_ok``."""

        def pred(node):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
                return left_ok(node.left) and is_simple(node.right)
            return (
                isinstance(node, cst.Call)
                and "torch.matmul" in self.qn(node.func)
                and len(positional_args(node) or ()) == 2
                and left_ok(node.args[0].value)
                and is_simple(node.args[1].value)
            )

        return find_all(stmt, pred)

    def _match(self, func, binds: Bindings, own, body, i) -> dict | str:
        """The edits for the attention whose scores line is ``body[i]``, or why there are none."""
        first = simple_assign(body[i])
        scores, (q, k, scale) = first[0], self._scores(first[1])
        if i + 2 >= len(body):
            return "the block ends before the mask, softmax and product with v"
        fill = body[i + 1]
        call = _fill_call(fill, scores)
        if call is None:
            return f"the next statement is not {scores}.masked_fill(mask, -inf) (no mask, or an additive one)"
        if not _neg_inf(call.args[1].value, self.qn):
            return f"the mask fills with {source_of(call.args[1].value)}, not -inf"
        if not all(map(is_simple, (q, k))):
            return "the query or key is an expression, not a name"
        mask_line = self._causal(call.args[0].value, binds, own)
        if mask_line is False:
            return (
                f"the mask {source_of(call.args[0].value)} is not visibly causal (a tril/triu of ones(T, T) built in "
                "this function; a registered buffer or a mask passed in can't be checked)"
            )
        stmts, final = [body[i], fill], body[i + 2]
        found = self._times_v(final, lambda x: self._softmax_of(x, scores))
        weights = simple_assign(final)
        if not found and weights is not None and self._softmax_of(weights[1], scores) and i + 3 < len(body):
            stmts.append(final)
            final = body[i + 3]
            found = self._times_v(final, lambda x: is_name(x, weights[0]))
        if len(found) != 1:
            return (
                f"softmax({scores}, dim=-1) is not followed directly by a product with v "
                "(dropout on the weights, or other work between, changes what SDPA would compute)"
            )
        product = found[0]
        v = product.right if isinstance(product, cst.BinaryOperation) else product.args[1].value
        moved = name_counts(q, k, v, *([scale] if scale is not None else []))
        temps = {scores} | ({weights[0]} if len(stmts) == 3 else set())
        whole, local = name_counts(func), name_counts(*stmts, final)
        if any(moved[t] for t in temps) or not all(
            whole[t] == local[t] or self._only_in_sibling_branches(func, body[i], t, [*stmts, final]) for t in temps
        ):
            return f"{' or '.join(sorted(temps))} is read elsewhere in the function (the rewrite would drop it)"
        extra = f", scale={source_of(scale.with_changes(lpar=[], rpar=[]))}" if scale is not None else ""
        sdpa = cst.parse_expression(
            f"{self.prefix}.scaled_dot_product_attention("
            f"{source_of(q)}, {source_of(k)}, {source_of(v)}, is_causal=True{extra})"
        )
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
    elif simple_assign(line) is not None and simple_assign(line)[0] == scores:
        call, method = stmt.value, "masked_fill"
    else:
        return None
    if (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == method
        and is_name(call.func.value, scores)
        and len(positional_args(call) or ()) == 2
    ):
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
    if (
        isinstance(node, cst.Call)
        and is_name(node.func, "float")
        and len(positional_args(node) or ()) == 1
        and isinstance(node.args[0].value, cst.SimpleString)
    ):
        return str(node.args[0].value.evaluated_value).lower()
    return None


def _dead_lines(func, binds: Bindings, body, line, users) -> dict:
    """REMOVE edits for ``line`` (a pure ``name = value``) once ``users`` go, then for the sizes it used."""
    name, value = simple_assign(line)
    if line not in body or name_counts(func)[name] != name_counts(line, *users)[name]:
        return {}
    edits = {line: cst.RemovalSentinel.REMOVE}
    for size in set(name_counts(value)):
        size_line = binds.single(size)
        if (
            size_line is not None
            and size_line is not line
            and size_line in body
            and _pure(simple_assign(size_line)[1])
            and name_counts(func)[size] == name_counts(size_line, line)[size]
        ):
            edits[size_line] = cst.RemovalSentinel.REMOVE
    return edits


def _pure(node: cst.CSTNode) -> bool:
    """Simple, or ``x.size(...)`` of simple arguments: nothing lost by not evaluating it."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size":
        args = positional_args(node)
        return args is not None and is_simple(node.func.value) and all(map(is_simple, args))
    return is_simple(node)


def sdpa_attention(module: cst.Module, notes: Notes | None = None) -> cst.Module:
    """``module`` with each matched manual attention replaced by one SDPA call; the same object where
    nothing matches or the module cannot name ``torch.nn.functional``. ``notes`` gets the attention
    it saw and did not rewrite, with the reason."""
    prefix = _functional_prefix(module)
    if prefix is None:
        return module
    wrapper = MetadataWrapper(module)
    finder = _FindAttention(prefix)
    wrapper.visit(finder)
    if notes is not None:
        notes.extend(finder.notes)
    return wrapper.module.visit(Edits(finder.edits)) if finder.edits else module
