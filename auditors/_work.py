"""What each call in a training script does: the update-work kinds, losses, hand-offs.

``UpdateWork`` answers, for one source file, which calls are update work (backward,
clipping, the optimizer or scheduler step, zero_grad, collectives, synchronisation),
which statements compute the loss and the forward pass that feeds it, and which calls
hand work to a thread, process, executor or another CUDA stream.
"""

from __future__ import annotations

import libcst as cst

from ._source import SourceModel, dotted

__all__ = ["UpdateWork", "CLOCKS"]

CLOCKS = (
    "time.perf_counter",
    "time.perf_counter_ns",
    "time.time",
    "time.time_ns",
    "time.monotonic",
    "time.monotonic_ns",
    "time.process_time",
    "time.process_time_ns",
    "timeit.default_timer",
)
_COLLECTIVES = {
    "all_reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "barrier",
    "reduce",
    "all_to_all",
    "all_to_all_single",
}
_HANDOFF_TARGETS = {
    "threading.Thread": "a thread",
    "multiprocessing.Process": "a process",
    "threading.Timer": "a thread",
    "asyncio.to_thread": "a thread",
}
_HANDOFF_METHODS = {
    "submit": "an executor",
    "map": "an executor",
    "apply_async": "a process pool",
    "run_in_executor": "an executor",
}
_BUILTINS = {
    "next",
    "iter",
    "len",
    "list",
    "tuple",
    "dict",
    "zip",
    "enumerate",
    "range",
    "float",
    "int",
    "sum",
    "min",
    "max",
    "abs",
    "round",
    "sorted",
    "print",
    "isinstance",
    "getattr",
}
_ANYWHERE = -1  # a loss alias on an attribute may be computed in any method
_COLLECTORS = {"append", "extend", "insert"}  # a list of losses filled in a loop


