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

import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from infrarsi.contract import Candidate, Contract
from infrarsi.errors import ExecutionInterrupted, UsageError
from infrarsi.runner._allocation import Allocation
from infrarsi.runner._executor import ExecutionResult
from infrarsi.runner._nodemerge import merge_nodes
from infrarsi.runner._slurmjob import (
    POLL_S,
    SCHEDULER_ENDED,
    final_state,
    job_state,
    lost_result,
    node_meeting,
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
        meeting, sampled = node_meeting(self.folder, contract, sample_all)
        try:
            executor = submitit.AutoExecutor(folder=self.folder / "%j", cluster="slurm")
            executor.update_parameters(**slurm_parameters(contract))
            job = executor.submit(run_on_node, contract, dict(pinned), candidate, sample_all, meeting, sampled)
        except (subprocess.CalledProcessError, OSError, RuntimeError) as exc:
            raise UsageError(f'[executor] kind = "slurm": sbatch refused the job: {exc}') from None
        if self.on_submit:
            self.on_submit(job.job_id)
        try:
            return self.collect(job, candidate, contract, sample_all)
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
        finally:
            if meeting is not None:
                shutil.rmtree(meeting, ignore_errors=True)

    def reattach(self, job_id: str, candidate: Candidate, contract: Contract) -> ExecutionResult:
        """The result of a job submitted before (by a driver since killed), waiting for it to end."""
        tasks = tuple(range(int(contract.task.nnodes)))
        job = submitit_module().SlurmJob(folder=self.folder / "%j", job_id=str(job_id), tasks=tasks)
        return self.collect(job, candidate, contract, False)

    def collect(self, job, candidate: Candidate, contract: Contract, sample_all: bool) -> ExecutionResult:
        """Wait for ``job`` (a submitit job; one task a node) to end; its result (every node's,
        merged), or what Slurm says ended it (its run time counted once a GPU of every node in
        the device-seconds)."""
        gpus = max(1, int(contract.executor.gpus_per_node)) * max(1, job.num_tasks)
        tasks = [job] if job.num_tasks == 1 else [job.task(i) for i in range(job.num_tasks)]
        while True:
            if all(t.paths.result_pickle.exists() for t in tasks):
                parts = []
                for i, task in enumerate(tasks):
                    where = f" on node {i}" if len(tasks) > 1 else ""
                    try:
                        value = task.result()  # the result file is there: no state query needed
                    except Exception as exc:  # submitit's FailedJobError: the runner on the node raised
                        why = f"the runner{where} failed: {str(exc)[-500:]}"
                        return lost_result(job, candidate, job_state(job.job_id), why, gpus)
                    if not isinstance(value, ExecutionResult):
                        why = f"the job{where} returned {type(value).__name__}, not an execution's result"
                        return lost_result(job, candidate, job_state(job.job_id), why, gpus)
                    parts.append(value)
                value = parts[0] if len(parts) == 1 else merge_nodes(contract, parts, sample_all)
                # A run that did not end ok may have been ended by Slurm: ask once the job ended.
                state = final_state(job.job_id) if value.status != "ok" else None
                if state is not None and state.state in SCHEDULER_ENDED:
                    # Slurm signalled the job's processes (scancel, preemption, its time limit)
                    # and the runner saw its workload die of it: not the candidate's doing.
                    return lost_result(job, candidate, state, f"the runner saw: {value.detail}", gpus)
                return value
            state = job_state(job.job_id)
            if state is None or state.ended:
                if all(shows_up(t.paths.result_pickle) for t in tasks):
                    continue  # the result landed between the two looks, or a shared file system was slow
                return lost_result(job, candidate, state, None, gpus)
            time.sleep(POLL_S)
