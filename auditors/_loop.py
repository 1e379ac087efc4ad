"""The training loop as the auditors see it: measured regions and the update work in them.

A *measured region* is what the step time covers: the body of ``with p.step(...)``
(a probe from ``infrarsi.probe.from_env()``), the statements between a pair of clock
reads (``time.perf_counter()`` and friends, CUDA ``Event.record()`` pairs), a rolling
timer's whole loop body, or the function handed to ``timeit``. Scripts with none of
these (``evidence = "auto"`` / ``"log"``) are measured per optimizer step, so the
body of the loop around the optimizer step is the region.

*Update work* is classified per call: the loss (and the forward that feeds it),
``backward``, gradient clipping, the optimizer step, ``zero_grad``, the scheduler
step, collectives and device synchronisation. Functions and methods of the same
file called from a region are followed, so a ``train_step`` method counts as inside
the region that calls it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from ._source import SourceModel, dotted

__all__ = ["Op", "Region", "LoopModel", "UPDATE_KINDS", "RANGE_CUT"]

UPDATE_KINDS = ("forward", "loss", "backward", "clip", "optimizer_step", "zero_grad", "scheduler_step",
                "collective", "sync")
KIND_WORDS = {"forward": "the forward pass", "loss": "the loss", "backward": "backward()",
              "clip": "gradient clipping", "optimizer_step": "the optimizer step", "zero_grad": "zero_grad()",
              "scheduler_step": "the scheduler step", "collective": "a collective call",
              "sync": "device synchronisation"}

# Gradient accumulation guards the optimizer step with `(i + 1) % accum == 0`; a range cut
# (`step > 10`, `step <= 5`) skips it for whole stretches of steps.
RANGE_CUT = re.compile(r"(?<![<>])[<>]=?(?![<>])")

CLOCKS = ("time.perf_counter", "time.perf_counter_ns", "time.time", "time.time_ns", "time.monotonic",
          "time.monotonic_ns", "time.process_time", "time.process_time_ns", "timeit.default_timer")
_COLLECTIVES = {"all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
                "broadcast", "barrier", "reduce", "all_to_all", "all_to_all_single"}
_JOINS = {"join", "result", "wait", "wait_stream", "synchronize", "get"}
_HANDOFF_TARGETS = {"threading.Thread": "a thread", "multiprocessing.Process": "a process",
                    "threading.Timer": "a thread", "asyncio.to_thread": "a thread"}
_HANDOFF_METHODS = {"submit": "an executor", "map": "an executor", "apply_async": "a process pool",
                    "run_in_executor": "an executor"}
_STEP_WORDS = ("step", "iter", "it", "epoch", "global_step", "iteration", "batch_idx")
_BUILTINS = {"next", "iter", "len", "list", "tuple", "dict", "zip", "enumerate", "range", "float", "int",
             "sum", "min", "max", "abs", "round", "sorted", "print", "isinstance", "getattr"}
_ANYWHERE = -1  # a loss alias on an attribute may be computed in any method
_MEASURE_ATTRS = {"enabled", "total_steps", "recording", "active"}


@dataclass
class Op:
    """One piece of update work found in the source."""

    kind: str
    node: cst.CSTNode
    in_region: bool = False
    conditions: tuple[str, ...] = ()  # tests on the step index or on being measured that guard it
    handed_off: str | None = None     # "a thread", "an executor", "another CUDA stream", ...

    @property
    def rank(self) -> int:
        return 2 if self.handed_off else (1 if self.conditions else 0)

    @property
    def firm(self) -> bool:
        """Done every measured step, inside the region, on the region's own thread and stream."""
        return self.in_region and not self.conditions and self.handed_off is None


@dataclass
class Region:
    kind: str                      # probe | timer | cuda_event | timeit | rolling | loop
    anchor: cst.CSTNode            # where to point a finding about the region
    body: list[cst.CSTNode]        # statements (or one expression) the timer covers
    loops: list[cst.CSTNode] = field(default_factory=list)  # loops enclosing the region, innermost first


def _block_statements(block: cst.CSTNode) -> list[cst.CSTNode] | None:
    if isinstance(block, cst.Module):
        return list(block.body)
    if isinstance(block, cst.IndentedBlock):
        return list(block.body)
    return None


