"""One Slurm allocation for a whole `verify` batch: the candidate run and every A/B pair on the
same node, back to back, so both arms of the A/B share the hardware.

The allocation is one Slurm job (submitted through submitit) whose body, `serve_on_node`, runs
each execution the driver drops in its inbox through the local runner, in order, and writes
back the result. The driver still decides every run (the sequential A/B's looks) and writes
every row; the node only runs what it is handed. The inbox is a folder of the workspace's
state (``.infrarsi/slurm/alloc-ID/``) on the shared file system: ``req-N.pkl`` in,
``res-N-K.pkl`` out (K: the node), each written whole then renamed. A ``stop`` file ends the
job, and so does an inbox left idle for ``IDLE_S`` (a driver killed mid-verify leaves no job
running on).

A job across nodes (``nnodes > 1``) holds every node for the batch: each node's server runs
every request in turn, as its node's part (runner/_nodes.py), and the driver merges the parts.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from infrarsi.contract import Candidate, Contract
from infrarsi.errors import ExecutionInterrupted, UsageError
from infrarsi.runner._executor import ExecutionResult
from infrarsi.runner._nodemerge import merge_nodes
from infrarsi.runner._slurmjob import (
    POLL_S,
    SCHEDULER_ENDED,
    job_state,
    lost_result,
    node_meeting,
    run_on_node,
    shows_up,
    slurm_parameters,
    submitit_module,
)

__all__ = ["Allocation", "serve_on_node", "IDLE_S"]

IDLE_S = 120.0


def _put(path: Path, value) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(value))
    os.replace(tmp, path)


def serve_on_node(inbox: str, idle_s: float = IDLE_S) -> int:
    """The allocation's body on each node: run ``req-1.pkl``, ``req-2.pkl``, ... in order,
    answering ``res-N-K.pkl`` (K: this node, ``SLURM_PROCID``); stop at a ``stop`` file or after
    ``idle_s`` without a request. Returns how many it ran."""
    folder = Path(inbox)
    node = int(os.environ.get("SLURM_PROCID", "0"))
    served, last = 0, time.monotonic()
    while not (folder / "stop").exists():
        request = folder / f"req-{served + 1}.pkl"
        if not request.exists():
            if time.monotonic() - last > idle_s:
                break
            time.sleep(0.05)
            continue
        args = pickle.loads(request.read_bytes())
        served += 1
        _put(folder / f"res-{served}-{node}.pkl", run_on_node(*args))
        last = time.monotonic()
    return served


class Allocation:
    """The driver's end: one Slurm job held for a batch of executions, each run in turn on it."""

    def __init__(self, folder: Path, contract: Contract) -> None:
        submitit = submitit_module()
        self.inbox = folder / f"alloc-{uuid.uuid4().hex[:12]}"
        self.inbox.mkdir(parents=True)
        self.nodes = max(1, int(contract.task.nnodes))
        self.gpus = max(1, int(contract.executor.gpus_per_node)) * self.nodes
        try:
            executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm")
            executor.update_parameters(**slurm_parameters(contract))
            self.job = executor.submit(serve_on_node, str(self.inbox), IDLE_S)
        except (subprocess.CalledProcessError, OSError, RuntimeError) as exc:
            raise UsageError(f'[executor] kind = "slurm": sbatch refused the job: {exc}') from None
        self.count = 0
        self.ended: ExecutionResult | None = None

    def run(
        self, contract: Contract, pinned: dict[str, str], candidate: Candidate, sample_all: bool
    ) -> ExecutionResult:
        if self.ended is not None:  # the allocation is gone: every later run of the batch ends the same way
            return lost_result(self.job, candidate, job_state(self.job.job_id), "its allocation ended", self.gpus, 0.0)
        self.count += 1
        answers = [self.inbox / f"res-{self.count}-{k}.pkl" for k in range(self.nodes)]
        sent = time.monotonic()  # a run lost here is charged from now, not the allocation's start
        meeting, sampled = node_meeting(self.inbox, contract, sample_all)
        _put(self.inbox / f"req-{self.count}.pkl", (contract, dict(pinned), candidate, sample_all, meeting, sampled))
        try:
            while True:
                if all(a.exists() for a in answers):
                    parts = [pickle.loads(a.read_bytes()) for a in answers]
                    for a in answers:
                        a.unlink()
                    (self.inbox / f"req-{self.count}.pkl").unlink(missing_ok=True)
                    if meeting is not None:
                        shutil.rmtree(meeting, ignore_errors=True)
                    result = parts[0] if len(parts) == 1 else merge_nodes(contract, parts, sample_all)
                    state = job_state(self.job.job_id) if result.status != "ok" else None
                    # The job serves until told to stop: ending now (COMPLETING), Slurm ended it.
                    if state is not None and (state.state in SCHEDULER_ENDED or state.state == "COMPLETING"):
                        why = f"the runner saw: {result.detail}"
                        self.ended = lost_result(self.job, candidate, state, why, self.gpus, time.monotonic() - sent)
                        return self.ended
                    return result
                state = job_state(self.job.job_id)
                if state is None or state.ended:
                    if all(shows_up(a) for a in answers):
                        continue
                    self.ended = lost_result(self.job, candidate, state, None, self.gpus, time.monotonic() - sent)
                    return self.ended
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self.cancel()
            raise ExecutionInterrupted(
                ExecutionResult(
                    candidate,
                    "crash",
                    detail=f"interrupted: infrarsi was stopped while slurm job {self.job.job_id} ran; "
                    "the job was cancelled",
                    evidence={"version": 1, "interrupted": True, "slurm": {"job_id": str(self.job.job_id)}},
                )
            ) from None

    def close(self) -> None:
        """The batch is done: the job ends at its next look at the inbox."""
        (self.inbox / "stop").touch()

    def cancel(self) -> None:
        self.close()
        subprocess.run(["scancel", str(self.job.job_id)], capture_output=True, timeout=30)
