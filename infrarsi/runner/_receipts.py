"""Reading receipt lines back: tolerant of garbage, strict about what counts."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

__all__ = ["ReceiptSet", "parse_receipts"]


@dataclass
class ReceiptSet:
    steps: list[dict] = field(default_factory=list)
    meta: list[dict] = field(default_factory=list)
    ended: bool = False
    bad_lines: int = 0

    def measured(self, warmup: int, measure: int) -> list[dict]:
        """Step records of the measured window, in step order (first record per step)."""
        wanted = range(warmup + 1, warmup + measure + 1)
        by_step: dict[int, dict] = {}
        for rec in self.steps:
            by_step.setdefault(rec.get("step"), rec)
        return [by_step[s] for s in wanted if s in by_step]

    def step_times(self, warmup: int, measure: int) -> list[float] | None:
        """Seconds per measured step, or None when the window is incomplete or untimed."""
        window = self.measured(warmup, measure)
        if len(window) != measure:
            return None
        times = []
        for rec in window:
            t0, t1 = rec.get("t0_ns"), rec.get("t1_ns")
            if not isinstance(t0, int) or not isinstance(t1, int) or t1 < t0:
                return None
            times.append((t1 - t0) / 1e9)
        return times

    def median_step_time(self, warmup: int, measure: int) -> float | None:
        times = self.step_times(warmup, measure)
        return statistics.median(times) if times else None

    def peak_mem_bytes(self) -> int | None:
        values = [r["peak_mem_bytes"] for r in self.steps if isinstance(r.get("peak_mem_bytes"), int)]
        return max(values) if values else None

    def declared(self) -> dict:
        out: dict = {}
        for rec in self.meta:
            if isinstance(rec.get("declared"), dict):
                out.update(rec["declared"])
        return out

    def trajectory(self, key: str, steps: int) -> list[float | None]:
        by_step: dict[int, dict] = {}
        for rec in self.steps:
            by_step.setdefault(rec.get("step"), rec)
        out: list[float | None] = []
        for s in range(1, steps + 1):
            value = by_step.get(s, {}).get(key)
            out.append(float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None)
        return out


def parse_receipts(lines) -> ReceiptSet:
    """Parse receipt lines (str); lines that are not JSON objects are counted, not fatal."""
    out = ReceiptSet()
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            out.bad_lines += 1
            continue
        if not isinstance(rec, dict):
            out.bad_lines += 1
            continue
        kind = rec.get("type")
        if kind == "step" and isinstance(rec.get("step"), int):
            out.steps.append(rec)
        elif kind == "meta":
            out.meta.append(rec)
        elif kind == "end":
            out.ended = True
        else:
            out.bad_lines += 1
    return out
