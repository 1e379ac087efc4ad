"""precision_downgrade: no training precision below what the contract's ``precision`` allows.

Judged wherever the source sets a precision: casts (``.half()``, ``.to(dtype)``,
``.type(torch.BFloat16Tensor)``, ``getattr(x, 'half')()``), ``dtype=`` arguments,
autocast (the context manager and the raw ``torch.set_autocast_*`` switches), the
default dtype, and the float32 matmul settings, old (``allow_tf32``,
``set_float32_matmul_precision``) and new (``torch.backends.*.fp32_precision``:
``"ieee"`` is fp32, ``"tf32"`` and ``"bf16"`` need the contract's leave). A dtype is
resolved through aliases, ``getattr(torch, "bfloat" + "16")`` and ``vars(torch)[...]``;
one looked up by a name the audit can't read is a finding, since it could be any.
A dtype picked at run time from a table of literals (``{'float32': torch.float32,
...}[cfg.dtype]``) isn't judged here: ``numerics.precision`` judges what the run used.
"""

from __future__ import annotations

import libcst as cst

from .._rule import AuditContext, Example, Finding, Rule
from .._source import SourceModel, string_value
from .._values import call_args, const_str, last_name, object_paths, under
from .._writes import attribute_writes

_DTYPES = {
    "torch.float16": "fp16",
    "torch.half": "fp16",
    "torch.bfloat16": "bf16",
    "torch.float8_e4m3fn": "fp8",
    "torch.float8_e5m2": "fp8",
    "torch.float8_e4m3fnuz": "fp8",
    "torch.float8_e5m2fnuz": "fp8",
    "torch.float32": "fp32",
    "torch.float": "fp32",
    "torch.float64": "fp64",
    "torch.double": "fp64",
    "torch.HalfTensor": "fp16",
    "torch.cuda.HalfTensor": "fp16",
    "torch.BFloat16Tensor": "bf16",
    "torch.cuda.BFloat16Tensor": "bf16",
    "torch.FloatTensor": "fp32",
    "torch.cuda.FloatTensor": "fp32",
    "torch.DoubleTensor": "fp64",
    "torch.cuda.DoubleTensor": "fp64",
}
_DTYPE_STRINGS = {
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "torch.HalfTensor": "fp16",
    "torch.cuda.HalfTensor": "fp16",
    "torch.BFloat16Tensor": "bf16",
    "torch.cuda.BFloat16Tensor": "bf16",
    "torch.float16": "fp16",
    "torch.bfloat16": "bf16",
}
_CAST_METHODS = {"half": "fp16", "bfloat16": "bf16"}
_AUTOCAST = (
    "torch.autocast",
    "torch.amp.autocast",
    "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast",
    "torch.amp.autocast_mode.autocast",
)
_MATMUL = {"high": "tf32", "medium": "bf16", "highest": "fp32"}
_FP32_PRECISION = {"ieee": "fp32", "tf32": "tf32", "bf16": "bf16", "none": "fp32"}
_LOWER = {"fp16", "bf16", "fp8", "tf32"}
_UNRESOLVED = "unresolved"


def _autocast_switch(path: str) -> str | None:
    """``set_autocast_enabled`` for ``torch.set_autocast_enabled`` and ``torch._C._set_autocast_enabled``."""
    name = path.rsplit(".", 1)[-1].lstrip("_")
    return name if under(path, "torch") and name.startswith("set_autocast_") else None


