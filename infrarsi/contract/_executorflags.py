"""The ``[executor]`` table set from the command line: ``--executor slurm --partition gpu ...``.

A flag replaces its key of the pinned contract's table for one command; the contract's file
(its text, hash and manifest) is untouched, and the table is validated exactly as a
contract's (the same schema, the same ``#SBATCH`` option check), with errors naming the flag.
Keys that decide the hardware (`HARDWARE_KEYS`) must match between a baseline and the
verify or search compared with it: `hardware_mismatch` says where they don't.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from typing import Any

from infrarsi.contract._contract import Contract, Section, _Parser
from infrarsi.contract._crosschecks import check_executor
from infrarsi.contract._launcher import check_nodes
from infrarsi.contract._schema import SECTIONS
from infrarsi.errors import UsageError

__all__ = ["FLAGS", "HARDWARE_KEYS", "with_executor_flags", "hardware_mismatch"]

# --flag -> [executor] key
FLAGS = {
    "--executor": "kind",
    "--partition": "partition",
    "--account": "account",
    "--time-limit-min": "time_limit_min",
    "--gpus-per-node": "gpus_per_node",
    "--cpus-per-task": "cpus_per_task",
    "--sbatch": "sbatch",
}
_FLAG_OF = {key: flag for flag, key in FLAGS.items()}

# What decides the hardware a run gets (the account and the time limit do not).
HARDWARE_KEYS = ("kind", "partition", "gpus_per_node", "cpus_per_task", "sbatch")


class _FlagParser(_Parser):
    def fail(self, table, key, message, index=0):
        raise UsageError(f"{_FLAG_OF.get(key, key)}: {message}")


def with_executor_flags(contract: Contract, flags: Mapping[str, Any]) -> Contract:
    """``contract`` with the ``[executor]`` keys in ``flags`` (key -> value as TOML would give
    it) replacing its own; ``contract.executor_flags`` keeps what was replaced. Raises
    UsageError naming the flag for a value the table would refuse."""
    if not flags:
        return contract
    return dataclasses.replace(contract, executor=Section(_table(contract, flags)), executor_flags=dict(flags))


def hardware_mismatch(contract: Contract, measured: Mapping[str, Any] | None) -> list[str]:
    """Where the hardware keys of ``contract``'s table as this command has it (flags applied)
    differ from the same table under the flags a baseline was measured with (``measured``):
    ``["--partition: 'a' -> 'b'"]``. A flag that repeats the contract's value is no difference."""
    then = _table(contract, measured or {})
    out = []
    for key in HARDWARE_KEYS:
        before, after = then[key], contract.executor.values[key]
        if before != after:
            out.append(f"{_FLAG_OF[key]}: {before!r} -> {after!r}")
    return out


def _table(contract: Contract, flags: Mapping[str, Any]) -> dict[str, Any]:
    """The pinned contract's ``[executor]`` table with ``flags`` over it, validated as the table is."""
    unknown = sorted(set(flags) - set(_FLAG_OF))
    if unknown:
        raise UsageError(f"unknown [executor] key(s) {', '.join(unknown)}; expected one of {', '.join(_FLAG_OF)}")
    raw = {**tomllib.loads(contract.text).get("executor", {}), **flags}
    parser = _FlagParser(contract.path, contract.text, check_files=False)
    values = parser.section("executor", raw, SECTIONS["executor"])
    check_executor(Section(values), parser.fail)
    check_nodes(contract.task, Section(values), parser.fail)
    return values
