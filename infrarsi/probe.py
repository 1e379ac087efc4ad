"""The probe: how a training script reports evidence to InfraRSI.

Imports nothing heavy: torch is touched only if the script already imported it.
With ``INFRARSI_RECEIPTS`` unset, :func:`from_env` returns a recorder that does
nothing, so an instrumented script still runs on its own.

Receipts are JSON lines. One ``meta`` record, then one ``step`` record per step
with ``step``, ``t0_ns``, ``t1_ns``, ``tokens``, ``loss``, ``grad_norm``,
``peak_mem_bytes`` and the precision the probe observed itself: parameter
dtypes of watched models, autocast states entered during the step, and the
float32 matmul precision. Timestamps are ``time.monotonic_ns()``, the clock the
runner stamps arrivals with, so the two can be compared directly.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
import weakref
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["Probe", "NullProbe", "from_env", "RECEIPTS_ENV", "STEPS_ENV", "AUTOPROBE_ENV"]

RECEIPTS_ENV = "INFRARSI_RECEIPTS"
STEPS_ENV = "INFRARSI_STEPS"
AUTOPROBE_ENV = "INFRARSI_AUTOPROBE"  # set by infrarsi.autoprobe while it records the steps
RECEIPT_VERSION = 1
_PARAM_REFRESH = 8


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


class _AutocastSpy:
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

    def __init__(self, path: str, total_steps: int | None = None) -> None:
        self.total_steps = total_steps
        self._file = open(path, "a", buffering=1, encoding="utf-8")
        self._models: list[weakref.ref] = []
        self._params: list[Any] = []
        self._steps_seen = 0
        self._pending: dict[str, Any] | None = None
        self._in_step = False
        self._cuda_available: bool | None = None  # asked once, at the first step with torch loaded
        self._cuda = False  # True from the first step on which the script has initialised CUDA
        self._write({"type": "meta", "version": RECEIPT_VERSION, "pid": os.getpid(),
                     "t_ns": time.monotonic_ns()})

    # -- recording -----------------------------------------------------------
    def meta(self, **fields: Any) -> None:
        """Declared facts about the job (params, flops_per_token, dtype ...)."""
        self._write({"type": "meta", "declared": fields, "t_ns": time.monotonic_ns()})

    def watch(self, model: Any) -> Any:
        """Observe ``model``'s parameter dtypes at every step; returns the model."""
        self._models.append(weakref.ref(model))
        return model

    def step(self, step: int, tokens: int | None = None) -> "_Step":
        """The timed region of one training step; syncs CUDA at both ends."""
        return _Step(self, step, tokens)

    def _enter(self) -> Any:
        if self._in_step:
            raise RuntimeError("probe.step() blocks cannot nest")
        self._flush_pending()
        torch = _torch()
        if torch is not None:
            _AutocastSpy.install(torch)
            _AutocastSpy.seen = _AutocastSpy.active_now(torch)
        self._sync(torch)
        self._in_step = True
        return torch

    def _exit(self, torch: Any, step: int, tokens: int | None, t0: int) -> None:
        self._sync(torch)
        t1 = time.monotonic_ns()
        self._in_step = False
        record: dict[str, Any] = {"type": "step", "step": int(step), "t0_ns": t0, "t1_ns": t1,
                                  "tokens": None if tokens is None else int(tokens),
                                  "loss": None, "grad_norm": None,
                                  "peak_mem_bytes": self._peak_mem(torch)}
        record.update(self._precision(torch))
        self._pending = record

    def log(self, step: int, loss: float | None = None, grad_norm: float | None = None, **extra: Any) -> None:
        """Attach the step's loss and grad norm; the step's receipt line is written now."""
        record = self._pending
        if record is None or record["step"] != int(step):
            self._flush_pending()
            record = {"type": "step", "step": int(step), "t0_ns": None, "t1_ns": None,
                      "tokens": None, "loss": None, "grad_norm": None, "peak_mem_bytes": None}
        record["loss"] = _as_float(loss)
        record["grad_norm"] = _as_float(grad_norm)
        if extra:
            record["extra"] = {k: _as_float(v) if isinstance(v, (int, float)) else str(v)
                               for k, v in extra.items()}
        self._pending = record
        self._flush_pending()

    def close(self) -> None:
        self._flush_pending()
        self._write({"type": "end", "t_ns": time.monotonic_ns()})
        self._file.close()

    # -- internals -------------------------------------------------------------
    def _write(self, record: dict[str, Any]) -> None:
        # One write per line, under PIPE_BUF, so lines arrive whole at the runner.
        self._file.write(json.dumps(record, separators=(",", ":"), allow_nan=True) + "\n")

    def _write_step(self, record: dict[str, Any]) -> None:
        # The per-step line is formatted by hand: json.dumps is most of the probe's cost.
        try:
            parts = [f'"{key}":{_ENCODERS[key](value)}' for key, value in record.items()]
        except (KeyError, TypeError, ValueError):
            self._write(record)
            return
        self._file.write("{" + ",".join(parts) + "}\n")

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
        if self._steps_seen % _PARAM_REFRESH == 0:
            self._params = [param for ref in self._models if (model := ref()) is not None
                            for param in model.parameters()]
        self._steps_seen += 1
        dtypes = {_dtype_name(dtype) for dtype in {param.dtype for param in self._params}}
        out: dict[str, Any] = {"autocast": sorted(_AutocastSpy.seen | _AutocastSpy.active_now(torch))}
        if self._models:
            out["param_dtypes"] = sorted(dtypes)
        try:
            out["fp32_matmul"] = torch.get_float32_matmul_precision()
        except AttributeError:
            pass
        return out


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
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
        self.torch = self.probe._enter()
        self.t0 = time.monotonic_ns()

    def __exit__(self, *exc: Any) -> bool:
        self.probe._exit(self.torch, self.step, self.tokens, self.t0)
        return False


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
    "type": _string, "step": _int_or_null, "t0_ns": _int_or_null, "t1_ns": _int_or_null,
    "tokens": _int_or_null, "loss": _float_or_null, "grad_norm": _float_or_null,
    "peak_mem_bytes": _int_or_null, "autocast": _str_list, "param_dtypes": _str_list,
    "fp32_matmul": _string, "extra": lambda v: json.dumps(v, allow_nan=True),
}


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


def from_env() -> NullProbe:
    """A :class:`Probe` writing to ``$INFRARSI_RECEIPTS``, or a no-op recorder.

    Under ``evidence = "auto"`` the autoprobe already records every step, so a probe the
    script makes itself stays silent (it still tells the script the step count).
    """
    path = os.environ.get(RECEIPTS_ENV)
    if not path:
        return NullProbe()
    if os.environ.get(AUTOPROBE_ENV):
        quiet = NullProbe()
        quiet.total_steps = _steps_from_env()
        return quiet
    return Probe(path, total_steps=_steps_from_env())


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
        return int(text[start:text.index(b"kB", start)])
    except (OSError, ValueError):
        _status_pid = None  # the script may have closed the descriptor: open it again next time
    return None


_status_fd: int = -1
_status_pid: int | None = None
_carried_kb: int = 0        # ru_maxrss carried across exec (0: none above the process's own)
_carried_pid: int | None = None