class PrecisionDowngrade(Rule):
    id = "precision_downgrade"
    message = "a lower precision than the contract allows"
    VALID = [
        "model = model.float()\nx = x.to(device)\nmask = torch.ones(t, t, dtype=torch.bool)\n",
        Example(
            "import torch\nwith torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n    loss = model(x)\n",
            precision=("fp32", "bf16"),
        ),
        Example("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", precision=("fp32", "tf32")),
        "import torch\ntorch.set_float32_matmul_precision('highest')\n",
        "import torch\nwith torch.autocast(device_type='cuda', enabled=False):\n    loss = model(x)\n",
        "import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\n",
        "import torch\ntorch.backends.cuda.matmul.fp32_precision = 'ieee'\ntorch.backends.fp32_precision = 'ieee'\n",
        Example("import torch\ntorch.backends.cudnn.conv.fp32_precision = 'tf32'\n", precision=("fp32", "tf32")),
        (
            "import torch\ny = x.to(q.dtype)\nz = torch.zeros(3, dtype=x.dtype, device=x.device)\n"
            "torch.set_autocast_enabled('cuda', False)\n"
        ),
        Example("import torch\nh = x.to(getattr(torch, 'bfloat' + '16'))\n", precision=("fp32", "bf16")),
    ]
    INVALID = [
        "model = model.half()\n",
        "import torch\nmodel = model.to(torch.bfloat16)\n",
        "import torch\nmodel.to(device, dtype=torch.float16)\n",
        "import torch\nwith torch.autocast(device_type='cpu', dtype=torch.bfloat16):\n    loss = model(x)\n",
        "from torch.cuda.amp import autocast\nwith autocast():\n    loss = model(x)\n",
        "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n",
        "import torch\ntorch.set_float32_matmul_precision('high')\n",
        "import torch\ntorch.set_default_dtype(torch.bfloat16)\n",
        Example(
            "import torch\nwith torch.autocast(device_type='cuda', dtype=torch.float16):\n    loss = model(x)\n",
            precision=("fp32", "bf16"),
            note="bf16 is allowed, fp16 is not",
        ),
        Example("import torch\nh = x.to(getattr(torch, 'bfloat' + '16'))\n", note="a dtype spelled in pieces"),
        "import torch\nh = x.to(getattr(torch, cfg.low))\n",
        "import torch\nh = x.type(torch.BFloat16Tensor)\n",
        "import torch\nlow = vars(torch)['float' + '16']\nw = torch.zeros(3, dtype=low)\n",
        "h = getattr(x, 'bfloat' + '16')()\n",
        "import torch\ntorch.set_autocast_enabled('cpu', True)\nh = mlp(x)\ntorch.set_autocast_enabled('cpu', False)\n",
        "import torch\ntorch.set_autocast_dtype('cuda', torch.float16)\n",
        "import torch\ntorch.backends.cuda.matmul.fp32_precision = 'tf32'\n",
        "import torch\nsetattr(torch.backends.cudnn.conv, 'fp32_precision', 'tf' + '32')\n",
        "import torch\ntorch.backends.fp32_precision = mode\n",
    ]

    def _dtype(self, source: SourceModel, expr: cst.CSTNode) -> str | None:
        """The precision ``expr`` names as a dtype, ``_UNRESOLVED`` for a torch attribute by a computed name."""
        paths = (
            object_paths(source, expr)
            if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
            else set()
        )
        found = {_DTYPES[p] for p in paths if p in _DTYPES}
        if found:
            return min(found, key=lambda p: p in ("fp32", "fp64"))  # the lowest, if an alias has several
        if any(under(p, "torch") and p.endswith(".?") for p in paths):
            return _UNRESOLVED
        text = const_str(source, expr)
        return _DTYPE_STRINGS.get(text) if text else None

    def _flag(self, source, ctx, node, precision, what) -> list[Finding]:
        if precision is None or precision in ("fp32", "fp64") or ctx.allows(precision):
            return []
        what = what() if callable(what) else what
        allowed = ", ".join(ctx.precision) or "nothing"
        if precision == _UNRESOLVED:
            if _LOWER <= set(ctx.precision):
                return []
            return [
                self.finding(
                    source, node, f"{what} sets a precision the audit can't resolve; the contract allows only {allowed}"
                )
            ]
        return [self.finding(source, node, f"{what} trains in {precision}; the contract allows only {allowed}")]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = []
        for call in source.of_type(cst.Call):
            findings += self._call(source, ctx, call)
        for write in attribute_writes(source):
            findings += self._setting(source, ctx, write)
        return findings

    def _call(self, source: SourceModel, ctx: AuditContext, call: cst.Call) -> list[Finding]:
        func = call.func
        last = last_name(func)

        def code() -> str:  # the source text, made only when there is a finding
            return f"`{source.code(call)}`"

        if isinstance(func, cst.Attribute) and last in _CAST_METHODS:
            return self._flag(source, ctx, call, _CAST_METHODS[last], f"`.{last}()`")
        if (
            isinstance(func, cst.Call)
            and last_name(func.func) == "getattr"
            and len(call_args(func)) >= 2
            and (name := const_str(source, call_args(func)[1])) in _CAST_METHODS
        ):
            return self._flag(source, ctx, call, _CAST_METHODS[name], code)
        if isinstance(func, cst.Attribute) and last in ("to", "type"):
            out = []
            for arg in call.args:
                if arg.keyword is None or arg.keyword.value == "dtype":
                    out += self._flag(source, ctx, call, self._dtype(source, arg.value), code)
            return out
        if last == "autocast" and source.qnames(func) & set(_AUTOCAST):
            return self._flag(source, ctx, call, self._autocast(source, call), code)
        if last is not None and "set_autocast_" in last:
            switch = next((s for q in source.qnames(func) if (s := _autocast_switch(q))), None)
            if switch is not None:
                return self._flag(source, ctx, call, self._switch(source, switch, call), code)
        args = call_args(call)
        if (
            last == "set_float32_matmul_precision"
            and args
            and source.resolves_to(func, "torch.set_float32_matmul_precision")
        ):
            mode = const_str(source, args[0])
            return self._flag(
                source, ctx, call, _MATMUL.get(mode, _UNRESOLVED) if mode else _UNRESOLVED, "float32 matmul precision"
            )
        if (
            last in ("set_default_dtype", "set_default_tensor_type")
            and args
            and source.resolves_to(func, "torch.set_default_dtype", "torch.set_default_tensor_type")
        ):
            return self._flag(source, ctx, call, self._dtype(source, args[0]), "the default dtype")
        if (
            last is not None
            and last.endswith("Tensor")
            and any(q in _DTYPES and _DTYPES[q] not in ("fp32", "fp64") for q in object_paths(source, func))
        ):
            return self._flag(source, ctx, call, self._dtype(source, func), code)  # torch.cuda.HalfTensor(...)
        out = []
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "dtype":
                out += self._flag(
                    source,
                    ctx,
                    call,
                    self._dtype(source, arg.value),
                    lambda arg=arg: f"`dtype={source.code(arg.value)}`",
                )
        return out

    def _switch(self, source: SourceModel, switch: str, call: cst.Call) -> str | None:
        """The precision a raw ``torch.set_autocast_*`` call turns on."""
        args = call_args(call)
        if not args or "cache" in switch:
            return None
        if switch.endswith("_dtype"):
            return self._dtype(source, args[-1])
        if switch.endswith("_enabled"):
            if isinstance(args[-1], cst.Name) and args[-1].value == "False":
                return None
            device = const_str(source, args[0]) if len(args) > 1 else ("cpu" if "cpu" in switch else "cuda")
            return {"cuda": "fp16", "cpu": "bf16"}.get(device or "", _UNRESOLVED)
        return _UNRESOLVED

    def _setting(self, source: SourceModel, ctx: AuditContext, write) -> list[Finding]:
        """``allow_tf32`` and ``fp32_precision`` under ``torch.backends``, however written."""
        if (
            write.attr not in ("allow_tf32", "fp32_precision")
            or write.how == "deleted"
            or not any(under(p, "torch.backends") for p in object_paths(source, write.obj))
        ):
            return []
        what = f"`{source.code(write.obj)}.{write.attr}`"
        if write.attr == "allow_tf32":
            value = write.value
            off = isinstance(value, cst.Name) and value.value == "False"
            return [] if off else self._flag(source, ctx, write.node, "tf32", what)
        text = const_str(source, write.value) if write.value is not None else None
        precision = _FP32_PRECISION.get(text.lower(), _UNRESOLVED) if text else _UNRESOLVED
        return self._flag(source, ctx, write.node, precision, what)

    def _autocast(self, source: SourceModel, call: cst.Call) -> str | None:
        kwargs = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        enabled = kwargs.get("enabled")
        if isinstance(enabled, cst.Name) and enabled.value == "False":
            return None
        if "dtype" in kwargs:
            dtype = self._dtype(source, kwargs["dtype"])  # a variable we cannot read is judged at run time
            return dtype
        device = kwargs.get("device_type")
        if device is None and call.args and call.args[0].keyword is None:
            device = call.args[0].value
        device_text = string_value(device) if device is not None else None
        if source.resolves_to(call.func, "torch.cuda.amp.autocast") or device_text == "cuda":
            return "fp16"  # autocast's default dtype on CUDA
        if source.resolves_to(call.func, "torch.cpu.amp.autocast") or device_text == "cpu":
            return "bf16"
        return None


RULE = PrecisionDowngrade()