class UpdateWork:
    """Classifies the calls and statements of one source file."""

    def __init__(self, source: SourceModel) -> None:
        self.source = source
        self.functions = source.functions()
        self._imported_names: set[str] | None = None
        self._losses: dict[str, list[cst.CSTNode]] | None = None
        self.optimizers, self.schedulers, self.scalers, self.events = self._typed_names()

    def _typed_names(self):
        src = self.source
        opts, scheds, scalers, events = set(), set(), set(), set()
        for node in src.of_type(cst.Assign):
            if not isinstance(node.value, cst.Call):
                continue
            names = {n for n in (dotted(t.target) for t in node.targets) if n}
            if src.resolves_to(node.value, "torch.optim.lr_scheduler"):
                scheds |= names
            elif src.resolves_to(node.value, "torch.optim"):
                opts |= names
            elif any(q.endswith("GradScaler") for q in src.qnames(node.value)):
                scalers |= names
            elif src.resolves_to(node.value, "torch.cuda.Event", "torch.Event"):
                events |= names
        return opts, scheds, scalers, events

    def kind(self, call: cst.Call) -> str | None:
        src, func = self.source, call.func
        attr = func.attr.value if isinstance(func, cst.Attribute) else None
        receiver = dotted(func.value) if isinstance(func, cst.Attribute) else None
        if attr == "backward" or src.resolves_to(func, "torch.autograd.backward"):
            return "backward"
        if attr in ("clip_grad_norm_", "clip_grad_value_") or src.resolves_to(
            func, "torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_", "torch.nn.utils.clip_grad"
        ):
            return "clip"
        if attr == "zero_grad":
            return "zero_grad"
        if src.resolves_to(func, "torch.cuda.synchronize", "torch.xpu.synchronize", "torch.mps.synchronize") or (
            attr in ("synchronize", "wait_stream") and receiver is not None and "event" not in receiver
        ):
            return "sync"
        if src.resolves_to(func, *(f"torch.distributed.{c}" for c in _COLLECTIVES)):
            return "collective"
        if attr == "step" and receiver is not None and not src.probe_object(func.value):
            last = receiver.rsplit(".", 1)[-1].lower()
            if receiver in self.schedulers or "sched" in last:
                return "scheduler_step"
            if receiver in self.optimizers or receiver in self.scalers or "opt" in last or "scaler" in last:
                return "optimizer_step"
        return None

    def owner(self, node: cst.CSTNode) -> cst.CSTNode:
        """The function a node runs in (the module for top-level code)."""
        return next((a for a in self.source.ancestors(node) if isinstance(a, cst.FunctionDef)), self.source.module)

    def loss_name(self, backward: cst.Call) -> str | None:
        """The name a ``X.backward()`` call is made on: ``loss``, also in ``scaler.scale(loss).backward()``,
        ``loss.mul(1.0).backward()``, ``(loss / accum).backward()`` or ``torch.mean(loss).backward()``."""
        if self.source.resolves_to(backward.func, "torch.autograd.backward"):
            args = [a.value for a in backward.args if a.keyword is None]
            return self._root_name(args[0], 0) if args else None
        if not isinstance(backward.func, cst.Attribute):
            return None
        return self._root_name(backward.func.value, 0)

    def _root_name(self, expr: cst.CSTNode, depth: int) -> str | None:
        if depth > 8:
            return None
        name = dotted(expr)
        if name is not None:
            return name
        if isinstance(expr, cst.Call):
            func, args = expr.func, [a.value for a in expr.args if a.keyword is None]
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value != "scale"
                and (dotted(func.value) or "").split(".")[0] not in self._imported_roots()
            ):
                return self._root_name(func.value, depth + 1)  # a method of the loss: loss.mul(1.0), loss.sum()
            return self._root_name(args[0], depth + 1) if args else None  # scaler.scale(loss), torch.mean(loss)
        if isinstance(expr, cst.BinaryOperation):
            return self._root_name(expr.left, depth + 1) or self._root_name(expr.right, depth + 1)
        if isinstance(expr, cst.UnaryOperation):
            return self._root_name(expr.expression, depth + 1)
        if isinstance(expr, cst.Subscript):
            return self._root_name(expr.value, depth + 1)
        if isinstance(expr, (cst.List, cst.Tuple)) and expr.elements:  # torch.stack([loss]).sum()
            return self._root_name(expr.elements[0].value, depth + 1)
        return None

    def _imported_roots(self) -> set[str]:
        if self._imported_names is None:
            self._imported_names = self._imported()
        return self._imported_names

    def loss_names(self) -> dict[str, set[int]]:
        """Names backward() is called on, with the functions where they are that loss.

        ``loss.backward()`` and ``scaler.scale(loss).backward()`` both name ``loss``; a plain
        alias (``loss = self._cached``) makes ``self._cached`` a loss too, in any method.
        """
        names: dict[str, set[int]] = {}
        for call in self.source.of_type(cst.Call):
            if self.kind(call) == "backward" and (name := self.loss_name(call)) is not None:
                names.setdefault(name, set()).add(id(self.owner(call)))
        for _ in range(2):
            for node in self.source.of_type(cst.Assign):
                alias = dotted(node.value)
                if alias is None:
                    continue
                for t in node.targets:
                    name = dotted(t.target)
                    if name in names and id(self.owner(node)) in names[name] | {_ANYWHERE}:
                        names.setdefault(alias, set()).add(_ANYWHERE if "." in alias else id(self.owner(node)))
        for node in self.source.of_type(cst.For):  # for loss in losses: loss.backward()
            target, collection = dotted(node.target), dotted(node.iter)
            if target in names and collection is not None and id(self.owner(node)) in names[target]:
                names.setdefault(collection, set()).add(id(self.owner(node)))
        return names

    def loss_assignments(self) -> dict[str, list[cst.CSTNode]]:
        """For each loss name, the statements that compute it with a call (``loss = model(x, y)``)."""
        if self._losses is not None:
            return self._losses
        out: dict[str, list[cst.CSTNode]] = {}
        losses = self.loss_names()
        for node in self.source.of_type(cst.Assign, cst.AnnAssign, cst.AugAssign):
            targets = node.targets if isinstance(node, cst.Assign) else [node]
            names = set()
            for t in targets:
                expr = t.target
                elements = expr.elements if isinstance(expr, (cst.Tuple, cst.List)) else [expr]
                names |= {n for n in (dotted(e.value if isinstance(e, cst.BaseElement) else e) for e in elements) if n}
            value = node.value
            if value is None or not any(isinstance(d, cst.Call) for d in self.source.descendants(value)):
                continue
            for name in names & set(losses):
                if _ANYWHERE in losses[name] or id(self.owner(node)) in losses[name]:
                    out.setdefault(name, []).append(node)
        for node in self.source.of_type(cst.Expr):  # losses.append(model(x, y) / accum)
            call = node.value
            if not (
                isinstance(call, cst.Call)
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value in _COLLECTORS
                and call.args
            ):
                continue
            name = dotted(call.func.value)
            if (
                name in losses
                and (_ANYWHERE in losses[name] or id(self.owner(node)) in losses[name])
                and any(isinstance(d, cst.Call) for a in call.args for d in self.source.descendants(a.value))
            ):
                out.setdefault(name, []).append(node)
        self._losses = out
        return out

    def _imported(self) -> set[str]:
        return {bound.split(".")[0] for _, _, bound in self.source.imports() if bound != "*"}

    def is_model_call(self, call: cst.CSTNode) -> bool:
        """A call of a model object: ``model(x)``, ``step_fn(x)``, ``self.model(x)``.

        Not an imported or built-in function, not a function or method defined in the file
        (``get_batch`` is data, not forward), not a method of some value (``logits.flatten()``).
        """
        if not isinstance(call, cst.Call) or (callee := dotted(call.func)) is None:
            return False
        parts = callee.split(".")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] not in ("self", "cls")):
            return False
        if self._imported_names is None:
            self._imported_names = self._imported()
        if any(q.startswith("builtins.") for q in self.source.qnames(call.func)):
            return False
        return not (parts[0] in self._imported_names or parts[0] in _BUILTINS or parts[-1] in self.functions)

    def inline_forwards(self, loss_stmt: cst.CSTNode) -> list[cst.CSTNode]:
        """Model calls inside the loss statement itself (``loss = F.cross_entropy(model(x), y)``)."""
        return [n for n in self.source.descendants(loss_stmt.value) if self.is_model_call(n)]

    def forward_feeders(self, loss_stmt: cst.CSTNode) -> list[cst.CSTNode]:
        """Assignments in the same function whose value the loss reads and that call a model object."""
        src = self.source
        scope = next((a for a in src.ancestors(loss_stmt) if isinstance(a, cst.FunctionDef)), src.module)
        read = {n.value for n in src.descendants(loss_stmt.value) if isinstance(n, cst.Name)}
        feeders = []
        for node in src.descendants(scope):
            if not isinstance(node, cst.Assign) or node is loss_stmt or not self.is_model_call(node.value):
                continue
            targets = set()
            for t in node.targets:
                elements = t.target.elements if isinstance(t.target, (cst.Tuple, cst.List)) else [t.target]
                targets |= {
                    e.value.value
                    if isinstance(e, cst.BaseElement) and isinstance(e.value, cst.Name)
                    else getattr(e, "value", None)
                    for e in elements
                }
            if targets & read:
                feeders.append(node)
        return feeders

    def handoff(self, call: cst.Call) -> tuple[cst.CSTNode | None, str | None]:
        src = self.source
        for qname, how in _HANDOFF_TARGETS.items():
            if src.resolves_to(call.func, qname):
                for arg in call.args:
                    if arg.keyword is not None and arg.keyword.value == "target":
                        return arg.value, how
                if qname == "asyncio.to_thread" and call.args:
                    return call.args[0].value, how
                return None, None
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in _HANDOFF_METHODS and call.args:
            return call.args[0].value, _HANDOFF_METHODS[call.func.attr.value]
        return None, None

    def side_stream(self, node: cst.With) -> bool:
        return any(
            isinstance(i.item, cst.Call) and self.source.resolves_to(i.item.func, "torch.cuda.stream")
            for i in node.items
        )
