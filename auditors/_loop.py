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
from ._work import CLOCKS, UpdateWork

__all__ = ["Op", "Region", "LoopModel", "UPDATE_KINDS", "RANGE_CUT", "loop_model"]

UPDATE_KINDS = (
    "forward",
    "loss",
    "backward",
    "clip",
    "optimizer_step",
    "zero_grad",
    "scheduler_step",
    "collective",
    "sync",
)
KIND_WORDS = {
    "forward": "the forward pass",
    "loss": "the loss",
    "backward": "backward()",
    "clip": "gradient clipping",
    "optimizer_step": "the optimizer step",
    "zero_grad": "zero_grad()",
    "scheduler_step": "the scheduler step",
    "collective": "a collective call",
    "sync": "device synchronisation",
}

# Gradient accumulation guards the optimizer step with `(i + 1) % accum == 0`; a range cut
# (`step > 10`, `step <= 5`) skips it for whole stretches of steps.
RANGE_CUT = re.compile(r"(?<![<>])[<>]=?(?![<>])")

_JOINS = {"join", "result", "wait", "wait_stream", "synchronize", "get"}
_STEP_WORDS = ("step", "iter", "it", "epoch", "global_step", "iteration", "batch_idx")
_MEASURE_ATTRS = {"enabled", "total_steps", "recording", "active"}


@dataclass
class Op:
    """One piece of update work found in the source."""

    kind: str
    node: cst.CSTNode
    in_region: bool = False
    conditions: tuple[str, ...] = ()  # tests on the step index or on being measured that guard it
    handed_off: str | None = None  # "a thread", "an executor", "another CUDA stream", ...

    @property
    def rank(self) -> int:
        return 2 if self.handed_off else (1 if self.conditions else 0)

    @property
    def firm(self) -> bool:
        """Done every measured step, inside the region, on the region's own thread and stream."""
        return self.in_region and not self.conditions and self.handed_off is None


@dataclass
class Region:
    kind: str  # probe | timer | cuda_event | timeit | rolling | loop
    anchor: cst.CSTNode  # where to point a finding about the region
    body: list[cst.CSTNode]  # statements (or one expression) the timer covers
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
        self.work = UpdateWork(source)
        self.functions = self.work.functions
        self.regions = self._explicit_regions() or self._loop_regions()
        self.ops: list[Op] = []
        self._classify()

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
                if (
                    isinstance(call, cst.Call)
                    and isinstance(call.func, cst.Attribute)
                    and call.func.attr.value == "step"
                    and src.probe_object(call.func.value)
                ):
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
                if (
                    isinstance(node.func, cst.Attribute)
                    and node.func.attr.value == "record"
                    and dotted(node.func.value) in self.work.events
                ):
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
            regions.append(Region(kind, body[a], body[a + 1 : b], self._enclosing_loops(body[a])))
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
            if self.work.kind(call) != "optimizer_step":
                continue
            loops = self._enclosing_loops(call)
            if loops and id(loops[0]) not in seen:
                seen.add(id(loops[0]))
                regions.append(Region("loop", loops[0], list(loops[0].body.body), loops))
        return regions

    # -- classification ----------------------------------------------------------------------
    def _classify(self) -> None:
        src = self.source
        op_nodes: dict[int, Op] = {}
        for call in src.of_type(cst.Call):
            kind = self.work.kind(call)
            if kind:
                op_nodes[id(call)] = Op(kind, call)
            target, how = self.work.handoff(call)
            if how and isinstance(target, cst.Attribute):  # pool.submit(opt.step): the method itself
                kind = self.work.kind(cst.Call(func=target))
                if kind:
                    op_nodes[id(target)] = Op(kind, target)
        for statements in self.work.loss_assignments().values():
            for stmt in statements:
                op_nodes[id(stmt)] = Op("loss", stmt)
                for feeder in self.work.forward_feeders(stmt) + self.work.inline_forwards(stmt):
                    op_nodes.setdefault(id(feeder), Op("forward", feeder))
        self.ops = list(op_nodes.values())
        for region in self.regions:
            steps = self.step_names(region)
            for body_node in region.body:
                self._walk(body_node, region, steps, op_nodes, (), None, depth=0, seen=set())

    def step_names(self, region: Region) -> set[str]:
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
        if (
            isinstance(node, cst.With)
            and not handed_off
            and self.work.side_stream(node)
            and not self._joined(node, region)
        ):
            for child in src.children(node):
                self._walk(child, region, steps, op_nodes, conditions, "another CUDA stream", depth, seen)
            return
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            return  # defined here, run when called
        if isinstance(node, cst.Call) and depth < 4:
            target, how = self.work.handoff(node)
            if how and self._joined(node, region):
                how = None
            for fn in self.callees(node, target):
                if id(fn) not in seen:
                    inner_steps = steps | {
                        p.name.value for p in fn.params.params if p.name.value.lower() in _STEP_WORDS
                    }
                    for stmt in fn.body.body if isinstance(fn, cst.FunctionDef) else [fn.body]:
                        self._walk(
                            stmt,
                            region,
                            inner_steps,
                            op_nodes,
                            conditions,
                            handed_off or how,
                            depth + 1,
                            seen | {id(fn)},
                        )
            if how and target is not None:
                self._walk(target, region, steps, op_nodes, conditions, handed_off or how, depth, seen)
            for child in src.children(node):
                if child is not target and not (how and isinstance(child, cst.Arg) and child.value is target):
                    self._walk(child, region, steps, op_nodes, conditions, handed_off, depth, seen)
            return
        for child in src.children(node):
            self._walk(child, region, steps, op_nodes, conditions, handed_off, depth, seen)

    def callees(self, call: cst.Call, target: cst.CSTNode | None) -> list[cst.CSTNode]:
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

    def _joined(self, node: cst.CSTNode, region: Region) -> bool:
        """Does the region wait for what ``node`` started (join, result, wait_stream, synchronize) after it?"""
        src = self.source
        stmt = src.statement_of(node)
        after = src.order[stmt]
        for body_node in region.body:
            for n in src.descendants(body_node):
                if (
                    isinstance(n, cst.Call)
                    and src.order[n] > after
                    and not src.inside(n, stmt)
                    and (
                        (isinstance(n.func, cst.Attribute) and n.func.attr.value in _JOINS)
                        or src.resolves_to(n.func, "torch.cuda.synchronize", "concurrent.futures.wait")
                    )
                ):
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


def loop_model(source: SourceModel) -> LoopModel:
    """The measured regions and update work of ``source``'s file (computed once, shared by rules)."""
    if "loop_model" not in source.memo:
        source.memo["loop_model"] = LoopModel(source)
    return source.memo["loop_model"]
