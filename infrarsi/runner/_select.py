"""Which executor a contract asks for: ``[executor] kind``."""

from __future__ import annotations

from infrarsi.contract import Contract
from infrarsi.runner._executor import Executor, LocalExecutor

__all__ = ["executor_for"]


def executor_for(contract: Contract) -> Executor:
    """`LocalExecutor` for ``kind = "local"``; a `SlurmExecutor` keeping submitit's job folders
    under the contract's state folder (``slurm/JOBID/``) for ``kind = "slurm"``."""
    if contract.executor.kind == "slurm":
        from infrarsi.runner._slurm import SlurmExecutor

        return SlurmExecutor(contract.state_dir / "slurm")
    return LocalExecutor()
