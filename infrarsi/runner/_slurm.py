"""The Slurm executor: each execution is one Slurm job, submitted through ``submitit``.

The job runs InfraRSI's own runner on the node (`LocalExecutor`: sandbox, scrubbed
environment, memory guard, the runner's clock, protected-file hashes) and hands back its
`ExecutionResult` as submitit's result file. Only the driver, on the submitting machine,
writes the ledger; the signing key never goes into a job. The workspace must be on a file
system the node sees at the same path (a cluster's shared home or project space).

A job that ends without a result (``scancel``, a preemption, Slurm's own time limit, a
failed node) is an execution ``crash`` whose detail starts ``interrupted: slurm job ID
STATE``: no evidence, and not the candidate's fault, so the search does not learn it as a
crash. Its device-seconds are the job's run time by Slurm's own clock (``scontrol``), times
its GPUs where it has any.

submitit reads job states with ``sacct``, which needs Slurm's accounting database; this
executor asks ``scontrol show job`` instead (the controller keeps a finished job for
``MinJobAge``, 300 s by default), so it works on a cluster without accounting too.
"""

from __future__ import annotations

import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from infrarsi.contract import Candidate, Contract
from infrarsi.errors import ExecutionInterrupted, UsageError
from infrarsi.runner._allocation import Allocation
from infrarsi.runner._executor import ExecutionResult
from infrarsi.runner._slurmjob import (
    POLL_S,
    SCHEDULER_ENDED,
    final_state,
    job_state,
    lost_result,
    run_on_node,
    shows_up,
    slurm_parameters,
    submitit_module,
)

__all__ = ["SlurmExecutor"]


class SlurmExecutor:
    """One Slurm job per execution, through submitit; ``on_submit(job_id)`` is told each job id
    as soon as Slurm gives it (a journal keeps it, so a driver killed mid-job can find the job)."""

    def __init__(self, folder: Path, on_submit=None) -> None:
        self.folder = Path(folder)
        self.on_submit = on_submit
        self._held = None  # the Allocation a batch holds, while it holds one

    @contextmanager
    def allocation(self, contract: Contract):
        """Hold one Slurm job for the executions run inside: a `verify` batch's candidate run and
        A/B pairs all on one node (runner/_allocation.py)."""
        held = Allocation(self.folder, contract)
        self._held = held
        try:
            yield held
        finally:
            self._held = None
            held.close()

    def run(
        self, contract: Contract, pinned: dict[str, str], candidate: Candidate, sample_all: bool = False
    ) -> ExecutionResult:
        if self._held is not None:
            return self._held.run(contract, pinned, candidate, sample_all)
        submitit = submitit_module()
        try:
            executor = submitit.AutoExecutor(folder=self.folder / "%j", cluster="slurm")
            executor.update_parameters(**slurm_parameters(contract))
            job = executor.submit(run_on_node, contract, dict(pinned), candidate, sample_all)
        except (subprocess.CalledProcessError, OSError, RuntimeError) as exc:
            raise UsageError(f'[executor] kind = "slurm": sbatch refused the job: {exc}') from None
        if self.on_submit:
            self.on_submit(job.job_id)
        try:
            return self.collect(job, candidate, max(1, int(contract.executor.gpus_per_node)))
        except KeyboardInterrupt:
            subprocess.run(["scancel", str(job.job_id)], capture_output=True, timeout=30)
            raise ExecutionInterrupted(
                ExecutionResult(
                    candidate,
                    "crash",
                    detail=f"interrupted: infrarsi was stopped while slurm job {job.job_id} ran; the job was cancelled",
                    evidence={"version": 1, "interrupted": True, "slurm": {"job_id": str(job.job_id)}},
                )
            ) from None

    def reattach(self, job_id: str, candidate: Candidate, contract: Contract) -> ExecutionResult:
        """The result of a job submitted before (by a driver since killed), waiting for it to end."""
        job = submitit_module().SlurmJob(folder=self.folder / "%j", job_id=str(job_id))
        return self.collect(job, candidate, max(1, int(contract.executor.gpus_per_node)))

    def collect(self, job, candidate: Candidate, gpus: int = 1) -> ExecutionResult:
        """Wait for ``job`` (a submitit job) to end; its result, or what Slurm says ended it
        (its run time counted ``gpus`` times in the device-seconds)."""
        while True:
            if job.paths.result_pickle.exists():
                try:
                    value = job.result()  # the result file is there: no state query needed
                except Exception as exc:  # submitit's FailedJobError: the runner on the node raised
                    why = f"the runner on the node failed: {str(exc)[-500:]}"
                    return lost_result(job, candidate, job_state(job.job_id), why, gpus)
                if not isinstance(value, ExecutionResult):
                    why = f"the job returned {type(value).__name__}, not an execution's result"
                    return lost_result(job, candidate, job_state(job.job_id), why, gpus)
                # A run that did not end ok may have been ended by Slurm: ask once the job ended.
                state = final_state(job.job_id) if value.status != "ok" else None
                if state is not None and state.state in SCHEDULER_ENDED:
                    # Slurm signalled the job's processes (scancel, preemption, its time limit)
                    # and the runner saw its workload die of it: not the candidate's doing.
                    return lost_result(job, candidate, state, f"the runner saw: {value.detail}", gpus)
                return value
            state = job_state(job.job_id)
            if state is None or state.ended:
                if shows_up(job.paths.result_pickle):
                    continue  # the result landed between the two looks, or a shared file system was slow
                return lost_result(job, candidate, state, None, gpus)
            time.sleep(POLL_S)
