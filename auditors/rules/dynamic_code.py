"""dynamic_code: the job's code is all in its source, where the audit can read it.

Every other rule reads the source. Code built from strings (``exec``, ``eval``,
``compile``), modules imported by a computed name (``__import__``,
``importlib.import_module(name)``, ``runpy``) and attributes of torch, the clocks or
InfraRSI looked up by a computed name (``getattr(torch, name)``) run things no rule
has seen. Literal imports and lookups are plain code and stay fine, and so are the
config-driven lookups training scripts use (``getattr(torch.optim, cfg.optimizer)``,
``getattr(nn, activation)``): the run-time checks see what they pick. ``torch.compile``
and ``re.compile`` are not ``compile``.
"""

from __future__ import annotations

import libcst as cst

from .._rule import AuditContext, Finding, Rule
from .._source import SourceModel
from .._values import (
    PROBE,
    bound_from,
    call_args,
    const_str,
    is_reference,
    last_name,
    namespace_of,
    object_paths,
    root_name,
    under,
)

_CODE = (
    "builtins.exec",
    "builtins.eval",
    "builtins.compile",
    "builtins.__import__",
    "importlib.reload",
    "importlib.util.spec_from_file_location",
    "importlib.util.spec_from_loader",
    "importlib.util.module_from_spec",
    "importlib.machinery",
    "runpy",
    "types.FunctionType",
    "types.CodeType",
    "marshal.loads",
    "code.InteractiveInterpreter",
    "code.InteractiveConsole",
    "code.interact",
)
_MODULES = ("importlib", "runpy", "types", "marshal", "code", "builtins")
_BUILTIN_CODE = {"exec", "eval", "compile", "__import__", "__builtins__"}
_LOOKUP_NAMES = {"getattr", "hasattr", "__getattribute__", "attrgetter", "methodcaller"}
# Modules whose attributes, looked up by a computed name, could be anything the job likes.
_GUARDED = (
    "torch",
    "time",
    "timeit",
    "infrarsi",
    PROBE,
    "builtins",
    "sys",
    "gc",
    "inspect",
    "importlib",
    "os",
    "ctypes",
)
# Lookups of a layer, activation, optimizer or scheduler class from a config.
_CONFIG_LOOKUPS = {
    "torch.nn",
    "torch.nn.functional",
    "torch.nn.init",
    "torch.nn.modules",
    "torch.optim",
    "torch.optim.lr_scheduler",
    "torch.utils.data",
}
_LOOKUPS = (
    "builtins.getattr",
    "builtins.hasattr",
    "builtins.object.__getattribute__",
    "builtins.type.__getattribute__",
    "operator.attrgetter",
    "operator.methodcaller",
)


def _guarded(path: str) -> bool:
    return path not in _CONFIG_LOOKUPS and under(path, *_GUARDED)


class DynamicCode(Rule):
    id = "dynamic_code"
    message = "code is built, imported or looked up at run time, out of the audit's sight"
    VALID = [
        "import torch\nstep_fn = torch.compile(model)\nimport re\npattern = re.compile(r'\\d+')\n",
        "import importlib\nlayers = importlib.import_module('models.layers')\n",
        (
            "import torch\nopt = getattr(torch.optim, cfg.optimizer)(model.parameters(), lr=cfg.lr)\n"
            "import torch.nn as nn\nact = getattr(nn, cfg.activation)()\n"
        ),
        "import torch\nmatmul = getattr(torch, 'matmul')\nhas_mps = hasattr(torch.backends, 'mps')\n",
        "from ast import literal_eval\nvalue = literal_eval('3')\nsetattr(cfg, key, value)\n",
    ]
    INVALID = [
        "from infrarsi import probe\np = probe.from_env()\nmeasured = eval('p.total_steps') is not None\n",
        "exec(open('patch.py').read())\n",
        "source = 'import time; time.perf_counter = lambda: 0.0'\nexec(compile(source, '<patch>', 'exec'))\n",
        "clock = __import__('ti' + 'me')\n",
        "import importlib\nmod = importlib.import_module(base + '.probe')\n",
        "import torch\nfn = getattr(torch, name)\n",
        "import torch\ncast = getattr(torch.Tensor, ''.join(['bfloat', '16'][::-1][::-1]) if flag else name)\n",
        "from infrarsi import probe\np = probe.from_env()\nflag = getattr(p, key)\n",
        "import importlib\nimportlib.reload(torch)\n",
        "import runpy\nrunpy.run_path('helper.py')\n",
        "f = __builtins__['ev' + 'al']\n",
        "import time\nnow = vars(time)[name]()\n",
        "import builtins\nrun = vars(builtins)['ex' + 'ec']\n",
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = []
        roots = bound_from(source, *_MODULES) | _BUILTIN_CODE
        lookups = bound_from(source, "builtins", "operator") | _LOOKUP_NAMES
        for node in source.of_type(cst.Name, cst.Attribute):
            if root_name(node) not in roots or not is_reference(source, node):
                continue
            parent = source.parent.get(node)
            if isinstance(parent, cst.Attribute) and parent.value is node:
                continue  # `importlib.util.module_from_spec`, not also `importlib.util`
            if isinstance(node, cst.Name) and node.value == "__builtins__":
                findings.append(self.finding(source, node, "`__builtins__` hands out exec, eval and __import__"))
                continue
            hit = next((q for q in source.qnames(node) for ref in _CODE if q == ref or q.startswith(ref + ".")), None)
            if hit is not None:
                findings.append(
                    self.finding(source, node, f"`{source.code(node)}` ({hit}) runs code the audit can't read")
                )
        for call in source.of_type(cst.Call):
            last = last_name(call.func)
            if last not in lookups and last not in ("import_module", "get", "__getitem__"):
                continue
            args = call_args(call)
            if (
                last == "import_module"
                and source.resolves_to(call.func, "importlib.import_module")
                and args
                and const_str(source, args[0]) is None
            ):
                findings.append(
                    self.finding(source, call, f"`{source.code(call)}` imports a module by a name the audit can't read")
                )
            elif any(q in _LOOKUPS for q in source.qnames(call.func)) and len(args) >= 2:
                findings += self._lookup(source, call, args[0], args[1])
            elif (
                isinstance(call.func, cst.Attribute)
                and call.func.attr.value in ("get", "__getitem__")
                and args
                and (owner := namespace_of(source, call.func.value)) is not None
            ):
                findings += self._lookup(source, call, owner, args[0])
        for node in source.of_type(cst.Subscript):
            owner = namespace_of(source, node.value)
            if owner is not None and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
                findings += self._lookup(source, node, owner, node.slice[0].slice.value)
        return findings

    def _lookup(self, source: SourceModel, node: cst.CSTNode, owner: cst.CSTNode, name: cst.CSTNode) -> list[Finding]:
        if const_str(source, name) is not None:
            hit = next((p for p in object_paths(source, node) for ref in _CODE if under(p, ref)), None)
            if hit is None:
                return []  # a literal lookup is plain code; one of exec, eval... is still a finding
            return [self.finding(source, node, f"`{source.code(node)}` ({hit}) runs code the audit can't read")]
        guarded = sorted(p for p in object_paths(source, owner) if _guarded(p))
        if not guarded:
            return []
        return [
            self.finding(
                source,
                node,
                f"`{source.code(node)}` looks up an attribute of {guarded[0]} by a name the audit can't read",
            )
        ]


RULE = DynamicCode()
