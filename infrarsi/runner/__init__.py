"""The runner: every execution in a sandbox copy of the workspace, launched under containment
(a subreaper shim, a cgroup where one is writable), a memory guard and a timeout, timed on
InfraRSI's own clock, with the evidence the job left (probe, autoprobe or log lines) read back.

``Executor`` is the seam: ``LocalExecutor`` runs here, one execution at a time. Names load on
first use, so a part that needs only the patched sources does not load the executor (numpy,
the verifiers) with them.
"""

from __future__ import annotations

__all__ = [
    "Executor",
    "LocalExecutor",
    "SlurmExecutor",
    "executor_for",
    "ExecutionResult",
    "ExecutionInterrupted",
    "build_argv",
    "OPTIONS_WITH_VALUE",
    "SAMPLED_STEPS",
    "parse_receipts",
    "changed_sources",
    "pre_images",
    "apply_to",
]

_LAZY = {
    "Executor": "infrarsi.runner._executor",
    "LocalExecutor": "infrarsi.runner._executor",
    "SlurmExecutor": "infrarsi.runner._slurm",
    "executor_for": "infrarsi.runner._select",
    "ExecutionResult": "infrarsi.runner._executor",
    "build_argv": "infrarsi.runner._executor",
    "OPTIONS_WITH_VALUE": "infrarsi.runner._executor",
    "SAMPLED_STEPS": "infrarsi.runner._executor",
    "ExecutionInterrupted": "infrarsi.errors",
    "parse_receipts": "infrarsi.runner._receipts",
    "changed_sources": "infrarsi.runner._sources",
    "pre_images": "infrarsi.runner._sources",
    "apply_to": "infrarsi.runner._sources",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'infrarsi.runner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
