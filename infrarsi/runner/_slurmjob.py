"""What InfraRSI needs of a Slurm job, whichever way it was submitted (one execution a job,
or an allocation for a batch): its parameters from the contract, its body on the node, its
state from the controller, and what to record when it ended without a result."""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path

from infrarsi.contract import Candidate, Contract
from infrarsi.errors import UsageError
from infrarsi.runner._executor import ExecutionResult, LocalExecutor, sampling_plan
from infrarsi.runner._nodes import RendezvousError, join_nodes, mark_failed

__all__ = [
    "submitit_module",
    "slurm_parameters",
    "job_state",
    "final_state",
    "shows_up",
    "JobState",
    "run_on_node",
    "node_meeting",
    "lost_result",
    "SCHEDULER_ENDED",
    "POLL_S",
]

POLL_S = 0.5
RESULT_PATIENCE_S = 15.0  # how long an ended job's result file may take to show on a shared file system
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
    """The controller's view of ``job_id``; None once it no longer knows the job ("Invalid job
    id"). A controller that can't be asked (scontrol fails or hangs) gives state UNKNOWN, which
    is not an end: the caller asks again rather than give up a running job."""
    try:
        done = subprocess.run(
            ["scontrol", "show", "job", "--oneliner", str(job_id)], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return JobState({})
    if done.returncode != 0 or not done.stdout.strip():
        return None if "invalid job id" in (done.stderr or "").lower() else JobState({})
    return JobState(dict(_FIELD.findall(done.stdout.splitlines()[0])))


def submitit_module():
    """``submitit``, or a clear error (exit 2) naming the extra that installs it."""
    try:
        import submitit
    except ImportError:
        raise UsageError(
            "[executor] kind = \"slurm\" needs submitit, which is not installed: pip install 'infrarsi[cluster]'"
        ) from None
    return submitit


def final_state(job_id: str, patience_s: float = 60.0) -> JobState | None:
    """The job's state once it has ended (a cancelled job is ``COMPLETING`` while its processes
    are killed, then ``CANCELLED``), or the last seen after ``patience_s``."""
    deadline = time.monotonic() + patience_s
    state = job_state(job_id)
    while state is not None and not state.ended and time.monotonic() < deadline:
        time.sleep(POLL_S)
        state = job_state(job_id)
    return state


def slurm_parameters(contract: Contract) -> dict:
    """submitit's parameters from the contract's ``[executor]`` table."""
    ex = contract.executor
    params: dict = {
        "timeout_min": int(ex.time_limit_min),
        "slurm_job_name": f"infrarsi-{contract.task.name}",
        "nodes": int(contract.task.nnodes),
        "tasks_per_node": 1,  # one runner per node: a launcher in the contract starts the node's ranks
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


def node_meeting(folder: Path, contract: Contract, sample_all: bool) -> tuple[str | None, list[int] | None]:
    """For a job across nodes: a new rendezvous folder under ``folder`` (on the shared file
    system) and the steps every node observes, drawn here; (None, None) for a job on one node."""
    if contract.task.nnodes <= 1:
        return None, None
    meeting = folder / f"meet-{uuid.uuid4().hex[:12]}"
    meeting.mkdir(parents=True)
    return str(meeting), None if sample_all else sampling_plan(contract.total_steps)


def run_on_node(
    contract,
    pinned: dict[str, str],
    candidate: Candidate,
    sample_all: bool,
    meeting: str | None = None,
    sampled: list[int] | None = None,
) -> ExecutionResult:
    """The job's body, on the node: run the candidate through the local runner under the driver's
    contract (as it handed it over: a long run's has more steps and a seed; a path, from a job
    submitted before, is loaded there). The node's name goes into the evidence and the fingerprint.

    A job across nodes (``meeting``: the execution's rendezvous folder) runs this on every node,
    as Slurm task ``SLURM_PROCID`` of ``SLURM_NTASKS``; each returns its node's part, with the
    steps to observe the driver drew for all (``sampled``)."""
    if isinstance(contract, str):
        from infrarsi.contract import load_contract

        contract = load_contract(contract)
    place = None
    if meeting is not None:
        rank, count = int(os.environ.get("SLURM_PROCID", "0")), int(os.environ.get("SLURM_NTASKS", "1"))
        try:
            if count != contract.task.nnodes:
                raise RendezvousError(
                    f"the job has {count} task(s), one a node; the contract asks nnodes = {contract.task.nnodes}"
                )
            place = join_nodes(Path(meeting), rank, count, patience_s=float(contract.task.timeout_s))
        except RendezvousError as exc:
            mark_failed(Path(meeting), rank)  # the others must not wait for this node's ranks
            return ExecutionResult(candidate, "crash", detail=str(exc), evidence={"version": 1, "node": {"rank": rank}})
    try:
        result = LocalExecutor().run(contract, pinned, candidate, sample_all=sample_all, node=place, sampled=sampled)
    except BaseException:
        if place is not None:  # the runner itself failed here: the other nodes stop too
            mark_failed(place.folder, place.rank)
        raise
    if place is not None and result.status != "ok":
        mark_failed(place.folder, place.rank)
    node = os.environ.get("SLURMD_NODENAME")
    slurm = {"job_id": os.environ.get("SLURM_JOB_ID"), "node": node}
    if result.evidence:
        fingerprint = {**result.evidence.get("fingerprint", {}), "slurm_node": node}
        result.evidence = {**result.evidence, "slurm": slurm, "fingerprint": fingerprint}
    return result


def lost_result(
    job, candidate: Candidate, state: JobState | None, why: str | None, gpus: int, run_s: float | None = None
) -> ExecutionResult:
    """The execution a job ended without (or that Slurm ended): an interrupted crash, with Slurm's
    state and the job's run time (times ``gpus``) as the device-seconds; ``run_s`` instead where
    the job ran other executions first (an allocation: the time since this one was handed over)."""
    name = state.state if state else "gone (the controller no longer knows it)"
    if run_s is None:
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


def shows_up(path: Path, patience_s: float = RESULT_PATIENCE_S) -> bool:
    """Whether ``path`` appears within ``patience_s``: a shared file system may show the node's
    result file late. Touching the folder's mode makes NFS look again (submitit does the same)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            path.parent.chmod(path.parent.stat().st_mode)
        except OSError:
            pass
        if path.exists():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
