"""The probe: how a training script reports evidence to InfraRSI.

Imports nothing heavy: torch is touched only if the script already imported it.
With ``INFRARSI_RECEIPTS`` unset, :func:`from_env` returns a recorder that does
nothing, so an instrumented script still runs on its own.

Receipts are JSON lines. One ``meta`` record, then one ``step`` record per step
with ``step``, ``t0_ns``, ``t1_ns``, ``tokens``, ``loss``, ``grad_norm``,
``peak_mem_bytes`` and the precision the probe observed itself: parameter
dtypes of watched models, autocast states entered during the step, and the
float32 matmul precision. Timestamps are ``time.monotonic_ns()``, the clock the
runner stamps arrivals with, so the two can be compared directly. They go to
``$INFRARSI_RECEIPTS``: the runner's FIFO, or ``unix:PATH`` for a job of several ranks.

At the steps the runner samples (``$INFRARSI_SAMPLE``, read once and taken out of
the environment) the probe also observes, from the moment the previous step's line
is written to the moment the sampled step's line is, the dtypes operators really
ran in (``ops``), each parameter's gradient norm before each optimizer step
(``grads``) and every ``fp32_precision`` setting (``fp32_precision``); see
:class:`_Sampler`. Unsampled steps cost what they cost without it.

Why one module: this is the one file of InfraRSI a job imports, and the import rules hold it
to no other. The line writer, the step boundary, the sampler's window and the precision spies
share one state that the job must not reach; split into modules, each would be one more set
of importable names for a job to patch, and one more file for `integrity.framework` to pin.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# The autoprobe builds on these too: the same precision spies, in the same record format.
__all__ = [
    "Probe",
    "NullProbe",
    "from_env",
    "RECEIPTS_ENV",
    "STEPS_ENV",
    "AUTOPROBE_ENV",
    "SAMPLE_ENV",
    "AutocastSpy",
    "PARAM_REFRESH",
    "dtype_name",
    "legacy_matmul_precision",
    "remember_optimizer",
    "optimizer_params",
]

RECEIPTS_ENV = "INFRARSI_RECEIPTS"
STEPS_ENV = "INFRARSI_STEPS"
AUTOPROBE_ENV = "INFRARSI_AUTOPROBE"  # set by infrarsi.autoprobe while it records the steps
DETERMINISTIC_ENV = "INFRARSI_DETERMINISTIC"  # set by a calibration run: deterministic kernels
SAMPLE_ENV = "INFRARSI_SAMPLE"  # the runner's sampled steps ("3,17" or "all"): operator dtypes, per-parameter grads
RECEIPT_VERSION = 1
PARAM_REFRESH = 8


def _torch():
    """The torch module if the script has loaded it, else None (never imports it)."""
    return sys.modules.get("torch")


def _steps_from_env() -> int | None:
    raw = os.environ.get(STEPS_ENV)
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value > 0 else None


ALL_STEPS = "all"
_plan: frozenset[int] | str | None = None
_plan_taken = False


def _take_sample_plan() -> frozenset[int] | str | None:
    """The runner's sampled steps (a set, or ``"all"``), read once per process and taken out of the environment.

    Taken out of ``os.environ`` (and so out of every process the job starts) at once, so the job
    can't count on seeing which steps are observed. The process's initial environment block,
    ``/proc/self/environ``, still holds it: a job can dig it out there, which is why the static
    rules flag any ``INFRARSI_*`` access beyond the loop bound.
    """
    global _plan, _plan_taken
    if not _plan_taken:
        _plan_taken = True
        _plan = _parse_plan(os.environ.pop(SAMPLE_ENV, None))
    return _plan


def _parse_plan(raw: str | None) -> frozenset[int] | str | None:
    if not raw:
        return None
    if raw.strip() == ALL_STEPS:
        return ALL_STEPS
    steps = set()
    for part in raw.split(","):
        try:
            steps.add(int(part))
        except ValueError:
            continue
    return frozenset(s for s in steps if s > 0) or None


class AutocastSpy:
    """Records every autocast context entered while a step is open.

    Wraps ``torch.autocast.__enter__`` once per process; the CUDA and CPU
    subclasses call it through ``super()``, so all spellings are seen.
    """

    installed = False
    seen: set[str] = set()

    @classmethod
    def install(cls, torch) -> None:
        if cls.installed:
            return
        autocast_cls = getattr(torch, "autocast", None)
        original = getattr(autocast_cls, "__enter__", None)
        if original is None:
            return

        def __enter__(self, *args, **kwargs):
            if getattr(self, "_enabled", False):
                dtype = str(getattr(self, "fast_dtype", "")).replace("torch.", "")
                cls.seen.add(f"{getattr(self, 'device', '?')}:{dtype}")
            return original(self, *args, **kwargs)

        autocast_cls.__enter__ = __enter__
        cls.installed = True

    @classmethod
    def active_now(cls, torch) -> set[str]:
        found = set()
        for device in ("cpu", "cuda"):
            try:
                if torch.is_autocast_enabled(device):
                    dtype = str(torch.get_autocast_dtype(device)).replace("torch.", "")
                    found.add(f"{device}:{dtype}")
            except (TypeError, RuntimeError, AttributeError):
                continue
        return found


class NullProbe:
    """The recorder used when no runner is listening: every call is a no-op."""

    total_steps: int | None = None
    enabled = False

    def meta(self, **fields: Any) -> None:
        pass

    def watch(self, model: Any) -> Any:
        return model

    @contextmanager
    def step(self, step: int, tokens: int | None = None) -> Iterator[None]:
        yield

    def log(self, step: int, loss: float | None = None, grad_norm: float | None = None, **extra: Any) -> None:
        pass

    def close(self) -> None:
        pass


class Probe(NullProbe):
    """Writes receipts for one process to ``path`` (a file or the runner's FIFO)."""

    enabled = True

    def __init__(self, path: str, total_steps: int | None = None, sample: frozenset[int] | str | None = None) -> None:
        self.total_steps = total_steps
        self._file = _open_channel(path)
        self._models: list[weakref.ref] = []
        # Without watch(), the parameters come from every torch optimizer that steps: torch's
        # global step hook sees them without a line of the script changed.
        self._optimizers: list[weakref.ref] = []
        self._optimizer_hook: Any = None
        self._params: list[Any] = []
        self._params_stale = True
        self._steps_seen = 0
        self._pending: dict[str, Any] | None = None
        self._in_step = False
        self._cuda_available: bool | None = None  # asked once, at the first step with torch loaded
        self._cuda = False  # True from the first step on which the script has initialised CUDA
        self._write({"type": "meta", "version": RECEIPT_VERSION, "pid": os.getpid(), "t_ns": time.monotonic_ns()})
        self._sampler = _Sampler(self, sample) if sample else None
        self._lines = 0  # step lines written
        # A loop may count from 0 or from 1; receipts always count from 1. The first step region
        # entered decides (0: every number is shifted up by one, and said so); a log() before it
        # (an initial loss, say) is recorded as numbered, and a p.step(n) never entered decides nothing.
        self._shift: int | None = None
        self._sample_from_start()

    # -- recording -----------------------------------------------------------
    def meta(self, **fields: Any) -> None:
        """Declared facts about the job (params, flops_per_token, dtype ...)."""
        self._write({"type": "meta", "declared": fields, "t_ns": time.monotonic_ns()})

    def watch(self, model: Any) -> Any:
        """Observe ``model``'s parameter dtypes at every step (and name its parameters' gradients); returns it."""
        self._models.append(weakref.ref(model))
        return model

    def step(self, step: int, tokens: int | None = None) -> "_Step":
        """The timed region of one training step; syncs CUDA at both ends."""
        return _Step(self, step, tokens)

    def _entered(self, step: int) -> int:
        """The receipt's number of a step whose region is entered now: the first one decides."""
        if self._shift is None:
            self._shift = 1 if int(step) == 0 else 0
            self._write({"type": "meta", "counted_from": int(step), "t_ns": time.monotonic_ns()})
        return int(step) + self._shift

    def _number(self, step: int) -> int:
        """The receipt's step number (from 1) for the script's own count (from 0 or 1)."""
        return int(step) + (self._shift or 0)

    def _enter(self) -> Any:
        if self._in_step:
            raise RuntimeError("probe.step() blocks cannot nest")
        self._flush_pending()
        torch = _torch()
        if torch is not None:
            AutocastSpy.install(torch)
            AutocastSpy.seen = AutocastSpy.active_now(torch)
            if self._optimizer_hook is None:
                self._hook_optimizers()
        self._sync(torch)
        self._in_step = True
        return torch

    def _hook_optimizers(self) -> None:
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._optimizer_hook = register_optimizer_step_post_hook(self._saw_optimizer)
        except Exception:  # noqa: BLE001 - an older torch: only watch() gives parameter dtypes
            self._optimizer_hook = False

    def _saw_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if remember_optimizer(self._optimizers, optimizer):
            self._params_stale = True

    def _exit(self, torch: Any, step: int, tokens: int | None, t0: int) -> None:
        self._sync(torch)
        t1 = time.monotonic_ns()
        self._in_step = False
        record: dict[str, Any] = {
            "type": "step",
            "step": int(step),
            "t0_ns": t0,
            "t1_ns": t1,
            "tokens": None if tokens is None else int(tokens),
            "loss": None,
            "grad_norm": None,
            "peak_mem_bytes": self._peak_mem(torch),
        }
        record.update(self._precision(torch))
        self._pending = record

    def log(self, step: int, loss: float | None = None, grad_norm: float | None = None, **extra: Any) -> None:
        """Attach the step's loss and grad norm; the step's receipt line is written now."""
        step = self._number(step)
        record = self._pending
        if record is None or record["step"] != step:
            self._flush_pending()
            record = {
                "type": "step",
                "step": step,
                "t0_ns": None,
                "t1_ns": None,
                "tokens": None,
                "loss": None,
                "grad_norm": None,
                "peak_mem_bytes": None,
            }
        record["loss"] = _as_float(loss)
        record["grad_norm"] = _as_float(grad_norm)
        if extra:
            record["extra"] = {k: _as_float(v) if isinstance(v, (int, float)) else str(v) for k, v in extra.items()}
        self._pending = record
        self._flush_pending()

    def close(self) -> None:
        self._flush_pending()
        if self._optimizer_hook:
            self._optimizer_hook.remove()
        if self._sampler is not None:
            self._sampler.close({})  # a window after the last line belongs to no step
        self._write({"type": "end", "t_ns": time.monotonic_ns()})
        self._file.close()

    # -- internals -------------------------------------------------------------
    def _write(self, record: dict[str, Any]) -> None:
        # One write per line, under PIPE_BUF, so lines arrive whole at the runner.
        self._file.write(json.dumps(record, separators=(",", ":"), allow_nan=True) + "\n")

    def _write_step(self, record: dict[str, Any]) -> None:
        sampler = self._sampler
        if sampler is not None and sampler.step is not None:
            sampler.close(record)
        # The per-step line is formatted by hand: json.dumps is most of the probe's cost.
        try:
            parts = [f'"{key}":{_ENCODERS[key](value)}' for key, value in record.items()]
        except (KeyError, TypeError, ValueError):
            self._write(record)
        else:
            self._file.write("{" + ",".join(parts) + "}\n")
        self._lines += 1
        if sampler is not None:
            after = record.get("step")
            if (
                type(after) is int
                and (sampler.plan is ALL_STEPS or after + 1 in sampler.plan)
                and (self.total_steps is None or after < self.total_steps)
            ):
                sampler.open(after + 1)

    def _sample_from_start(self) -> None:
        """Observe step 1 from now on if it is sampled (the autoprobe calls this once torch is loaded)."""
        if self._sampler is not None and self._lines == 0 and self._sampler.wants(1):
            self._sampler.open(1)

    def _flush_pending(self) -> None:
        if self._pending is not None:
            self._write_step(self._pending)
            self._pending = None

    def _uses_cuda(self, torch) -> bool:
        # A script may first touch CUDA inside a step, so until it has, ask again each step
        # (is_initialized is a flag read; is_available, asked once, queries the driver).
        if self._cuda or torch is None:
            return self._cuda
        try:
            if self._cuda_available is None:
                self._cuda_available = bool(torch.cuda.is_available())
            self._cuda = self._cuda_available and bool(torch.cuda.is_initialized())
        except Exception:
            self._cuda_available, self._cuda = False, False
        return self._cuda

    def _sync(self, torch) -> None:
        if torch is not None and self._uses_cuda(torch):
            torch.cuda.synchronize()

    def _peak_mem(self, torch) -> int:
        if torch is not None and self._uses_cuda(torch):
            return int(torch.cuda.max_memory_allocated())
        return _resident_high_water()

    def _precision(self, torch) -> dict[str, Any]:
        if torch is None:
            return {}
        # Walking the module tree costs more than the rest of the probe together, so the
        # parameter list is refreshed every few steps; in-place dtype casts (.half(), .to())
        # keep the same Parameter objects and are seen at once.
        if self._params_stale or self._steps_seen % PARAM_REFRESH == 0:
            watched = [param for ref in self._models if (model := ref()) is not None for param in model.parameters()]
            self._params, self._params_stale = watched + optimizer_params(self._optimizers), False
        self._steps_seen += 1
        dtypes = {dtype_name(dtype) for dtype in {param.dtype for param in self._params}}
        out: dict[str, Any] = {"autocast": sorted(AutocastSpy.seen | AutocastSpy.active_now(torch))}
        if self._models or self._optimizers:
            out["param_dtypes"] = sorted(dtypes)
        matmul = legacy_matmul_precision(torch, self._cuda)
        if matmul is not None:
            out["fp32_matmul"] = matmul
        return out


def remember_optimizer(refs: list[weakref.ref], optimizer: Any) -> bool:
    """Add ``optimizer`` to ``refs`` (weak references, dead ones dropped); True when it is new."""
    refs[:] = [ref for ref in refs if ref() is not None]
    if any(ref() is optimizer for ref in refs):
        return False
    refs.append(weakref.ref(optimizer))
    return True


def optimizer_params(refs: list[weakref.ref]) -> list[Any]:
    """Every parameter in the param groups of the optimizers still alive in ``refs``."""
    return [
        param for ref in refs if (opt := ref()) is not None for group in opt.param_groups for param in group["params"]
    ]


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


class _Step:
    """The context manager of :meth:`Probe.step` (a class: cheaper than a generator)."""

    __slots__ = ("probe", "step", "tokens", "torch", "t0")

    def __init__(self, probe: Probe, step: int, tokens: int | None) -> None:
        self.probe, self.step, self.tokens = probe, step, tokens

    def __enter__(self) -> None:
        self.step = self.probe._entered(self.step)
        self.torch = self.probe._enter()
        self.t0 = time.monotonic_ns()

    def __exit__(self, *exc: Any) -> bool:
        self.probe._exit(self.torch, self.step, self.tokens, self.t0)
        return False


# -- the sampled steps ---------------------------------------------------------------------
class _Sampler:
    """Close observation of the runner's sampled steps; unsampled steps never get here.

    A window opens when the line of the step before a sampled one is written (at the start,
    for step 1) and closes when the sampled step's line is written, so work a job moves
    outside ``with p.step(...)`` is still inside it. While it is open:

    - a ``TorchDispatchMode`` records ``op:dtype`` for every math operator (matmul, linear,
      convolution, attention, RNN; forward and backward, as dispatched after autograd and
      autocast) and every operator that touches a float type narrower than float32, casts
      included (``_to_copy:bfloat16``). A higher-order operator is recorded with the dtypes it
      is given; what runs inside it is not seen. Under a dispatch mode torch.compile runs the
      compiled frames eagerly, so a compiled job's sampled step is observed as eager code and
      says so in ``ops_note``;
    - a global optimizer pre-step hook records each parameter's gradient norm (``grads``;
      ``None``: no gradient) and, for parameters of two or more dimensions, the norm of its
      smallest row (``grad_min_rows``), named from watched models or the modules the
      autoprobe saw called, else ``optimizer.group.index[shape]``.

    At the close the ``fp32_precision`` settings are read too. Nothing here may break the
    job: an observation that fails is left out of the record, which the verifiers treat as
    missing evidence.
    """

    def __init__(self, probe: Probe, plan: frozenset[int] | str) -> None:
        self.probe = probe
        self.plan = ALL_STEPS if plan == ALL_STEPS else frozenset(plan)  # the writer tests `is ALL_STEPS`
        self.step: int | None = None  # the step the open window belongs to
        self.spy: Any = None
        self.hook: Any = None
        self.grads: dict[str, float | None] | None = {}
        self.rows: dict[str, float] = {}  # the smallest row's gradient norm, of 2-D and larger parameters
        self.names: dict[int, str] | None = None
        self.optimizers: list[weakref.ref] = []  # in the order first seen stepping
        self.modules: list[weakref.ref] = []  # modules the autoprobe saw called, outermost first

    def wants(self, step: int) -> bool:
        return self.plan == ALL_STEPS or step in self.plan

    def open(self, step: int) -> None:
        torch = _torch()
        if torch is None or self.step is not None:
            return
        try:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            spy = _spy_class()()
            self.names = None  # named at the first optimizer step: p.watch() may come after the window opens
            self.grads, self.rows = {}, {}
            self.hook = register_optimizer_step_pre_hook(self._before_optimizer)
            spy.__enter__()
        except Exception:  # noqa: BLE001 - an older torch: the step goes unobserved (and says so)
            if self.hook is not None:
                self.hook.remove()
                self.hook = None
            return
        self.spy, self.step = spy, step

    def pause(self) -> None:
        """Stop recording operators: what runs next is InfraRSI's own bookkeeping."""
        if self.spy is not None:
            self.spy.recording = False

    def close(self, record: dict[str, Any]) -> None:
        """End the window; if ``record`` is the sampled step's, add what was seen to it."""
        step, spy, hook = self.step, self.spy, self.hook
        self.step = self.spy = self.hook = None
        if spy is None:
            return
        spy.recording = False
        try:
            hook.remove()
            _pop_spy(spy)
        except Exception:  # noqa: BLE001 - the job rearranged the mode stack: no evidence for this step
            return
        if record.get("step") != step:
            return  # the job wrote another step's line: the window is not that step's
        record["ops"] = sorted({f"{name}:{dtype_name(dtype)}" for name, dtype in spy.seen})
        if self.grads is not None:
            record["grads"] = self.grads
            record["grad_min_rows"] = self.rows
        torch = _torch()
        record["fp32_precision"] = _fp32_precision(torch, self.probe._cuda)
        if _compiled(torch):
            record["ops_note"] = (
                "torch.compile: compiled frames ran eagerly while observed (dynamo does not "
                "run compiled code under a dispatch mode); the compiled kernels are not seen"
            )

    # -- gradients -------------------------------------------------------------------------
    def _before_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        spy = self.spy
        if spy is None or self.grads is None:
            return
        recording, spy.recording = spy.recording, False
        try:
            self._record_grads(optimizer)
        except Exception:  # noqa: BLE001 - training goes on; the step's grads are missing evidence
            self.grads = None
        finally:
            spy.recording = recording

    def _record_grads(self, optimizer: Any) -> None:
        torch = _torch()
        index = self._optimizer_index(optimizer)
        if self.names is None:
            self.names = self._param_names()
        names, grads = [], []
        for g, group in enumerate(optimizer.param_groups):
            for i, param in enumerate(group["params"]):
                name = self.names.get(id(param))
                if name is None:
                    name = f"{index}.{g}.{i}[{'x'.join(map(str, param.shape))}]"
                names.append(name)
                grads.append(param.grad)
        with torch.no_grad():
            norms, rows = _grad_norms(torch, grads)
        for name, norm, row in zip(names, norms, rows):
            self.grads[name] = norm
            if row is not None:
                self.rows[name] = row

    def _optimizer_index(self, optimizer: Any) -> int:
        for index, ref in enumerate(self.optimizers):
            if ref() is optimizer:
                return index
        self.optimizers.append(weakref.ref(optimizer))
        return len(self.optimizers) - 1

    def _param_names(self) -> dict[int, str]:
        """id(parameter) -> its name in the outermost watched model or module that holds it."""
        roots = [m for ref in self.probe._models + self.modules if (m := ref()) is not None]
        names: dict[int, str] = {}
        used: set[str] = set()
        for index, module in enumerate(roots):
            try:
                first = next(module.parameters(), None)
                if first is None or id(first) in names:
                    continue  # a submodule of a root already named (or a parameterless one)
                for name, param in module.named_parameters():
                    if id(param) in names:
                        continue
                    if name in used:  # two separate models: the later one's names get its index
                        name = f"{index}/{name}"
                    names[id(param)] = name
                    used.add(name)
            except Exception:  # noqa: BLE001, S112 - a module that can't list its parameters is not named
                continue
        return names


def _grad_norms(torch: Any, grads: list[Any]) -> tuple[list[float | None], list[float | None]]:
    """Each gradient's 2-norm and, for those of two or more dimensions, its smallest row's 2-norm.

    None where there is no gradient (or no rows). The smallest row shows what a whole norm
    can't: a fused ``qkv`` whose query and key rows get nothing, next to value rows with a
    thousand times their gradient. Norms are taken in float32 or wider, with one host copy.
    """
    norms: list[float | None] = [None] * len(grads)
    rows: list[float | None] = [None] * len(grads)
    present = [(i, g) for i, g in enumerate(grads) if g is not None]
    if not present:
        return norms, rows
    dense = [(i, g.coalesce().values() if g.is_sparse else g) for i, g in present]
    try:
        tensors = [g for _, g in dense]
        if all(g.dtype in (torch.float32, torch.float64) and g.layout == torch.strided for g in tensors):
            whole = list(torch._foreach_norm(tensors))
        else:
            whole = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in tensors]
        least = [
            torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1, dtype=torch.float32).amin()
            for _, g in dense
            if g.dim() >= 2 and g.shape[0] and g[0].numel()
        ]
        device = whole[0].device
        values = torch.stack([n.to(device=device, dtype=torch.float64) for n in whole + least]).tolist()
    except Exception:  # noqa: BLE001 - odd layouts or several devices: norms one at a time, no rows
        values = []
        for _, g in dense:
            try:
                values.append(float(torch.linalg.vector_norm(g.detach().double())))
            except Exception:  # noqa: BLE001
                values.append(math.nan)
    taken = iter(values[len(dense) :])
    for (i, g), value in zip(dense, values):
        norms[i] = float(f"{value:.7g}")
        if len(values) > len(dense) and g.dim() >= 2 and g.shape[0] and g[0].numel():
            rows[i] = float(f"{next(taken):.7g}")
    return norms, rows