class LoopModel:
    """Regions and update work of one source file."""

    def __init__(self, source: SourceModel) -> None:
        self.source = source
        self.functions = source.functions()
        self._imported_names: set[str] | None = None
        self._losses: dict[str, list[cst.CSTNode]] | None = None
        self.optimizers, self.schedulers, self.scalers, self.events = self._typed_names()
        self.regions = self._explicit_regions() or self._loop_regions()
        self.ops: list[Op] = []
        self._classify()

    # -- names with a known type -----------------------------------------------------------
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

    # -- regions ---------------------------------------------------------------------------
    def _enclosing_loops(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        loops = []
        for a in self.source.ancestors(node):
            if isinstance(a, (cst.For, cst.While)):
                loops.append(a)
            if isinstance(a, (cst.FunctionDef, cst.Lambda)):
                break
        return loops

    def _explicit_regions(self) -> list[Region]:
        src = self.source
        regions: list[Region] = []
        for node in src.of_type(cst.With):
            for item in node.items:
                call = item.item
                if (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                        and call.func.attr.value == "step" and src.probe_object(call.func.value)):
                    regions.append(Region("probe", node, list(node.body.body), self._enclosing_loops(node)))
                    break
        for block in src.of_type(cst.Module, cst.IndentedBlock):
            regions += self._timer_regions(block)
        for call in src.of_type(cst.Call):
            if src.resolves_to(call.func, "timeit.timeit", "timeit.repeat", "timeit.Timer") and call.args:
                target = call.args[0].value
                if isinstance(target, cst.Lambda):
                    regions.append(Region("timeit", call, [target.body], self._enclosing_loops(call)))
                elif isinstance(target, cst.Name) and target.value in self.functions:
                    fn = self.functions[target.value]
                    regions.append(Region("timeit", call, list(fn.body.body), self._enclosing_loops(call)))
        return regions

    def _clock_kind(self, stmt: cst.CSTNode) -> str | None:
        if not isinstance(stmt, cst.SimpleStatementLine):
            return None
        src = self.source
        for node in src.descendants(stmt):
            if isinstance(node, cst.Call):
                if src.resolves_to(node.func, *CLOCKS):
                    return "timer"
                if (isinstance(node.func, cst.Attribute) and node.func.attr.value == "record"
                        and dotted(node.func.value) in self.events):
                    return "cuda_event"
        return None

    def _timer_regions(self, block: cst.CSTNode) -> list[Region]:
        body = _block_statements(block)
        if not body:
            return []
        marks = [(i, kind) for i, stmt in enumerate(body) if (kind := self._clock_kind(stmt))]
        regions = []
        i = 0
        while i + 1 < len(marks):
            (a, kind), (b, _) = marks[i], marks[i + 1]
            regions.append(Region(kind, body[a], body[a + 1:b], self._enclosing_loops(body[a])))
            i += 2
        if i < len(marks):  # one clock read left over in a loop body: a rolling timer (t1 ...; t0 = t1)
            owner = self.source.parent.get(block)
            if isinstance(owner, (cst.For, cst.While)):
                regions.append(Region("rolling", body[marks[i][0]], body, [owner, *self._enclosing_loops(owner)]))
        return regions

    def _loop_regions(self) -> list[Region]:
        """No explicit timer: each loop around an optimizer step is measured per iteration."""
        regions, seen = [], set()
        for call in self.source.of_type(cst.Call):
            if self._kind(call) != "optimizer_step":
                continue
            loops = self._enclosing_loops(call)
            if loops and id(loops[0]) not in seen:
                seen.add(id(loops[0]))
                regions.append(Region("loop", loops[0], list(loops[0].body.body), loops))
        return regions

    # -- classification ----------------------------------------------------------------------
    def _kind(self, call: cst.Call) -> str | None:
        src, func = self.source, call.func
        attr = func.attr.value if isinstance(func, cst.Attribute) else None
        receiver = dotted(func.value) if isinstance(func, cst.Attribute) else None
        if attr == "backward" or src.resolves_to(func, "torch.autograd.backward"):
            return "backward"
        if attr in ("clip_grad_norm_", "clip_grad_value_") or src.resolves_to(
                func, "torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_",
                "torch.nn.utils.clip_grad"):
            return "clip"
        if attr == "zero_grad":
            return "zero_grad"
        if src.resolves_to(func, "torch.cuda.synchronize", "torch.xpu.synchronize", "torch.mps.synchronize") \
                or (attr in ("synchronize", "wait_stream") and receiver is not None and "event" not in receiver):
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

    def _loss_names(self) -> dict[str, set[int]]:
        """Names backward() is called on, with the functions where they are that loss.

        ``loss.backward()`` and ``scaler.scale(loss).backward()`` both name ``loss``; a plain
        alias (``loss = self._cached``) makes ``self._cached`` a loss too, in any method.
        """
        names: dict[str, set[int]] = {}
        for call in self.source.of_type(cst.Call):
            if self._kind(call) != "backward" or not isinstance(call.func, cst.Attribute):
                continue
            target = call.func.value
            if isinstance(target, cst.Call) and target.args:  # scaler.scale(loss)
                target = target.args[0].value
            if (name := dotted(target)) is not None:
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
        return names

    def loss_assignments(self) -> dict[str, list[cst.CSTNode]]:
        """For each loss name, the statements that compute it with a call (``loss = model(x, y)``)."""
        if self._losses is not None:
            return self._losses
        out: dict[str, list[cst.CSTNode]] = {}
        losses = self._loss_names()
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
        self._losses = out
        return out

    def _imported(self) -> set[str]:
        names = set()
        for node in self.source.of_type(cst.Import, cst.ImportFrom):
            if isinstance(node.names, cst.ImportStar):
                continue
            for alias in node.names:
                bound = alias.asname.name if alias.asname else alias.name
                if (name := dotted(bound)) is not None:
                    names.add(name.split(".")[0])
        return names

    def _forward_feeders(self, loss_stmt: cst.CSTNode) -> list[cst.CSTNode]:
        """Assignments in the same function whose value the loss reads and that call a model object.

        A model object is a variable (``model``, ``self.model``, ``step_fn``): not an imported
        or built-in function, not a function defined in the file (``get_batch`` is data, not forward).
        """
        src = self.source
        scope = next((a for a in src.ancestors(loss_stmt) if isinstance(a, cst.FunctionDef)), src.module)
        read = {n.value for n in src.descendants(loss_stmt.value) if isinstance(n, cst.Name)}
        if self._imported_names is None:
            self._imported_names = self._imported()
        feeders = []
        for node in src.descendants(scope):
            if not isinstance(node, cst.Assign) or node is loss_stmt or not isinstance(node.value, cst.Call):
                continue
            targets = set()
            for t in node.targets:
                elements = t.target.elements if isinstance(t.target, (cst.Tuple, cst.List)) else [t.target]
                targets |= {e.value.value if isinstance(e, cst.BaseElement) and isinstance(e.value, cst.Name)
                            else getattr(e, "value", None) for e in elements}
            callee = dotted(node.value.func)
            if not (targets & read) or callee is None:
                continue
            head = callee.split(".")[0]
            builtin = any(q.startswith("builtins.") for q in src.qnames(node.value.func))
            if builtin or head in self._imported_names or head in _BUILTINS or callee in self.functions:
                continue
            feeders.append(node)
        return feeders

    def _classify(self) -> None:
        src = self.source
        op_nodes: dict[int, Op] = {}
        for call in src.of_type(cst.Call):
            kind = self._kind(call)
            if kind:
                op_nodes[id(call)] = Op(kind, call)
            target, how = self._handoff(call)
            if how and isinstance(target, cst.Attribute):  # pool.submit(opt.step): the method itself
                kind = self._kind(cst.Call(func=target))
                if kind:
                    op_nodes[id(target)] = Op(kind, target)
        for statements in self.loss_assignments().values():
            for stmt in statements:
                op_nodes[id(stmt)] = Op("loss", stmt)
                for feeder in self._forward_feeders(stmt):
                    op_nodes.setdefault(id(feeder), Op("forward", feeder))
        self.ops = list(op_nodes.values())
        for region in self.regions:
            steps = self._step_names(region)
            for body_node in region.body:
                self._walk(body_node, region, steps, op_nodes, (), None, depth=0, seen=set())

    def _step_names(self, region: Region) -> set[str]:
        names: set[str] = set()
        for loop in region.loops:
            if isinstance(loop, cst.For):
                names |= {n.value for n in self.source.descendants(loop.target) if isinstance(n, cst.Name)}
            for node in self.source.descendants(loop.body):
                if isinstance(node, cst.AugAssign) and (name := dotted(node.target)):
                    names.add(name)
        return names

    def measured_test(self, test: cst.CSTNode, steps: set[str]) -> bool:
        """Does a condition read the step index or whether the job is being measured?"""
        src = self.source
        for node in src.descendants(test):
            name = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
            if name and (name in steps or name.split(".")[-1] in steps):
                return True
            if isinstance(node, cst.Attribute) and node.attr.value in _MEASURE_ATTRS and src.probe_object(node.value):
                return True
            if isinstance(node, (cst.Name, cst.Attribute)) and src.resolves_to(node, "os.environ", "os.getenv"):
                return True
        return False

    def _walk(self, node, region, steps, op_nodes, conditions, handed_off, depth, seen) -> None:
        """Mark the ops reachable from ``node`` as in ``region``, with the guards on the way."""
        src = self.source
        op = op_nodes.get(id(node))
        if op is not None:  # reached more than one way: keep the firmest
            rank = 2 if handed_off else (1 if conditions else 0)
            if not op.in_region or rank < op.rank:
                op.in_region, op.conditions, op.handed_off = True, conditions, handed_off
        if isinstance(node, (cst.If, cst.While)) and self.measured_test(node.test, steps):
            guard = src.code(node.test)
            for child in src.children(node):
                if child is not node.test:
                    self._walk(child, region, steps, op_nodes, conditions + (guard,), handed_off, depth, seen)
            return
        if isinstance(node, cst.IfExp) and self.measured_test(node.test, steps):
            guard = src.code(node.test)
            for child in (node.body, node.orelse):
                self._walk(child, region, steps, op_nodes, conditions + (guard,), handed_off, depth, seen)
            return
        if isinstance(node, cst.With) and not handed_off and self._side_stream(node) and not self._joined(node, region):
            for child in src.children(node):
                self._walk(child, region, steps, op_nodes, conditions, "another CUDA stream", depth, seen)
            return
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            return  # defined here, run when called
        if isinstance(node, cst.Call) and depth < 4:
            target, how = self._handoff(node)
            if how and self._joined(node, region):
                how = None
            for fn in self._callees(node, target):
                if id(fn) not in seen:
                    inner_steps = steps | {p.name.value for p in fn.params.params
                                           if p.name.value.lower() in _STEP_WORDS}
                    for stmt in (fn.body.body if isinstance(fn, cst.FunctionDef) else [fn.body]):
                        self._walk(stmt, region, inner_steps, op_nodes, conditions, handed_off or how,
                                   depth + 1, seen | {id(fn)})
            if how and target is not None:
                self._walk(target, region, steps, op_nodes, conditions, handed_off or how, depth, seen)
            for child in src.children(node):
                if child is not target and not (how and isinstance(child, cst.Arg) and child.value is target):
                    self._walk(child, region, steps, op_nodes, conditions, handed_off, depth, seen)
            return
        for child in src.children(node):
            self._walk(child, region, steps, op_nodes, conditions, handed_off, depth, seen)

    def _callees(self, call: cst.Call, target: cst.CSTNode | None) -> list[cst.CSTNode]:
        """Same-file functions that ``call`` runs (or hands off): by name, ``self.method``, lambdas."""
        expr = target if target is not None else call.func
        if isinstance(expr, cst.Lambda):
            return [expr]
        name = dotted(expr)
        if name is None:
            return []
        parts = name.split(".")
        if len(parts) == 1 and parts[0] in self.functions:
            return [self.functions[parts[0]]]
        if len(parts) == 2 and parts[0] in ("self", "cls"):
            owner = next((a for a in self.source.ancestors(call) if isinstance(a, cst.ClassDef)), None)
            key = f"{owner.name.value}.{parts[1]}" if owner else parts[1]
            fn = self.functions.get(key)
            return [fn] if fn else []
        return []

    def _handoff(self, call: cst.Call) -> tuple[cst.CSTNode | None, str | None]:
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

    def _side_stream(self, node: cst.With) -> bool:
        return any(isinstance(i.item, cst.Call) and self.source.resolves_to(i.item.func, "torch.cuda.stream")
                   for i in node.items)

    def _joined(self, node: cst.CSTNode, region: Region) -> bool:
        """Does the region wait for what ``node`` started (join, result, wait_stream, synchronize) after it?"""
        src = self.source
        stmt = src.statement_of(node)
        after = src.order[stmt]
        for body_node in region.body:
            for n in src.descendants(body_node):
                if isinstance(n, cst.Call) and src.order[n] > after and not src.inside(n, stmt) and (
                        (isinstance(n.func, cst.Attribute) and n.func.attr.value in _JOINS)
                        or src.resolves_to(n.func, "torch.cuda.synchronize", "concurrent.futures.wait")):
                    return True
        return False

    # -- summaries ---------------------------------------------------------------------------
    def count(self, kind: str) -> dict[str, int]:
        """How many ops of ``kind`` are firm, guarded, handed off, or outside every region."""
        out = {"firm": 0, "guarded": 0, "handed_off": 0, "outside": 0}
        for op in self.ops:
            if op.kind != kind:
                continue
            if not op.in_region:
                out["outside"] += 1
            elif op.handed_off:
                out["handed_off"] += 1
            elif op.conditions:
                out["guarded"] += 1
            else:
                out["firm"] += 1
        return out
