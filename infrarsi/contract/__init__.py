"""The task contract, ``infrarsi.toml``: its schema, its parsing into typed objects, the globs
its scope uses, the reference generated from the schema, and candidates resolved against it
(knob settings and patches, and the one place knobs become a command line and environment)."""

from infrarsi.contract._candidate import (
    SEED_KNOB,
    Candidate,
    PatchRef,
    changes_from,
    launch_command,
    launch_settings,
    long_run,
    parse_sets,
    resolve_candidate,
)
from infrarsi.contract._contract import DEFAULT_CONTRACT, Contract, Knob, PatchSpec, load_contract, parse_contract
from infrarsi.contract._convergence import Convergence
from infrarsi.contract._executorflags import (
    FLAGS as EXECUTOR_FLAGS,
    HARDWARE_KEYS,
    hardware_mismatch,
    with_executor_flags,
)
from infrarsi.contract._globs import check_glob, matches, matches_any
from infrarsi.contract._launch import KnobLaunch
from infrarsi.errors import ContractError

__all__ = [
    "Contract",
    "ContractError",
    "Knob",
    "KnobLaunch",
    "PatchSpec",
    "load_contract",
    "parse_contract",
    "DEFAULT_CONTRACT",
    "Candidate",
    "PatchRef",
    "changes_from",
    "launch_command",
    "launch_settings",
    "parse_sets",
    "resolve_candidate",
    "long_run",
    "SEED_KNOB",
    "Convergence",
    "EXECUTOR_FLAGS",
    "HARDWARE_KEYS",
    "with_executor_flags",
    "hardware_mismatch",
    "check_glob",
    "matches",
    "matches_any",
]
