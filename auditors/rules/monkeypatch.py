"""monkeypatch: the job leaves the framework's code alone: torch, InfraRSI and the classes of their objects.

A patched ``Tensor.backward`` or ``Optimizer.step`` can queue the real work and run it
after the measured region (at the ``.item()`` in ``p.log``, say), while every call in
the region still looks right. A write counts however it is spelled: assignment,
``del``, ``setattr`` (also with a computed name), ``vars(cls)[name] = ...``,
``cls.__dict__.update(...)``, through an alias (``T = torch.Tensor``) or the class of
an object (``type(opt).step``, ``opt.__class__.step``). Settings that torch means to be
set (``torch.backends.*``, ``torch._dynamo.config``, ``torch._inductor.config``) are
not patches; precision settings there are ``precision_downgrade``'s to judge. The
clocks are ``clock_patched``'s and the probe's objects ``probe_shadowed``'s, so one
patch is reported once.
"""

from __future__ import annotations

from .._loop import loop_model
from .._rule import AuditContext, Example, Finding, Rule
from .._source import SourceModel, dotted
from .._values import is_clock, is_probe, object_paths, under
from .._writes import attribute_writes

# Methods and state that the update work runs through: replacing them on an instance
# (`opt.step = ...`) or a class reached through an object (`type(loss).backward`) moves work.
_WORK_ATTRS = {
    "step",
    "zero_grad",
    "backward",
    "forward",
    "__call__",
    "_call_impl",
    "item",
    "tolist",
    "scale",
    "unscale_",
    "update",
    "param_groups",
    "state",
    "defaults",
    "add_param_group",
    "register_hook",
    "__torch_function__",
    "__torch_dispatch__",
}
_BUILTIN_HOOKS = {
    "__import__",
    "getattr",
    "setattr",
    "hasattr",
    "isinstance",
    "type",
    "open",
    "exec",
    "eval",
    "compile",
    "vars",
    "globals",
    "__build_class__",
}

_LOOP = """
import torch
from infrarsi import probe
p = probe.from_env()
opt = torch.optim.AdamW(model.parameters())
for step in range(1, steps + 1):
    with p.step(step):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
"""


def _config(path: str) -> bool:
    parts = path.split(".")
    return under(path, "torch.backends") or any(p == "config" or p.endswith("_config") for p in parts[:-1])


class Monkeypatch(Rule):
    id = "monkeypatch"
    message = "torch, InfraRSI or the class of one of their objects is patched"
    VALID = [
        _LOOP,
        (
            "import torch\ntorch.backends.cudnn.benchmark = True\nimport torch._dynamo\n"
            "torch._dynamo.config.cache_size_limit = 64\n"
        ),
        "import torch._inductor.config as inductor_config\ninductor_config.compile_threads = 1\n",
        (
            "import torch\nx = torch.zeros(3)\nx.requires_grad = True\nlayer = torch.nn.Linear(4, 4)\n"
            "layer.weight = torch.nn.Parameter(torch.ones(4, 4))\nfor q in model.parameters():\n    q.grad = None\n"
        ),
        "import builtins\n_print = builtins.print\nbuiltins.print = lambda *a, **k: _print(*a, **k) if rank == 0 else None\n",
        "class Trainer:\n    calls = 0\n    def fit(self):\n        self.model.train()\n        self.steps_done = 0\n",
    ]
    INVALID = [
        Example(
            _LOOP.replace(
                "for step", "_later = []\ntorch.optim.AdamW.step = lambda self, *a, **k: _later.append(self)\nfor step"
            ),
            note="the optimizer's step queued for after the measured region",
        ),
        "import torch\n_backward = torch.Tensor.backward\ntorch.Tensor.backward = lambda t, *a, **k: queue.append(t)\n",
        "import torch\nT = torch.Tensor\nsetattr(T, 'back' + 'ward', deferred)\n",
        "import torch\nopt = torch.optim.SGD(params, lr=0.1)\ntype(opt).step = deferred_step\n",
        "import torch\nopt = torch.optim.SGD(params, lr=0.1)\nsetattr(opt.__class__, name, deferred_step)\n",
        "import torch\nopt = torch.optim.SGD(params, lr=0.1)\nopt.step = lambda *a, **k: None\n",
        "import torch\nvars(torch.optim.Optimizer)['zero_grad'] = keep_grads\n",
        "import torch.nn as nn\nnn.Module.__call__ = timed_call\n",
        "import infrarsi.autoprobe\ninfrarsi.autoprobe.AutoProbe._end_step = lambda self, skipped: None\n",
        "import torch\ndel torch.optim.AdamW.step\n",
        "import builtins\nbuiltins.__import__ = my_import\n",
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        work = loop_model(source).work
        typed = work.optimizers | work.scalers | work.schedulers
        findings = []
        for write in attribute_writes(source):
            paths = object_paths(source, write.obj)
            full = {f"{p}.{write.attr or '?'}" for p in paths}
            if any(is_clock(f) or is_probe(f) for f in full):
                continue  # clock_patched's and probe_shadowed's to report
            what = self._what(paths, write.attr, dotted(write.obj) in typed)
            if what:
                target = f"`{source.code(write.obj)}.{write.attr or '<computed name>'}`"
                how = "reassigned" if write.how == "assigned" else f"patched ({write.how})"
                findings.append(self.finding(source, write.node, f"{target} ({what}) is {how}"))
        return findings

    @staticmethod
    def _what(paths: set[str], attr: str | None, typed_object: bool) -> str | None:
        """What a write to ``attr`` of an object reached by ``paths`` patches, or None when it is no patch."""
        sensitive = attr is None or attr in _WORK_ATTRS or (attr.startswith("__") and attr.endswith("__"))
        for path in sorted(paths):
            if under(path, "infrarsi"):
                return "InfraRSI"
            if under(path, "builtins") and (attr is None or attr in _BUILTIN_HOOKS):
                return "a builtin"
            if ".__class__" in path and (sensitive or under(path, "torch")):
                return "the class of an object"
            if under(path, "torch"):
                instance = "(" in path or "[" in path
                if not instance and not _config(f"{path}.{attr or '?'}"):
                    return "torch"
                if instance and sensitive:
                    return "a torch object's method"
        if typed_object and sensitive:
            return "the optimizer's method"
        return None


RULE = Monkeypatch()
