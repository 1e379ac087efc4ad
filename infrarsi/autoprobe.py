"""Receipts from a training script that does not use the probe: ``python -m infrarsi.autoprobe SCRIPT ARGS...``.

Zero change to the script. Before it runs, torch is wrapped so that the script's
own calls become evidence, written through :func:`infrarsi.probe.from_env` in the
probe's record format:

- a step ends when ``Optimizer.step()`` returns (CUDA synchronized first), or
  when a ``GradScaler`` skips the optimizer step because the gradients were not
  finite (the record then carries ``extra.skipped``). The next step starts once
  that receipt is written; step 1 starts at the first forward under autograd or
  the first ``backward()``, whichever comes first.
- the loss is the scalar ``backward()`` was called on (unscaled when it came from
  ``GradScaler.scale``). With gradient accumulation it is the *sum* of the step's
  backward scalars, and ``extra.backward_calls`` says how many there were: jobs
  divide each micro-batch loss by the number of micro-batches before
  ``backward()``, so the sum is the step's mean loss and does not change when a
  knob splits the same batch into more micro-batches (a mean would halve it).
- the grad norm is what ``clip_grad_norm_`` returned in the step (the last call),
  else the 2-norm of the stepped optimizers' gradients just before the step.
- parameter dtypes come from the optimizers' param groups, autocast states from
  the probe's autocast spy, the float32 matmul precision from torch.
- at the steps the runner samples, the probe's sampler adds operator dtypes,
  per-parameter gradient norms and the ``fp32_precision`` settings (see
  :mod:`infrarsi.probe`); parameters are named from the modules called before the
  first ``backward()`` (outermost first), as ``model.named_parameters()`` names them.

With several optimizers stepped back to back (one per parameter group family),
the step ends at the last of them. After ``$INFRARSI_STEPS`` steps the receipts
are closed and the process exits with code 0 at the script's next training call
(so its own log line for the last step still appears), or after a short grace.
With ``$INFRARSI_RECEIPTS`` unset the script runs exactly as it would on its own.

Why one module: it runs as ``python -m infrarsi.autoprobe`` ahead of the script, and its
wrappers (the optimizer's step, ``backward``, the GradScaler, the first forward) end and start
the same step together; they read as one piece, and like the probe it imports nothing else of
InfraRSI.
It drives the probe's private writer, sampler and CUDA helpers (``_write``, ``_write_step``,
``_sample_from_start``, ``_sync``): they stay private on the probe because the source audit
flags a job that reaches for them, and the autoprobe is the framework's own adapter, not a job.
"""

from __future__ import annotations

import functools
import math
import os
import runpy
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from infrarsi.probe import (
    AUTOPROBE_ENV,
    PARAM_REFRESH,
    RECEIPTS_ENV,
    AutocastSpy,
    dtype_name,
    from_env,
    legacy_matmul_precision,
    optimizer_params,
    remember_optimizer,
)

__all__ = ["AutoProbe", "main"]

_USAGE = "usage: python -m infrarsi.autoprobe SCRIPT [ARGS...]"
_UNSCALED = "_infrarsi_unscaled"  # set on GradScaler.scale's output: the loss before scaling
_GRACE_S = 1.0


