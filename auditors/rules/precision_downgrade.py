"""precision_downgrade: no training precision below what the contract's ``precision`` allows."""

from __future__ import annotations

import libcst as cst

from .._rule import AuditContext, Example, Finding, Rule
from .._source import SourceModel, string_value

_DTYPES = {"torch.float16": "fp16", "torch.half": "fp16", "torch.bfloat16": "bf16",
           "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8", "torch.float8_e4m3fnuz": "fp8",
           "torch.float8_e5m2fnuz": "fp8", "torch.float32": "fp32", "torch.float": "fp32",
           "torch.float64": "fp64", "torch.double": "fp64"}
_DTYPE_STRINGS = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "torch.HalfTensor": "fp16",
                  "torch.cuda.HalfTensor": "fp16", "torch.BFloat16Tensor": "bf16",
                  "torch.cuda.BFloat16Tensor": "bf16"}
_CAST_METHODS = {"half": "fp16", "bfloat16": "bf16"}
_AUTOCAST = ("torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast",
             "torch.amp.autocast_mode.autocast")
_TF32_SWITCHES = ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32")
_MATMUL = {"high": "tf32", "medium": "bf16"}


class PrecisionDowngrade(Rule):
    id = "precision_downgrade"
    message = "a lower precision than the contract allows"
    VALID = [
        "model = model.float()\nx = x.to(device)\nmask = torch.ones(t, t, dtype=torch.bool)\n",
        Example("import torch\nwith torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n    loss = model(x)\n",
                precision=("fp32", "bf16")),
        Example("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n", precision=("fp32", "tf32")),
        "import torch\ntorch.set_float32_matmul_precision('highest')\n",
        "import torch\nwith torch.autocast(device_type='cuda', enabled=False):\n    loss = model(x)\n",
        "import torch\ntorch.backends.cuda.matmul.allow_tf32 = False\n",
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
        Example("import torch\nwith torch.autocast(device_type='cuda', dtype=torch.float16):\n    loss = model(x)\n",
                precision=("fp32", "bf16"), note="bf16 is allowed, fp16 is not"),
    ]

    def _dtype(self, source: SourceModel, expr: cst.CSTNode) -> str | None:
        for name, precision in _DTYPES.items():
            if source.resolves_to(expr, name) and name in source.qnames(expr):
                return precision
        text = string_value(expr)
        return _DTYPE_STRINGS.get(text) if text else None

    def _flag(self, source, ctx, node, precision, what) -> list[Finding]:
        if precision is None or precision in ("fp32", "fp64") or ctx.allows(precision):
            return []
        allowed = ", ".join(ctx.precision) or "nothing"
        return [self.finding(source, node, f"{what} trains in {precision}; the contract allows only {allowed}")]

    def check(self, source: SourceModel, ctx: AuditContext) -> list[Finding]:
        findings = []
        for call in source.of_type(cst.Call):
            func = call.func
            attr = func.attr.value if isinstance(func, cst.Attribute) else None
            if attr in _CAST_METHODS and not call.args:
                findings += self._flag(source, ctx, call, _CAST_METHODS[attr], f"`.{attr}()`")
            elif attr in ("to", "type"):
                for arg in call.args:
                    if arg.keyword is None or arg.keyword.value == "dtype":
                        findings += self._flag(source, ctx, call, self._dtype(source, arg.value),
                                               f"`{source.code(call)}`")
            elif any(source.resolves_to(func, a) and a in source.qnames(func) for a in _AUTOCAST):
                findings += self._flag(source, ctx, call, self._autocast(source, call), f"`{source.code(call)}`")
            elif source.resolves_to(func, "torch.set_float32_matmul_precision") and call.args:
                findings += self._flag(source, ctx, call, _MATMUL.get(string_value(call.args[0].value) or ""),
                                       "float32 matmul precision")
            elif source.resolves_to(func, "torch.set_default_dtype") and call.args:
                findings += self._flag(source, ctx, call, self._dtype(source, call.args[0].value),
                                       "the default dtype")
            else:
                for arg in call.args:
                    if arg.keyword is not None and arg.keyword.value == "dtype":
                        findings += self._flag(source, ctx, call, self._dtype(source, arg.value),
                                               f"`dtype={source.code(arg.value)}`")
        for node in source.of_type(cst.AssignTarget):
            if any(source.resolves_to(node.target, s) for s in _TF32_SWITCHES):
                value = source.parent.get(node).value
                if not (isinstance(value, cst.Name) and value.value == "False"):
                    findings += self._flag(source, ctx, node, "tf32", f"`{source.code(node.target)}`")
        return findings

    def _autocast(self, source: SourceModel, call: cst.Call) -> str | None:
        kwargs = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        enabled = kwargs.get("enabled")
        if isinstance(enabled, cst.Name) and enabled.value == "False":
            return None
        if "dtype" in kwargs:
            return self._dtype(source, kwargs["dtype"])  # a dtype we cannot read is not judged here
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