_SPY: Any = None
_KINDS: dict[Any, tuple[str, bool]] = {}  # operator -> (name, is a math operator)
_MATH_WORDS = ("matmul", "linear", "conv", "attention", "einsum", "addmv", "lstm", "gru", "rnn", "tensordot")
_MATH_NAMES = frozenset({"mv", "dot", "vdot", "inner", "outer", "ger", "addr"})


def _classify(func: Any) -> tuple[str, bool]:
    name = getattr(func, "_opname", None) or getattr(func, "_name", None) or str(func)
    if not hasattr(func, "_opname"):  # a higher-order operator: what it is given counts
        return str(name), True
    base = str(name).lstrip("_")
    math_op = (
        base in _MATH_NAMES
        or base.endswith("mm")
        or "addmm" in base
        or any(word in base for word in _MATH_WORDS if word != "conv")
        or ("conv" in base and "convert" not in base)
    )
    return str(name), math_op


def _spy_class() -> type:
    """The dispatch mode, defined once torch is loaded (the probe never imports torch itself)."""
    global _SPY
    if _SPY is not None:
        return _SPY
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    low = {
        d
        for d in (
            getattr(torch, n, None)
            for n in (
                "float16",
                "bfloat16",
                "float8_e4m3fn",
                "float8_e5m2",
                "float8_e4m3fnuz",
                "float8_e5m2fnuz",
                "float8_e8m0fnu",
                "float4_e2m1fn_x2",
            )
        )
        if d is not None
    }
    math_dtypes = low | {torch.float32, torch.float64, torch.int8, torch.uint8}
    tensor_type, dtype_type = torch.Tensor, torch.dtype

    def note(seen: set, func: Any, args: Any, kwargs: dict) -> None:
        kind = _KINDS.get(func)
        if kind is None:
            kind = _KINDS[func] = _classify(func)
        name, math_op = kind
        wanted = math_dtypes if math_op else low
        for value in (*args, *kwargs.values()):
            if isinstance(value, tensor_type):
                if value.dtype in wanted:
                    seen.add((name, value.dtype))
            elif isinstance(value, dtype_type):  # a cast's or a factory's target
                if value in low:
                    seen.add((name, value))
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, tensor_type) and item.dtype in wanted:
                        seen.add((name, item.dtype))

    class _OpSpy(TorchDispatchMode):
        supports_higher_order_operators = True  # recorded with the dtypes they are given

        def __init__(self) -> None:
            super().__init__()
            self.recording = True
            self.seen: set[tuple[str, Any]] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if kwargs is None:
                kwargs = {}
            if self.recording:
                try:
                    note(self.seen, func, args, kwargs)
                except Exception:  # noqa: BLE001, S110 - observing must never break an operator
                    pass
            return func(*args, **kwargs)

    _SPY = _OpSpy
    return _SPY


