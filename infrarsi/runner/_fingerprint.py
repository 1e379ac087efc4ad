"""The machine and software a measurement was taken on (cheap: no torch import)."""

from __future__ import annotations

import os
import platform
import sys
from functools import lru_cache
from importlib import metadata

__all__ = ["environment_fingerprint"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _torch_cuda_version() -> str | None:
    """The CUDA version torch was built with, read from torch/version.py without importing torch."""
    try:
        files = metadata.files("torch") or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if str(file).replace("\\", "/") == "torch/version.py":
            try:
                text = file.locate().read_text()
            except OSError:
                return None
            for line in text.splitlines():
                if line.startswith("cuda") and "=" in line:
                    value = line.split("=", 1)[1].split("#", 1)[0].strip().strip("'\"")
                    return None if value in ("None", "") else value
    return None


def _gpus() -> tuple[list[str], str | None]:
    """Device names and driver version from nvidia-smi, when there is one (no CUDA init here)."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return [], None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [], None
    rows = [[part.strip() for part in line.split(",")] for line in out.splitlines() if "," in line]
    return [r[0] for r in rows], (rows[0][1] if rows else None)


@lru_cache(maxsize=1)
def environment_fingerprint() -> dict:
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    from infrarsi import __version__

    gpus, driver = _gpus()
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch_version,
        "torch_cuda": _torch_cuda_version(),
        "gpus": gpus,
        "driver": driver,
        "infrarsi": __version__,
    }
