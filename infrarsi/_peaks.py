"""The peak MFU is measured against: the contract's ``peak_tflops``, else a known GPU's data-sheet
figure for the precision the baseline was seen training in; no peak, no MFU.

The figures are dense (no structured sparsity) tensor-core TFLOPS from NVIDIA's data sheets;
``fp32`` is the plain (non-tensor-core) figure, which is what torch uses unless TF32 is allowed.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

__all__ = ["KNOWN_PEAKS", "Peak", "peak_for", "training_precision", "IMPLAUSIBLE_MFU"]

# An MFU above this on a training job is more likely a wrong peak or a wrong flops_per_token
# than a real measurement (the best published large-model runs report 40-60%).
IMPLAUSIBLE_MFU = 0.70

# (model, matched as a whole word in the name nvidia-smi prints, case-insensitive; most specific
# first, so "H100 PCIe" wins over "H100" and "L4" never matches an "L40") -> TFLOPS.
KNOWN_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"fp8": 1513.0, "bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100 NVL", {"fp8": 1670.0, "bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0}),
    ("H100", {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM5
    ("H200", {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"fp8": 733.0, "bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"fp8": 242.5, "bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("V100-PCIE", {"fp16": 112.0, "fp32": 14.0}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),  # SXM2
)

# The narrowest precision seen is the one the matmuls ran in (autocast bf16 over fp32 weights: bf16).
_NARROWEST_FIRST = ("fp8", "fp16", "bf16", "tf32", "fp32")


@dataclass(frozen=True)
class Peak:
    """Where MFU's denominator came from: ``source`` is ``contract`` or ``table`` (then ``device``
    and ``precision`` say which row)."""

    tflops: float
    source: str
    device: str | None = None
    precision: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def training_precision(seen: set[str]) -> str | None:
    """The precision a step's matmuls ran in, from the precisions observed in it."""
    for name in _NARROWEST_FIRST:
        if name in seen:
            return name
    return None


def peak_for(contract_peak: float | None, gpus: list[str], precision: str | None) -> Peak | None:
    """The contract's peak when it sets one; else the table's, for one kind of GPU in it and a
    precision it lists; else None (then there is no MFU)."""
    if contract_peak is not None:
        return Peak(float(contract_peak), "contract")
    if not gpus or precision is None or len(set(gpus)) != 1:
        return None
    name = gpus[0]
    for model, peaks in KNOWN_PEAKS:
        if re.search(rf"(?<![a-z0-9]){re.escape(model)}(?![a-z0-9])", name, re.IGNORECASE):
            tflops = peaks.get(precision)
            return Peak(tflops, "table", name, precision) if tflops else None
    return None
