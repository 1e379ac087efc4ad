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

import os
import re
import subprocess
import time
from pathlib import Path

from infrarsi.contract import Candidate, Contract
from infrarsi.errors import ExecutionInterrupted, UsageError
from infrarsi.runner._executor import ExecutionResult, LocalExecutor

__all__ = ["SlurmExecutor", "slurm_parameters", "job_state", "JobState", "run_on_node"]

POLL_S = 0.5
# Slurm's end states; a job in one of them with no result file ended without its result.
ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "REVOKED",
    }
)
# End states that Slurm imposed rather than the job reached.
SCHEDULER_ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "DEADLINE", "NODE_FAIL", "PREEMPTED", "TIMEOUT", "REVOKED"})
_FIELD = re.compile(r"(\w+)=(\S*)")


class JobState:
    """What ``scontrol show job`` says of one job: its ``state``, ``node`` and run time."""

    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields
        self.state = fields.get("JobState", "UNKNOWN")
        self.node = fields.get("BatchHost") or fields.get("NodeList") or None
        self.run_s = _seconds(fields.get("RunTime", ""))

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def _seconds(text: str) -> float:
    """Slurm's ``[D-]HH:MM:SS`` as seconds (0 when it can't be read)."""
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or (days and not days.isdigit()):
        return 0.0
    h, m, s = (int(p) for p in parts)
    return float((int(days) if days else 0) * 86400 + h * 3600 + m * 60 + s)


def job_state(job_id: str) -> JobState | None:
    """The controller's view of ``job_id``, or None once it no longer knows the job."""
    try:
        done = subprocess.run(
            ["scontrol", "show", "job", "--oneliner", str(job_id)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return JobState(dict(_FIELD.findall(done.stdout.splitlines()[0])))


def slurm_parameters(contract: Contract) -> dict:
    """submitit's parameters from the contract's ``[executor]`` table."""
    ex = contract.executor
    params: dict = {
        "timeout_min": int(ex.time_limit_min),
        "slurm_job_name": f"infrarsi-{contract.task.name}",
        "nodes": 1,
        "tasks_per_node": 1,  # one runner per node: a launcher in the contract starts the ranks
    }
    if ex.partition:
        params["slurm_partition"] = ex.partition
    if ex.account:
        params["slurm_account"] = ex.account
    if ex.gpus_per_node:
        params["gpus_per_node"] = int(ex.gpus_per_node)
    if ex.cpus_per_task:
        params["cpus_per_task"] = int(ex.cpus_per_task)
    extra = {}
    for option in ex.sbatch:
        key, _, value = option.lstrip("-").partition("=")
        extra[key.replace("-", "_")] = value or True  # submitit writes `#SBATCH --key=value`
    if extra:
        params["slurm_additional_parameters"] = extra
    return params


def run_on_node(contract_path: str, pinned: dict[str, str], candidate: Candidate, sample_all: bool) -> ExecutionResult:
    """The job's body, on the node: load the contract where the driver did and run the candidate
    through the local runner. The node's name goes into the evidence and the fingerprint."""
    from infrarsi.contract import load_contract

    contract = load_contract(contract_path)
    result = LocalExecutor().run(contract, pinned, candidate, sample_all=sample_all)
    node = os.environ.get("SLURMD_NODENAME")
    slurm = {"job_id": os.environ.get("SLURM_JOB_ID"), "node": node}
    if result.evidence:
        fingerprint = {**result.evidence.get("fingerprint", {}), "slurm_node": node}
        result.evidence = {**result.evidence, "slurm": slurm, "fingerprint": fingerprint}
    return result


class SlurmExecutor:
    """One Slurm job per execution, through submitit; ``on_submit(job_id)`` is told each job id
    as soon as Slurm gives it (a journal keeps it, so a driver killed mid-job can find the job)."""

    def __init__(self, folder: Path, on_submit=None) -> None:
        self.folder = Path(folder)
        self.on_submit = on_submit

    def run(
        self, contract: Contract, pinned: dict[str, str], candidate: Candidate, sample_all: bool = False
    ) -> ExecutionResult:
        import submitit

        executor = submitit.AutoExecutor(folder=self.folder / "%j", cluster="slurm")
        executor.update_parameters(**slurm_parameters(contract))
        try:
            job = executor.submit(run_on_node, str(contract.path), dict(pinned), candidate, sample_all)
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
                    evidence={"version": 1, "interrupted": True, "slurm": {"job_id": job.job_id}},
                )
            ) from None

    def reattach(self, job_id: str, candidate: Candidate, contract: Contract) -> ExecutionResult:
        """The result of a job submitted before (by a driver since killed), waiting for it to end."""
        import submitit

        job = submitit.SlurmJob(folder=self.folder / "%j", job_id=str(job_id))
        return self.collect(job, candidate, max(1, int(contract.executor.gpus_per_node)))

    def collect(self, job, candidate: Candidate, gpus: int = 1) -> ExecutionResult:
        """Wait for ``job`` (a submitit job) to end; its result, or what Slurm says ended it
        (its run time counted ``gpus`` times in the device-seconds)."""
        while True:
            if job.paths.result_pickle.exists():
                outcome, value = job._get_outcome_and_result()
                if outcome == "success" and isinstance(value, ExecutionResult):
                    state = job_state(job.job_id) if value.status != "ok" else None
                    if state is not None and state.state in SCHEDULER_ENDED:
                        # Slurm signalled the job's processes (scancel, preemption, its time
                        # limit) and the runner saw its workload die of it: not the candidate's doing.
                        return self._lost(job, candidate, state, f"the runner saw: {value.detail}", gpus)
                    return value
                why = f"the runner on the node failed: {value}"
                return self._lost(job, candidate, job_state(job.job_id), why, gpus)
            state = job_state(job.job_id)
            if state is None or state.ended:
                if job.paths.result_pickle.exists():
                    continue  # the result landed between the two looks
                return self._lost(job, candidate, state, None, gpus)
            time.sleep(POLL_S)

    def _lost(self, job, candidate: Candidate, state: JobState | None, why: str | None, gpus: int) -> ExecutionResult:
        name = state.state if state else "gone (the controller no longer knows it)"
        run_s = state.run_s if state else 0.0
        detail = f"interrupted: slurm job {job.job_id} {name}" + (f": {why}" if why else "")
        stderr = ""
        try:
            stderr = (job.stderr() or "")[-2000:]
        except OSError:
            pass
        return ExecutionResult(
            candidate,
            "crash",
            detail=detail,
            device_s=run_s * gpus,
            wall_s=run_s,
            stderr_tail=stderr,
            evidence={
                "version": 1,
                "interrupted": True,
                "slurm": {"job_id": str(job.job_id), "state": name, "node": state.node if state else None},
            },
        )
