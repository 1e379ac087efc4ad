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


@lru_cache(maxsize=1)
def environment_fingerprint() -> dict:
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    from infrarsi import __version__

    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch": torch_version,
        "infrarsi": __version__,
    }