def _pop_spy(spy: Any) -> None:
    """Take ``spy`` off the dispatch mode stack, leaving any mode the job pushed above it in place."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode, _push_mode

    above = []
    try:
        while (top := _get_current_dispatch_mode()) is not None and top is not spy:
            above.append(_pop_mode())
        if top is spy:
            spy.__exit__(None, None, None)
    finally:
        for mode in reversed(above):
            _push_mode(mode)


def _compiled(torch: Any) -> bool:
    """Whether torch.compile has produced a graph in this process (its frames run eagerly when observed)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    try:
        return bool(dynamo is not None and dynamo.counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001
        return False


# torch.backends attributes holding an fp32_precision setting ("ieee", "tf32", "bf16", "none").
# The CUDA ones count only for a job that uses CUDA (they change nothing on a CPU).
_FP32_SETTINGS = (
    ("backends", (), False),
    ("mkldnn", ("mkldnn",), False),
    ("mkldnn.matmul", ("mkldnn", "matmul"), False),
    ("mkldnn.conv", ("mkldnn", "conv"), False),
    ("mkldnn.rnn", ("mkldnn", "rnn"), False),
    ("cuda.matmul", ("cuda", "matmul"), True),
    ("cudnn", ("cudnn",), True),
    ("cudnn.conv", ("cudnn", "conv"), True),
    ("cudnn.rnn", ("cudnn", "rnn"), True),
)


def _fp32_setting(torch: Any, path: tuple[str, ...]) -> str | None:
    try:
        obj = torch.backends
        for part in path:
            obj = getattr(obj, part)
        value = getattr(obj, "fp32_precision", None)
    except Exception:  # noqa: BLE001 - an older torch, or a backend that can't say
        return None
    return value if isinstance(value, str) else None


def _fp32_precision(torch: Any, cuda: bool) -> dict[str, str]:
    """Every fp32_precision setting that governs this job's math, and the legacy matmul mode."""
    out = {}
    if torch is None:
        return out
    for key, path, cuda_only in _FP32_SETTINGS:
        if cuda_only and not cuda:
            continue
        value = _fp32_setting(torch, path)
        if value is not None:
            out[key] = value
    legacy = legacy_matmul_precision(torch, cuda)
    if legacy is not None:
        out["legacy_matmul"] = legacy
    return out


def legacy_matmul_precision(torch: Any, cuda: bool) -> str | None:
    """``torch.get_float32_matmul_precision()``, even where torch refuses to answer.

    Once a job has set ``fp32_precision`` through the newer API so that the backends disagree,
    the legacy getter raises. Then the lowest of the settings governing this job's matmuls is
    given in the legacy spelling (bf16: "medium", tf32: "high", else "highest").
    """
    getter = getattr(torch, "get_float32_matmul_precision", None)
    if getter is None:
        return None
    try:
        return getter()
    except RuntimeError:
        paths = [(), ("mkldnn", "matmul")] + ([("cuda", "matmul")] if cuda else [])
        values = {_fp32_setting(torch, path) for path in paths}
        return "medium" if "bf16" in values else "high" if "tf32" in values else "highest"


def _int_or_null(value: Any) -> str:
    return "null" if value is None else str(int(value))


def _float_or_null(value: Any) -> str:
    if value is None:
        return "null"
    value = float(value)
    # repr of a finite float is valid JSON; NaN/inf take json's spelling (NaN, Infinity).
    return repr(value) if math.isfinite(value) else json.dumps(value, allow_nan=True)


_CACHE: dict[Any, str] = {}


def _str_list(value: Any) -> str:
    key = tuple(value)
    if key not in _CACHE:
        _CACHE[key] = json.dumps(list(key))
    return _CACHE[key]


def _string(value: Any) -> str:
    if value not in _CACHE:
        _CACHE[value] = json.dumps(value)
    return _CACHE[value]


_ENCODERS = {
    "type": _string,
    "step": _int_or_null,
    "t0_ns": _int_or_null,
    "t1_ns": _int_or_null,
    "tokens": _int_or_null,
    "loss": _float_or_null,
    "grad_norm": _float_or_null,
    "peak_mem_bytes": _int_or_null,
    "autocast": _str_list,
    "param_dtypes": _str_list,
    "fp32_matmul": _string,
    "extra": lambda v: json.dumps(v, allow_nan=True),
    "ops": _str_list,
    "grads": lambda v: json.dumps(v, allow_nan=True),
    "grad_min_rows": lambda v: json.dumps(v, allow_nan=True),
    "fp32_precision": json.dumps,
    "ops_note": _string,
}


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


def _deterministic_if_asked() -> None:
    """``$INFRARSI_DETERMINISTIC=1`` (a calibration run, `infrarsi baseline --calibrate`): torch's
    deterministic kernels where it has them (``warn_only``: an operator without one keeps its own)."""
    if os.environ.pop(DETERMINISTIC_ENV, None) != "1":
        return
    torch = _torch()
    if torch is not None:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)


