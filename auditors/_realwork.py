"""Which update work is the job's real work, judged by data flow rather than by call counts.

A patch can move the real ``loss.backward()`` or ``opt.step()`` out of the measured
region and leave a decoy of the same kind inside (a backward on
``torch.zeros(1, requires_grad=True).sum()``, the step of a dummy optimizer over a
dummy tensor). Counting calls by kind can't tell them apart. Here the real work is:

- the *model*: what the baseline's parameters come from (``X`` in ``X.parameters()``),
  found in the patched file by the same constructor (``TinyGPT(cfg)``) or the same
  name, and its wrappers (``torch.compile(model)``, ``DDP(model)``, ``step_fn = model``);
- the *forward*: a call of the model; the *loss*: a value computed from the model's
  output (``.detach()``, ``.item()`` and ``.data`` cut the graph); the *backward*: on
  such a loss;
- the *optimizer*: one built from the model's parameters; its ``step`` and
  ``zero_grad`` (also through a ``GradScaler``) and clipping of the model's gradients.

The anchors come from the baseline, so a patch can't make a dummy model the model by
calling its ``parameters()``. Names are followed within one file, scope-insensitively
but flow-aware where a name is assigned just before its use.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ._loop import LoopModel, Op
from ._source import SourceModel, dotted

__all__ = ["FILTERED_KINDS", "Anchors", "RealWork"]

FILTERED_KINDS = ("forward", "loss", "backward", "clip", "optimizer_step", "zero_grad")
_CUTS = {"detach", "detach_", "item", "tolist", "numpy"}  # results that carry no autograd graph
_NO_GRAPH = ("torch.tensor", "torch.as_tensor", "builtins.float", "builtins.int", "builtins.bool")
_DEPTH = 6
# Methods of a model that don't run it (the rest, model.module(x) or model.compute_loss(x), do).
_NOT_FORWARD = {
    "parameters",
    "named_parameters",
    "buffers",
    "named_buffers",
    "modules",
    "named_modules",
    "children",
    "named_children",
    "zero_grad",
    "train",
    "eval",
    "to",
    "cuda",
    "cpu",
    "half",
    "float",
    "double",
    "bfloat16",
    "type",
    "state_dict",
    "load_state_dict",
    "apply",
    "requires_grad_",
    "no_sync",
    "register_buffer",
    "register_parameter",
    "register_forward_hook",
    "register_forward_pre_hook",
    "register_full_backward_hook",
    "get_submodule",
    "get_parameter",
    "share_memory",
    "extra_repr",
    "configure_optimizers",
    "numel",
    "num_parameters",
}


def _root_call(value: cst.CSTNode) -> cst.CSTNode:
    """``TinyLM(cfg)`` in ``TinyLM(cfg).to(device).train()``."""
    while (
        isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and isinstance(value.func.value, cst.Call)
    ):
        value = value.func.value
    return value


@dataclass(frozen=True)
class _Def:
    """Where a name gets a value, and the expression it gets it from."""

    node: cst.CSTNode  # the statement, the ``for`` or the ``append`` call
    value: cst.CSTNode


def _assignments(source: SourceModel) -> dict[str, list[_Def]]:
    """What binds each dotted name: assignments, ``for`` targets (from the iterable), ``X.append(v)``."""
    cached = source.memo.get("definitions")
    if cached is None:
        cached = {}
        for node in source.of_type(cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor):
            if isinstance(node, (cst.For, cst.CompFor)):
                targets, value = [node.target], node.iter
            else:
                value = getattr(node, "value", None)
                targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            if value is None:
                continue
            for target in targets:
                elements = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
                for element in elements:
                    if (name := dotted(element)) is not None:
                        cached.setdefault(name, []).append(_Def(node, value))
        for node in source.of_type(cst.Call):
            func = node.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in ("append", "extend", "insert")
                and node.args
                and (name := dotted(func.value)) is not None
            ):
                cached.setdefault(name, []).append(_Def(node, node.args[-1].value))
        source.memo["definitions"] = cached
    return cached


@dataclass(frozen=True)
class Anchors:
    """What the baseline says the model is: its names and the constructors that build it."""

    names: frozenset[str]
    constructors: frozenset[str]
    unbuilt: frozenset[str]  # model names the baseline never assigns (parameters, globals from elsewhere)

    @classmethod
    def of(cls, baseline: SourceModel) -> Anchors | None:
        names = set()
        for call in baseline.of_type(cst.Call):
            if (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value in ("parameters", "named_parameters")
                and (name := dotted(call.func.value)) is not None
            ):
                names.add(name)
        if not names:
            return None
        assigned = _assignments(baseline)
        constructors, unbuilt = set(), set()
        for name in names:
            defs = assigned.get(name, [])
            if not defs:
                unbuilt.add(name)
            for d in defs:
                root = _root_call(d.value)
                if isinstance(root, cst.Call) and (callee := dotted(root.func)) is not None:
                    constructors.add(callee)
                elif (alias := dotted(root)) is not None:
                    unbuilt.add(alias)
        return cls(frozenset(names), frozenset(constructors), frozenset(unbuilt))


class RealWork:
    """Answers ``real(op)`` for the ops of one file's LoopModel, against the baseline's anchors."""

    def __init__(self, loops: LoopModel, anchors: Anchors) -> None:
        self.loops, self.source, self.anchors = loops, loops.source, anchors
        self.assigned = _assignments(self.source)
        self.models = self._models()
        self._reads: dict[str, bool] = {}
        self._reaches: dict[int, bool] = {}
        self._optimizers: dict[str, bool] = {}

    # -- the model and its optimizer ---------------------------------------------------------
    def _models(self) -> set[str]:
        found = set(self.anchors.unbuilt)
        for name, defs in self.assigned.items():
            for d in defs:
                root = _root_call(d.value)
                if (
                    isinstance(d.node, cst.Assign)
                    and isinstance(root, cst.Call)
                    and dotted(root.func) in self.anchors.constructors
                ):
                    found.add(name)
        for _ in range(4):  # wrappers and aliases: step_fn = torch.compile(model), ddp = DDP(model)
            grown = set(found)
            for name, defs in self.assigned.items():
                for d in defs:
                    if not isinstance(d.node, (cst.Assign, cst.AnnAssign)):
                        continue
                    root = _root_call(d.value)
                    wrapped = [a.value for a in root.args if a.keyword is None] if isinstance(root, cst.Call) else []
                    if (
                        dotted(root) in found
                        or any(dotted(a) in found for a in wrapped)
                        or (
                            isinstance(root, cst.Call)
                            and isinstance(root.func, cst.Attribute)
                            and dotted(root.func.value) in found
                        )
                    ):
                        grown.add(name)
            if grown == found:
                break
            found = grown
        return found

    def _names_in(self, expr: cst.CSTNode) -> list[str]:
        return [
            n
            for node in self.source.descendants(expr)
            if isinstance(node, (cst.Name, cst.Attribute)) and (n := dotted(node)) is not None
        ]

    def reads_model(self, expr: cst.CSTNode, depth: int = 0) -> bool:
        """Does ``expr`` read the model (its parameters), directly or through names assigned from it?"""
        for name in self._names_in(expr):
            if name in self.models or any(name.startswith(m + ".") for m in self.models):
                return True
            if depth < _DEPTH and name in self.assigned and self._name_reads_model(name, depth):
                return True
        return False

    def _name_reads_model(self, name: str, depth: int) -> bool:
        if name not in self._reads:
            self._reads[name] = False
            self._reads[name] = any(self.reads_model(d.value, depth + 1) for d in self.assigned.get(name, []))
        return self._reads[name]

    def _builds_from_model(self, value: cst.CSTNode) -> bool:
        return isinstance(_root_call(value), cst.Call) and self.reads_model(value)

    def _unknown(self, name: str) -> bool:
        """A name the file never binds (a parameter, a global from elsewhere): it may be the real thing."""
        root = name.split(".")[0]
        return (
            name not in self.assigned
            and root not in self.assigned
            and root not in self.loops.functions
            and not any(bound == root for _, _, bound in self.source.imports())
        )

    def optimizer_name(self, name: str) -> bool:
        """A name assigned from a call that reads the model: ``opt = AdamW(model.parameters())``."""
        if name not in self._optimizers:
            self._optimizers[name] = any(
                self._builds_from_model(d.value)
                for d in self.assigned.get(name, [])
                if isinstance(d.node, (cst.Assign, cst.AnnAssign))
            )
        return self._optimizers[name]

    def is_optimizer(self, expr: cst.CSTNode | None) -> bool:
        name = dotted(expr) if expr is not None else None
        return name is not None and (name in self.models or self.optimizer_name(name) or self._unknown(name))

    # -- the model's output ------------------------------------------------------------------------
    def is_forward(self, call: cst.CSTNode) -> bool:
        if not isinstance(call, cst.Call):
            return False
        callee = dotted(call.func)
        if callee is not None and (
            callee in self.models or (callee.endswith(".forward") and callee[: -len(".forward")] in self.models)
        ):
            return True
        if callee is not None and self._unknown(callee) and self.loops.work.is_model_call(call):
            return True
        if callee is not None and "." in callee:  # model.module(x), model.compute_loss(x, y): still the model
            owner, method = callee.rsplit(".", 1)
            if owner in self.models and method not in _NOT_FORWARD:
                return True
        args = [a.value for a in call.args if a.keyword is None]
        return (
            bool(args)
            and self.source.resolves_to(call.func, "torch.utils.checkpoint")
            and dotted(args[0]) in self.models
        )

    def reaches_output(self, expr: cst.CSTNode, depth: int = 0) -> bool:
        """Is ``expr`` computed from the model's output, with the autograd graph intact?"""
        key = id(expr)
        if key in self._reaches:
            return self._reaches[key]
        self._reaches[key] = False
        found = depth <= _DEPTH and self._reaches_output(expr, depth)
        self._reaches[key] = found
        return found

    def _reaches_output(self, expr: cst.CSTNode, depth: int) -> bool:
        src = self.source
        stack = [expr]
        while stack:
            node = stack.pop()
            if isinstance(node, (cst.Lambda, cst.FunctionDef)):
                continue
            if isinstance(node, cst.Attribute) and node.attr.value == "data":
                continue
            if isinstance(node, cst.Call):
                if isinstance(node.func, cst.Attribute) and node.func.attr.value in _CUTS:
                    continue
                if src.resolves_to(node.func, *_NO_GRAPH):
                    continue
                if self.is_forward(node):
                    return True
                if any(self.reaches_output(r, depth + 1) for r in self._returns(node)):
                    return True
            if (
                isinstance(node, (cst.Name, cst.Attribute))
                and (name := dotted(node)) is not None
                and name in self.assigned
            ):
                if any(self.reaches_output(d.value, depth + 1) for d in self._reaching(name, node)):
                    return True
                if isinstance(node, cst.Attribute):
                    continue  # self._cached: its own assignments decide, not `self`
            stack.extend(src.children(node))
        return False

    def _reaching(self, name: str, use: cst.CSTNode) -> list[_Def]:
        """The definitions of ``name`` that may give its value at ``use``.

        The last one before the use in the same function, when it is an assignment or a ``for``
        in a block that holds the use (so it always runs first); else every definition of the name.
        """
        src, defs = self.source, self.assigned.get(name, [])
        if "." in name:
            return defs
        owner = self.loops.work.owner(use)
        before = [d for d in defs if self.loops.work.owner(d.node) is owner and src.order[d.node] < src.order[use]]
        if before:
            last = max(before, key=lambda d: src.order[d.node])
            if isinstance(last.node, (cst.Assign, cst.AnnAssign, cst.For)):
                block = src.parent.get(src.statement_of(last.node))
                if block is not None and src.inside(use, block):
                    return [last]
        return defs

    def _returns(self, call: cst.Call) -> list[cst.CSTNode]:
        """The returned values of a same-file function or method that ``call`` runs."""
        fns = self.loops.callees(call, None)
        out = []
        for fn in fns:
            if isinstance(fn, cst.Lambda):
                out.append(fn.body)
                continue
            out += [n.value for n in self.source.descendants(fn) if isinstance(n, cst.Return) and n.value is not None]
        return out

    # -- judging one op ----------------------------------------------------------------------------
    def real(self, op: Op) -> bool:
        node, kind, work = op.node, op.kind, self.loops.work
        if kind == "forward":
            value = node.value if isinstance(node, (cst.Assign, cst.AnnAssign)) else node
            return any(self.is_forward(n) for n in self.source.descendants(value))
        if kind == "loss":
            return node.value is not None and self.reaches_output(node.value)
        receiver = (
            node.value
            if isinstance(node, cst.Attribute)
            else (node.func.value if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) else None)
        )
        args = [a.value for a in node.args] if isinstance(node, cst.Call) else []
        if kind == "backward":
            target = (
                receiver
                if receiver is not None and not self.source.resolves_to(node.func, "torch.autograd.backward")
                else (args[0] if args else None)
            )
            return target is not None and self.reaches_output(target)
        if kind == "clip":
            return any(self.reads_model(a) or any(self.optimizer_name(n) for n in self._names_in(a)) for a in args)
        if kind in ("optimizer_step", "zero_grad"):
            name = dotted(receiver) if receiver is not None else None
            if self.is_optimizer(receiver):
                return True
            scaler = name is not None and (name in work.scalers or "scaler" in name.rsplit(".", 1)[-1].lower())
            return scaler and any(self.is_optimizer(a) for a in args)
        return True
