"""introspection: the job doesn't reach InfraRSI through the interpreter: sys.modules, namespaces, gc, frames.

The probe and the autoprobe are ordinary Python objects in the job's process. Code that
finds them without naming them (``gc.get_objects()``, ``gc.get_referrers``, walking
frames up to a caller's ``f_locals``, a trace hook) can reset a meter's start time or
swap a method; code that swaps modules in ``sys.modules`` or hooks the import system
can hand the job a different ``infrarsi.probe``. Reading ``vars()`` of InfraRSI or the
probe, or ``globals()['probe']``, is the same reach by another spelling. None of this
is needed to train a model, nor is asking torch whether a dispatch mode is in force
(``torch._C._len_torch_dispatch_stack()``), which tells a step InfraRSI observes from one it
doesn't. Plain uses stay fine: ``'torch_xla' in sys.modules``,
``sys.modules[__name__]``, ``globals()[key] = value`` from a command line (nanoGPT's
configurator), ``sys.exc_info()``.
"""

from __future__ import annotations

import libcst as cst

from .._rule import AuditContext, Finding, Rule
from .._source import SourceModel, dotted
from .._values import (
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
from .._writes import attribute_writes

_REFERRERS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents")
_FRAMES = (
    "sys._getframe",
    "sys._current_frames",
    "inspect.currentframe",
    "inspect.stack",
    "inspect.trace",
    "inspect.getouterframes",
    "inspect.getinnerframes",
    "traceback.walk_stack",
    "traceback.walk_tb",
    "sys.settrace",
    "sys.setprofile",
    "sys.monitoring",
    "threading.settrace",
    "threading.setprofile",
    "threading.settrace_all_threads",
    "threading.setprofile_all_threads",
    "ctypes.pythonapi",
    "ctypes.py_object",
)
_FRAME_ATTRS = {
    "f_back",
    "f_locals",
    "f_globals",
    "f_builtins",
    "f_trace",
    "tb_frame",
    "gi_frame",
    "cr_frame",
    "ag_frame",
}
# torch's own record of the modes in force: a job that reads it can tell a step InfraRSI observes
# (a dispatch mode is on) from one it doesn't, and behave only when watched.
_OBSERVERS = (
    "torch._C._len_torch_dispatch_stack",
    "torch._C._get_dispatch_stack_at",
    "torch._C._get_dispatch_mode",
    "torch._C._is_torch_function_mode_enabled",
    "torch._C._len_torch_function_stack",
    "torch.utils._python_dispatch",
    "torch.overrides._get_current_function_mode",
    "torch.overrides._get_current_function_mode_stack",
    "torch._C._dispatch_tls_local_include_set",
)
_MODULE_MUTATORS = {"update", "pop", "popitem", "setdefault", "clear", "__setitem__", "__delitem__"}
_MODULE_READS = {"get", "__getitem__", "__contains__"}
_IMPORT_HOOKS = ("sys.meta_path", "sys.path_hooks", "sys.path_importer_cache")
_CLOCK_KEYS = ("time", "timeit", "torch")  # a swapped clock module is clock_patched's to report


class Introspection(Rule):
    id = "introspection"
    message = "InfraRSI is reached through the interpreter (sys.modules, namespaces, gc, frames)"
    VALID = [
        "import sys\nif 'torch_xla' in sys.modules:\n    use_xla()\nhere = sys.modules[__name__]\n",
        "import gc\nimport sys\ngc.collect()\nsys.path.insert(0, 'src')\nkind, err, tb = sys.exc_info()\n",
        "for arg in sys.argv[1:]:\n    key, val = arg.split('=')\n    if key in globals():\n        globals()[key] = val\n",
        "from infrarsi import probe\np = probe.from_env()\nprint(vars(args))\nstate = model.__dict__.get('training')\n",
        "import torch\nout = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)\nok = torch._C._get_tracing_state()\n",
    ]
    INVALID = [
        "import gc\nfor obj in gc.get_objects():\n    if type(obj).__name__ == 'AutoProbe':\n        obj._t0 = None\n",
        "import gc\nfrom infrarsi import probe\np = probe.from_env()\nholders = gc.get_referrers(p)\n",
        "import sys\nsys.modules['infrarsi.probe'] = fake_probe\n",
        "import sys\nreal = sys.modules.get('infra' + 'rsi.probe')\n",
        "import sys\nfor name, module in list(sys.modules.items()):\n    patch(module)\n",
        "import sys\nframe = sys._getframe(1)\nframe.f_locals['t0'] = 0\n",
        "import inspect\ncaller = inspect.currentframe().f_back\n",
        "import inspect\nfor info in inspect.stack():\n    print(info.frame)\n",
        "try:\n    raise RuntimeError\nexcept RuntimeError as exc:\n    exc.__traceback__.tb_frame.f_back.f_locals.clear()\n",
        "from infrarsi import probe\nmeter = vars(probe)['Probe']\n",
        "from infrarsi import probe\np = probe.from_env()\nstate = p.__dict__\n",
        "from infrarsi import probe\nreal = globals()['pro' + 'be']\n",
        "import sys\nsys.settrace(tracer)\n",
        "import sys\nsys.meta_path.insert(0, FakeProbeFinder())\n",
        "import torch\nif not torch._C._len_torch_dispatch_stack():\n    out = shortcut(x)\n",
        "from torch.utils._python_dispatch import _get_current_dispatch_mode\nwatched = _get_current_dispatch_mode()\n",
    ]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = []
        roots = bound_from(source, "gc", "sys", "inspect", "traceback", "threading", "ctypes", "torch")
        for node in source.of_type(cst.Name, cst.Attribute):
            if not (root_name(node) in roots or last_name(node) in _FRAME_ATTRS) or not is_reference(source, node):
                continue
            parent = source.parent.get(node)
            if isinstance(parent, cst.Attribute) and parent.value is node and self._reach(source, parent):
                continue  # `gc.get_objects`, not also `gc`; one finding for `tb.tb_frame.f_back.f_locals`
            what = self._reach(source, node)
            if what:
                findings.append(self.finding(source, node, f"`{source.code(node)}` {what}"))
            elif (
                isinstance(node, cst.Attribute)
                and any(q in _IMPORT_HOOKS for q in source.qnames(node))
                and self._mutated(source, node)
            ):
                findings.append(self.finding(source, node, f"`{source.code(parent)}` hooks the import system"))
            elif "sys.modules" in source.qnames(node):
                findings += self._modules(source, node)
        findings += self._namespaces(source)
        return findings

    @staticmethod
    def _reach(source: SourceModel, node: cst.CSTNode) -> str | None:
        named = not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Call))  # f().x is not f's
        for q in source.qnames(node) if named else ():
            hit = next((ref for ref in _REFERRERS + _FRAMES if q == ref or q.startswith(ref + ".")), None)
            if hit is not None:
                return f"({hit}) reaches objects or frames the job did not make"
            if any(q == ref or q.startswith(ref + ".") for ref in _OBSERVERS):
                return "asks torch which modes are in force: whether InfraRSI is observing this step"
        if isinstance(node, cst.Attribute) and node.attr.value in _FRAME_ATTRS:
            return "walks the interpreter's frames"
        return None

    # -- sys.modules ---------------------------------------------------------------------------
    def _modules(self, source: SourceModel, node: cst.CSTNode) -> list[Finding]:
        parent = source.parent.get(node)
        grand = source.parent.get(parent) if parent is not None else None
        code = source.code(parent) if parent is not None else "sys.modules"
        if isinstance(parent, cst.Subscript) and parent.value is node:
            key = self._key(source, parent)
            if self._target(source, parent):
                if key and key.split(".")[0] in _CLOCK_KEYS:
                    return []
                return [self.finding(source, parent, f"`{code}` swaps a module in sys.modules")]
            return self._named_read(source, parent, key, code)
        if isinstance(parent, cst.Attribute) and parent.value is node and isinstance(grand, cst.Call):
            method = parent.attr.value
            if method in _MODULE_MUTATORS:
                return [self.finding(source, grand, f"`{source.code(grand)}` changes sys.modules")]
            if method in _MODULE_READS:
                args = call_args(grand)
                key = const_str(source, args[0]) if args else None
                if args and dotted(args[0]) == "__name__":
                    return []
                return self._named_read(source, grand, key, source.code(grand))
            return [self.finding(source, grand, f"`{source.code(grand)}` enumerates every loaded module")]
        if isinstance(parent, cst.ComparisonTarget) and isinstance(grand, cst.Comparison):
            key = const_str(source, grand.left)
            return self._named_read(source, grand, key, source.code(grand))
        return [
            self.finding(source, node, f"`{code}` uses sys.modules whole: every loaded module, InfraRSI's among them")
        ]

    @staticmethod
    def _key(source: SourceModel, node: cst.Subscript) -> str | None:
        if len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            item = node.slice[0].slice.value
            return "__name__" if dotted(item) == "__name__" else const_str(source, item)
        return None

    @staticmethod
    def _target(source: SourceModel, node: cst.CSTNode) -> bool:
        parent = source.parent.get(node)
        return isinstance(parent, (cst.AssignTarget, cst.Del)) or (
            isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node
        )

    def _named_read(self, source, node, key, code) -> list[Finding]:
        if key == "__name__":
            return []
        if key is None:
            return [self.finding(source, node, f"`{code}` looks up a module by a name the audit can't read")]
        if under(key, "infrarsi"):
            return [self.finding(source, node, f"`{code}` reaches {key} through sys.modules")]
        return []

    @staticmethod
    def _mutated(source: SourceModel, node: cst.CSTNode) -> bool:
        parent = source.parent.get(node)
        if isinstance(parent, cst.Attribute) and isinstance(source.parent.get(parent), cst.Call):
            return parent.attr.value in {
                "insert",
                "append",
                "extend",
                "remove",
                "pop",
                "clear",
                "__setitem__",
                "update",
                "__delitem__",
            }
        return isinstance(parent, (cst.AssignTarget, cst.Subscript, cst.AugAssign))

    # -- namespaces ----------------------------------------------------------------------------
    def _namespaces(self, source: SourceModel) -> list[Finding]:
        written = [w for w in attribute_writes(source) if w.how == "namespace"]
        inside_writes = {id(n) for w in written for n in source.descendants(w.node)}
        infrarsi_names = {bound for _, real, bound in source.imports() if under(real, "infrarsi")} | source.probe_vars
        out = []
        for node in source.of_type(cst.Call, cst.Attribute):
            name = last_name(node.func) if isinstance(node, cst.Call) else node.attr.value
            if name not in ("vars", "globals", "locals", "getmembers", "__dict__") or id(node) in inside_writes:
                continue
            owner = namespace_of(source, node)
            if (
                owner is None
                and isinstance(node, cst.Call)
                and source.resolves_to(node.func, "inspect.getmembers")
                and call_args(node)
            ):
                owner = call_args(node)[0]
            if owner is not None:
                if any(under(p, "infrarsi", "<probe>") for p in object_paths(source, owner)):
                    out.append(self.finding(source, node, f"`{source.code(node)}` reads InfraRSI's namespace"))
                continue
            if (
                isinstance(node, cst.Call)
                and not node.args
                and source.resolves_to(node.func, "builtins.globals", "builtins.locals", "builtins.vars")
            ):
                key = self._namespace_key(source, node)
                if key is not None and key.split(".")[0] in infrarsi_names:
                    out.append(
                        self.finding(
                            source,
                            node,
                            f"`{source.code(source.statement_of(node))}` reaches "
                            f"`{key}` (InfraRSI) through the namespace",
                        )
                    )
        return out

    @staticmethod
    def _namespace_key(source: SourceModel, call: cst.Call) -> str | None:
        parent = source.parent.get(call)
        if (
            isinstance(parent, cst.Subscript)
            and len(parent.slice) == 1
            and isinstance(parent.slice[0].slice, cst.Index)
        ):
            return const_str(source, parent.slice[0].slice.value)
        grand = source.parent.get(parent) if parent is not None else None
        if isinstance(parent, cst.Attribute) and isinstance(grand, cst.Call) and call_args(grand):
            return const_str(source, call_args(grand)[0])
        return None


RULE = Introspection()