def _exit_process() -> None:
    """Leave at once: the receipts are closed, and nothing the script would do next is wanted."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)


class AutoProbe:
    """Turns a script's torch calls into step receipts; :meth:`install` wraps torch, :meth:`uninstall` undoes it."""

    def __init__(self, probe: Any, total_steps: int | None = None, on_done: Callable[[], None] = _exit_process) -> None:
        self.probe, self.total_steps, self.on_done = probe, total_steps, on_done
        self.torch: Any = None
        self.steps = 0
        self.done = self.closed = self.broken = False
        self._patched: list[tuple[Any, str, Any]] = []
        self._handles: list[Any] = []
        self._forward_hook: Any = None
        self._timer: threading.Timer | None = None
        self._start_ns = time.monotonic_ns()
        self._t0: int | None = None  # start of the open step
        self._last_step_ns = 0
        self._losses: list[Any] = []  # the open step's scalar backward() tensors
        self._backwards = 0  # its backward() calls, scalar or not
        self._clipped: Any = None  # clip_grad_norm_'s result in the open step
        self._norms: list[Any] = []  # fallback: per-optimizer grad norms before their step
        self._tokens = 0  # the open step's tokens: integer inputs to the outermost module
        self._tokens_known = True  # False once a training forward had no single integer input
        self._backward_since_end = False
        self._in_backward = False
        self._depth = 0  # optimizer.step() nesting (wrappers calling inner optimizers)
        self._returns = 0  # optimizer.step() returns, to see a GradScaler skip
        self._closer: weakref.ref | None = None
        self._optimizers: list[weakref.ref] = []
        self._params: list[Any] = []
        self._modules: list[weakref.ref] = []  # called before the first backward, outermost first
        self._module_ids: set[int] = set()
        self._on_backward = self._guarded(self._before_backward)
        self._on_step_skipped = self._guarded(self._step_returned)

    # -- installing --------------------------------------------------------------
    def install(self, torch: Any) -> "AutoProbe":
        """Wrap ``torch`` for this process until :meth:`uninstall`; returns self."""
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        self.torch = torch
        AutocastSpy.install(torch)
        self._patch(torch.autograd, "backward", self._wrap_backward)
        clip = self._wrap_clip(torch.nn.utils.clip_grad.clip_grad_norm_, given=False)
        for owner in (torch.nn.utils.clip_grad, torch.nn.utils):
            self._patch(owner, "clip_grad_norm_", lambda _: clip)
        if hasattr(torch.nn.utils, "clip_grads_with_norm_"):  # torch >= 2.6: get_total_norm, then this
            self._patch(torch.nn.utils, "clip_grads_with_norm_", lambda f: self._wrap_clip(f, given=True))
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is not None:
            self._patch(scaler, "scale", self._wrap_scale)
            self._patch(scaler, "step", self._wrap_scaler_step)
        self._handles.append(optim.register_optimizer_step_pre_hook(self._guarded(self._before_optimizer)))
        self._handles.append(optim.register_optimizer_step_post_hook(self._guarded(self._after_optimizer)))
        self._forward_hook = nn_module.register_module_forward_pre_hook(self._guarded(self._before_forward))
        self.probe._write(
            {
                "type": "meta",
                "adapter": "autoprobe",
                "t_ns": time.monotonic_ns(),
                "loss": "sum of the scalars backward() was called on in the step",
                "grad_norm": "clip_grad_norm_ result, else the 2-norm of the optimizers' grads",
                "tokens": "elements of the one integer tensor (input_ids) each training forward of the outermost "
                "module is given, summed over the step; none where a forward has none or several",
            }
        )
        sampler = getattr(self.probe, "_sampler", None)
        if sampler is not None:
            sampler.modules = self._modules  # names for the parameters' gradients
            self.probe._sample_from_start()
        return self

    def uninstall(self) -> None:
        """Restore what :meth:`install` wrapped (the autocast spy stays: it only watches)."""
        self._cancel_timer()
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()
        for handle in self._handles + [self._forward_hook]:
            if handle is not None:
                handle.remove()
        self._handles, self._forward_hook = [], None

    def close(self) -> None:
        """Write the end record, once."""
        if not self.closed:
            self.closed = True
            self.probe.close()

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name)
        self._patched.append((owner, name, original))
        setattr(owner, name, make(original))

    def _guarded(self, hook: Callable) -> Callable:
        """A hook that can never break the user's training: a failure stops recording, loudly."""

        @functools.wraps(hook)
        def guarded(*args: Any) -> None:
            if self.broken:
                return None
            try:
                hook(*args)
            except Exception as exc:  # noqa: BLE001 - evidence is lost, training must go on
                self._break(exc)
            return None

        return guarded

    def _break(self, exc: BaseException) -> None:
        self.broken = True
        print(f"infrarsi.autoprobe: stopped recording receipts: {type(exc).__name__}: {exc}", file=sys.stderr)
        try:
            self.probe._write(
                {"type": "meta", "adapter_error": f"{type(exc).__name__}: {exc}", "t_ns": time.monotonic_ns()}
            )
        except Exception:
            pass

    # -- wrappers ----------------------------------------------------------------
    def _wrap_backward(self, original: Callable) -> Callable:
        @functools.wraps(original)
        def backward(tensors, *args, **kwargs):
            # Nested calls (reentrant checkpointing recomputes inside backward) are not losses.
            if self._in_backward or self.broken:
                return original(tensors, *args, **kwargs)
            self._on_backward(tensors)
            self._in_backward = True
            try:
                return original(tensors, *args, **kwargs)
            finally:
                self._in_backward = False

        return backward

    def _wrap_clip(self, original: Callable, given: bool) -> Callable:
        """The norm ``clip_grad_norm_`` returns, or the one ``clip_grads_with_norm_`` is given."""

        @functools.wraps(original)
        def clip(*args, **kwargs):
            result = original(*args, **kwargs)
            norm = kwargs.get("total_norm", args[2] if len(args) > 2 else None) if given else result
            if norm is not None and not self.broken and not self.done:
                self._clipped = norm
            return result

        return clip

    def _wrap_scale(self, original: Callable) -> Callable:
        torch = self.torch

        @functools.wraps(original)
        def scale(scaler, outputs):
            scaled = original(scaler, outputs)
            if scaled is not outputs and isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor):
                try:
                    setattr(scaled, _UNSCALED, outputs.detach())
                except (AttributeError, RuntimeError):
                    pass
            return scaled

        return scale

    def _wrap_scaler_step(self, original: Callable) -> Callable:
        @functools.wraps(original)
        def step(scaler, optimizer, *args, **kwargs):
            before = self._returns
            result = original(scaler, optimizer, *args, **kwargs)
            if self._returns == before and self._depth == 0:
                # Not finite gradients: the scaler skipped optimizer.step(), but the step happened.
                self._on_step_skipped(optimizer, True)
            return result

        return step

    # -- hooks ---------------------------------------------------------------------
    def _before_forward(self, module: Any, args: Any) -> None:
        if self.done:
            self._leave()
            return
        if id(module) not in self._module_ids:
            self._module_ids.add(id(module))
            self._modules.append(weakref.ref(module))
        if self._t0 is None and self.torch.is_grad_enabled():
            self._start_first_step()
            self._count_tokens(module, args, {})  # this call: its positional inputs are all it shows
            self._handles.append(module.register_forward_pre_hook(self._guarded(self._count_tokens), with_kwargs=True))

    def _declare_flops(self) -> None:
        """For MFU where the script declares nothing: 6 x the trainable parameters the optimizers
        step, per token (a dense model's forward and backward), recorded as an estimate."""
        params = {id(p): p for p in self._params if getattr(p, "requires_grad", False)}
        if params:
            count = sum(int(p.numel()) for p in params.values())
            self.probe._write(
                {
                    "type": "meta",
                    "declared": {"flops_per_token_estimate": 6 * count},
                    "t_ns": time.monotonic_ns(),
                }
            )

    def _count_tokens(self, module: Any, args: Any, kwargs: Any) -> None:
        """Tokens of one training forward of the outermost module: the elements of its one integer
        input (first positional argument or ``input_ids``). Evaluation (no grad) is not training."""
        if not self.torch.is_grad_enabled():
            return
        given = [args[0] if args else None, (kwargs or {}).get("input_ids")]
        ids = [
            t
            for t in given
            if isinstance(t, self.torch.Tensor)
            and not t.is_floating_point()
            and not t.is_complex()
            and t.dtype != self.torch.bool
        ]
        if len(ids) == 1:
            self._tokens += int(ids[0].numel())
        else:
            self._tokens_known = False

    def _before_backward(self, tensors: Any) -> None:
        if self.done:
            self._leave()
            return
        if self._t0 is None:
            self._start_first_step()
        if self._forward_hook is not None:  # step 1 has started; global hooks slow every module call
            self._forward_hook.remove()
            self._forward_hook = None
        self._backward_since_end = True
        self._backwards += 1
        loss = tensors
        if isinstance(tensors, (list, tuple)) and len(tensors) == 1:
            loss = tensors[0]
        if isinstance(loss, self.torch.Tensor) and loss.numel() == 1:
            self._losses.append(getattr(loss, _UNSCALED, loss).detach())

    def _before_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._depth += 1
        if self.done:
            self._leave()
        elif self._depth == 1 and self._clipped is None:
            self._norms.append(self._grad_norm_of(optimizer))

    def _after_optimizer(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._depth = max(0, self._depth - 1)
        self._returns += 1
        if self._depth == 0:
            self._step_returned(optimizer, False)

    def _step_returned(self, optimizer: Any, skipped: bool) -> None:
        if self.done:
            return
        self._remember(optimizer)
        closer = self._closer() if self._closer is not None else None
        if closer is None or closer is optimizer:
            self._closer = weakref.ref(optimizer)
            self._end_step(skipped)
        elif not self._backward_since_end:
            # A second optimizer stepped right after the one we ended on, with no backward
            # between: both belong to one training step, which ends at this one from now on.
            self._closer = weakref.ref(optimizer)
            self._norms.clear()

    # -- the step ------------------------------------------------------------------
    def _cuda_in_use(self) -> None:
        # Asked again until CUDA is seen: the first forward may come before the model is moved.
        # The probe's own helpers (sync, peak memory) follow this answer.
        if not self.probe._cuda:
            try:
                self.probe._cuda = bool(self.torch.cuda.is_initialized())
            except Exception:
                self.probe._cuda = False

    def _start_first_step(self) -> None:
        self._cuda_in_use()
        self.probe._sync(self.torch)
        self._t0 = time.monotonic_ns()

    def _end_step(self, skipped: bool) -> None:
        torch, probe = self.torch, self.probe
        sampler = getattr(probe, "_sampler", None)
        if sampler is not None:
            sampler.pause()  # the receipt's own arithmetic is not the job's
        self._cuda_in_use()
        probe._sync(torch)
        t1 = time.monotonic_ns()
        self.steps += 1
        t0 = self._t0 if self._t0 is not None else self._start_ns
        extra: dict[str, Any] = {"backward_calls": self._backwards}
        if skipped:
            extra["skipped"] = "GradScaler: gradients not finite"
        record: dict[str, Any] = {
            "type": "step",
            "step": self.steps,
            "t0_ns": t0,
            "t1_ns": t1,
            "tokens": self._tokens if self._tokens_known and self._tokens else None,
            "loss": self._loss(),
            "grad_norm": self._grad_norm(),
            "peak_mem_bytes": probe._peak_mem(torch),
            "param_dtypes": self._param_dtypes(),
            "autocast": sorted(AutocastSpy.seen | AutocastSpy.active_now(torch)),
            "fp32_matmul": legacy_matmul_precision(torch, probe._cuda),
            "extra": extra,
        }
        probe._write_step(record)
        if self.steps == 1:
            self._declare_flops()
        self._losses, self._backwards, self._clipped, self._norms = [], 0, None, []
        self._tokens, self._tokens_known = 0, True
        self._backward_since_end = False
        AutocastSpy.seen = AutocastSpy.active_now(torch)
        self._last_step_ns = t1 - t0
        if self.total_steps is not None and self.steps >= self.total_steps:
            self._finish()
        # The receipt's own cost is left out of the next step.
        self._t0 = time.monotonic_ns()

    def _finish(self) -> None:
        from torch.nn.modules import module as nn_module

        self.done = True
        self.close()
        if self._forward_hook is None:  # the next forward is the moment to leave
            self._forward_hook = nn_module.register_module_forward_pre_hook(self._guarded(self._before_forward))
        grace = _GRACE_S + 2 * self._last_step_ns / 1e9
        self._timer = threading.Timer(grace, self._leave)
        self._timer.daemon = True
        self._timer.start()

    def _leave(self) -> None:
        self._cancel_timer()
        self.on_done()

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()

    # -- evidence --------------------------------------------------------------------
    def _loss(self) -> float | None:
        losses = self._losses
        if not losses:
            return None
        if len(losses) == 1:
            return _as_float(losses[0])
        try:  # one device-to-host copy, not one per micro-batch
            return _as_float(self.torch.stack([t.reshape(()).double() for t in losses]).sum())
        except RuntimeError:  # losses on several devices
            values = [_as_float(t) for t in losses]
            return None if None in values else math.fsum(values)

    def _grad_norm(self) -> float | None:
        if self._clipped is not None:
            return _as_float(self._clipped)
        # An optimizer without gradients (frozen parameters) adds nothing to the norm.
        norms = [n for n in self._norms if n is not None]
        if not norms:
            return None
        values = [_as_float(n) for n in norms]
        return None if None in values else math.sqrt(sum(v * v for v in values))

    def _grad_norm_of(self, optimizer: Any) -> Any:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return None
        torch = self.torch
        try:
            return torch.nn.utils.get_total_norm(grads, 2.0)
        except (AttributeError, RuntimeError, TypeError):  # torch < 2.6, or grads it cannot group
            pass
        try:
            with torch.no_grad():
                norms = [torch.linalg.vector_norm(g.detach().float()).to(grads[0].device) for g in grads]
                return torch.linalg.vector_norm(torch.stack(norms))
        except (RuntimeError, TypeError):  # sparse or otherwise odd gradients: no norm, no failure
            return None

    def _remember(self, optimizer: Any) -> None:
        if remember_optimizer(self._optimizers, optimizer):
            self._params = []

    def _param_dtypes(self) -> list[str]:
        # Casts in place (.half(), .to()) keep the Parameter objects and are seen at once;
        # the list itself is refreshed every few steps, for add_param_group().
        if not self._params or self.steps % PARAM_REFRESH == 0:
            self._params = optimizer_params(self._optimizers)
        return sorted({dtype_name(dtype) for dtype in {p.dtype for p in self._params}})


def _as_float(value: Any) -> float | None:
    """A float (NaN and inf kept: a diverged loss is evidence), or None when it cannot be read."""
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def main(argv: list[str] | None = None) -> int:
    """Run SCRIPT as ``__main__`` with ARGS, recording receipts when a runner is listening."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["-h"], ["--help"]):
        print(_USAGE)
        return 0
    if not args:
        print(_USAGE, file=sys.stderr)
        return 2
    script = args[0]
    if not os.path.isfile(script):
        print(f"infrarsi.autoprobe: can't open file {script!r}: no such file", file=sys.stderr)
        return 2
    sys.argv = [script, *args[1:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    if os.environ.get(RECEIPTS_ENV):
        import torch  # noqa: F401  (before from_env: it sets torch's deterministic mode when a calibration asks)
    probe = from_env()
    auto = None
    if probe.enabled:
        import torch

        auto = AutoProbe(probe, probe.total_steps).install(torch)
        os.environ[AUTOPROBE_ENV] = "1"  # a probe the script makes itself must not record the steps twice
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if auto is not None and exc.code in (None, 0):
            auto.close()
        raise
    if auto is not None:
        auto._cancel_timer()
        auto.close()
    return 0


if __name__ == "__main__":
    # Run as the importable module, never as __main__: the script becomes __main__, and code that
    # finds a function's globals by its module's name (torch.compile's tracer, over these hooks)
    # must find this module's, not the script's.
    from infrarsi import autoprobe as _module

    sys.exit(_module.main())