def from_env() -> NullProbe:
    """A :class:`Probe` writing to ``$INFRARSI_RECEIPTS``, or a no-op recorder.

    Under ``evidence = "auto"`` the autoprobe already records every step, so a probe the
    script makes itself stays silent (it still tells the script the step count).
    """
    sample = _take_sample_plan()
    _deterministic_if_asked()
    path = os.environ.get(RECEIPTS_ENV)
    if not path:
        return NullProbe()
    if os.environ.get(AUTOPROBE_ENV):
        quiet = NullProbe()
        quiet.total_steps = _steps_from_env()
        return quiet
    return Probe(path, total_steps=_steps_from_env(), sample=sample)


def _open_channel(path: str):
    """The runner's receipt channel, line-buffered: its FIFO (or a plain file), or for a job of
    several ranks ``unix:PATH``, a socket on which the kernel tells the runner which process
    (so which rank) each connection is, whatever the job says."""
    if path.startswith("unix:"):
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path[len("unix:") :])
        channel = sock.makefile("w", encoding="utf-8")
        channel.reconfigure(line_buffering=True)  # makefile's text mode is never line-buffered itself
        return channel
    return open(path, "a", buffering=1, encoding="utf-8")


def _resident_high_water() -> int:
    """This process's resident high-water mark, in bytes, since it exec'd.

    ``VmHWM`` (Linux) belongs to the memory map exec created. ``ru_maxrss`` is the larger
    of that and the parent's size at fork, which Linux carries across exec, so a job
    started by a large driver would report the driver's memory as its own. Hence the
    first read in a process takes both: if they agree, or once ``ru_maxrss`` has risen
    above what was carried, ``ru_maxrss`` *is* the process's own mark, and one getrusage
    call (about 1 µs) stands in for having the kernel format /proc/self/status (about
    8 µs). Until then, and where /proc is missing, the slower or the only reading is used.
    """
    global _carried_kb, _carried_pid
    maxrss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    if _carried_pid == os.getpid() and maxrss > _carried_kb:
        return maxrss * 1024
    own = _vmhwm_kb()
    if own is None:
        return maxrss * 1024
    if _carried_pid != os.getpid():
        _carried_kb, _carried_pid = (maxrss if maxrss > own else 0), os.getpid()
    return own * 1024


def _vmhwm_kb() -> int | None:
    """``VmHWM`` from /proc/self/status, in kB (None where it cannot be read)."""
    global _status_fd, _status_pid
    try:
        # One descriptor per process, re-read from offset 0: opening the file and reading
        # it line by line costs more. /proc/self is resolved when opened, so a forked
        # child opens its own.
        if _status_pid != os.getpid():
            _status_fd, _status_pid = os.open("/proc/self/status", os.O_RDONLY), os.getpid()
        text = os.pread(_status_fd, 16384, 0)
        start = text.index(b"VmHWM:") + 6
        return int(text[start : text.index(b"kB", start)])
    except (OSError, ValueError):
        _status_pid = None  # the script may have closed the descriptor: open it again next time
    return None


_status_fd: int = -1
_status_pid: int | None = None
_carried_kb: int = 0  # ru_maxrss carried across exec (0: none above the process's own)
_carried_pid: int | None = None
