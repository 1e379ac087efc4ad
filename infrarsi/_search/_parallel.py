"""Exploration with ``search --workers N``: N executions in flight, the models refit as each ends.

The same starts, local and global steps and partner rescue as :class:`Exploration`, but a worker
that frees up gets the next pick at once. A point in flight counts as tried, and the speed model
believes it takes what it predicted when it was sent (a "believer"): the next pick looks
elsewhere rather than at its neighbours, until its real time replaces the belief.

Only the runs happen in the worker threads. Everything else stays in this one (the checks
before a run, judging a finished run and recording it, the models, the ledger, the meta),
so the ledger is written by one thread in the order results arrive. Each worker journals its
own execution in flight (`SearchSession.worker`), so a SIGKILL leaves one entry per worker
for `--resume`. Who may run several at once is `check_workers`'s to say.
"""

from __future__ import annotations

import math
import multiprocessing
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait

from infrarsi._search._exploring import Exploration
from infrarsi._search.strategy._space import Point
from infrarsi._search.strategy._state import Observation
from infrarsi.errors import ExecutionInterrupted, UsageError

__all__ = ["ParallelExploration", "check_workers"]


def check_workers(contract, workers: int, devices: list[str] | None = None) -> list[str] | None:
    """Refuse ``workers`` executions at once where they could disturb each other's timing, and
    give each worker slot its GPUs: ``CUDA_VISIBLE_DEVICES`` per slot, or None (not assigned).

    With the local executor, several at once are allowed for a contract that says
    ``timing_sensitive = false``, or for a GPU job (``device = "cuda"``) given ``devices``
    enough for a GPU set of its own per worker (one per rank under a launcher). A Slurm
    executor runs each execution as a job of its own, on hardware Slurm gives it alone."""
    if workers < 1:
        raise UsageError(f"--workers {workers}: expected 1 or more")
    slots = _device_slots(contract, workers, devices) if devices else None
    if workers == 1 or contract.executor.kind != "local" or not contract.task.timing_sensitive:
        return slots
    if slots is not None:
        if contract.resources.device != "cuda":
            raise UsageError(
                f"--devices: the job trains on {contract.resources.device!r} ([resources] device), where separate "
                f"GPUs don't keep {workers} runs at once from timing each other"
            )
        return slots
    raise UsageError(
        f"--workers {workers}: the local executor runs every execution on this machine, where {workers} at once "
        "would time each other; give each worker its own GPUs (--devices 0,1,...), use a cluster executor "
        '([executor] kind = "slurm"), or say [task] timing_sensitive = false for a job whose step time '
        "nothing beside it can change"
    )


def _device_slots(contract, workers: int, devices: list[str]) -> list[str]:
    """``devices`` cut into one ``CUDA_VISIBLE_DEVICES`` value per worker (a rank's GPU each)."""
    if contract.executor.kind != "local":
        raise UsageError(f"--devices: the {contract.executor.kind} executor's jobs get their GPUs from the cluster")
    if len(set(devices)) != len(devices) or not all(d.strip() and "," not in d for d in devices):
        raise UsageError(f"--devices {','.join(devices)}: expected distinct GPU indexes or UUIDs, e.g. 0,1,2,3")
    each = contract.task.nproc_per_node if contract.task.launcher != "none" else 1
    if len(devices) < workers * each:
        raise UsageError(
            f"--devices {','.join(devices)}: {workers} workers of {each} GPU(s) each need {workers * each}, "
            f"got {len(devices)}"
        )
    return [",".join(devices[slot * each : (slot + 1) * each]) for slot in range(workers)]


_LOCAL = None  # a worker process's own LocalExecutor, made at its first run


def _run_local(contract, pinned, candidate, devices: str | None = None):
    """One execution in a worker process (the local executor): its own interpreter, so the
    runner's clock in one never waits for another's hashing or reading to let go of the GIL.
    ``devices``: the worker slot's ``CUDA_VISIBLE_DEVICES``."""
    global _LOCAL
    if _LOCAL is None:
        from infrarsi.runner import LocalExecutor

        _LOCAL = LocalExecutor()
    _LOCAL.devices = devices
    return _LOCAL.run(contract, pinned, candidate)


def _pool(executor, workers: int):
    """Worker processes for the local executor; threads for a cluster's (each waits on a job)."""
    from infrarsi.runner import LocalExecutor

    if isinstance(executor, LocalExecutor) and not executor.keep_sandbox:
        return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    return ThreadPoolExecutor(workers, thread_name_prefix="infrarsi-worker")


class ParallelExploration(Exploration):
    """Exploration with ``workers`` executions in flight."""

    def __init__(self, session, pack: dict | None, workers: int, devices: list[str] | None = None) -> None:
        super().__init__(session, pack)
        self.workers = workers
        self.devices = devices  # each worker slot's CUDA_VISIBLE_DEVICES (check_workers), or None
        self.queue: list[tuple] = []  # (point, origin, depth, the oom it rescues): starts and rescues first
        self.slot = 0
        self.stale = 0

    def explore(self, exploration: int) -> None:
        session = self.session
        starts = self.starts()
        self.incumbents = [p for p, _ in starts]
        self.queue = [(p, f"start:{o}", 0, None) for p, o in starts]
        session.meta["explore_stop"] = "the exploration budget was spent"
        flying: dict[Future, tuple] = {}
        free = list(range(self.workers))
        with _pool(session.ws.executor, self.workers) as pool:
            try:
                while True:
                    while free and session.launched() + len(flying) < exploration:
                        picked = self._next()
                        if picked is None:
                            break
                        sent = self._send(pool, picked[0], picked[1], free[0])
                        if sent is None:  # rejected before running: recorded, a slot still free
                            continue
                        flying[sent[0]] = (*picked, free.pop(0), sent[1])
                    if not flying:
                        break
                    done, _ = wait(flying, return_when=FIRST_COMPLETED)
                    for future in done:
                        *picked, slot, executor = flying.pop(future)
                        free.append(slot)
                        self._finished(future, tuple(picked), executor, exploration)
            except KeyboardInterrupt:
                # Stopped: what is in flight still ends (each within its timeout) and is recorded.
                for future, (*picked, _, executor) in list(flying.items()):
                    try:
                        self._finished(future, tuple(picked), executor, exploration, rescue=False)
                    except Exception:  # its worker died with the interrupt: its journal stays for --resume
                        continue
                raise
        if session.launched() < exploration:
            session.meta["explore_stop"] = (
                f"no untried point was worth a run after {self.stale} empty picks: the models predict each one left "
                "crashes, runs out of memory, does not apply, or is no faster than the best found"
            )

    # -- choosing ---------------------------------------------------------------------------

    def _next(self) -> tuple | None:
        """The next point to send: a queued start or rescue, else a model pick round the slots."""
        while self.queue:
            picked = self.queue.pop(0)
            point = picked[0]
            if point in self.state.tried() or self.state.p_ok([point])[0] == 0 or not self._applies(point):
                continue
            return picked
        limit = 3 * (len(self.incumbents) + 1)
        while self.stale < limit:
            speed, memory = self.state.speed_model(), self.state.memory_model()
            if self.slot < len(self.incumbents):
                centre = self._incumbent(self.incumbents[self.slot])
                self.incumbents[self.slot] = centre
                near = self.space.neighbours(centre)
                near += [q for p in near for q in self.space.neighbours(p)]
                choice, origin = self._pick(near, speed, memory), f"local:{self.slot}"
            else:
                choice, origin = self._pick(self.space.pool(self.rng), speed, memory), "global"
            self.slot = (self.slot + 1) % (len(self.incumbents) + 1)
            if choice is None:
                self.stale += 1
                continue
            self.stale = 0
            return choice, origin, 0, None
        return None

    # -- running ----------------------------------------------------------------------------

    def _send(self, pool: ThreadPoolExecutor, point: Point, origin: str, slot: int):
        """Start ``point`` on a worker: (its future, its journalled executor); None where a check
        before the run rejected it (recorded here, as any rejection is)."""
        from infrarsi._verify import Verification

        session = self.session
        candidate = session.candidate(point)
        baseline = {"summary": session.summary, "id": session.baseline_id}
        check = Verification(session.ws, candidate, baseline, 0, None, batch=session.batch, kind="search")
        if any(c.status in ("fail", "unchecked") for c in check.before_run()):
            self._observe(point, origin, session.verify(candidate, session.batch, 0, kind="search", seq=self._seq()))
            return None
        mean, _ = self.state.speed_model().predict([point])
        self.state.pending[point] = math.exp(float(mean[0]))
        executor = session.worker(slot, session.ws.ledger.count())
        if isinstance(pool, ProcessPoolExecutor):  # journalled here, run in the worker process
            executor.begin(candidate)
            devices = self.devices[slot] if self.devices else None
            future = pool.submit(_run_local, session.ws.contract, session.ws.manifest.files, candidate, devices)
        else:
            future = pool.submit(executor.run, session.ws.contract, session.ws.manifest.files, candidate)
        session.tick("explore", f"{origin}: sent")
        return future, executor

    def _finished(self, future, picked: tuple, executor, exploration: int, rescue: bool = True) -> None:
        """Judge and record a run a worker finished; learn from it; queue a rescue for a promising oom."""
        from infrarsi._search._resuming import _Finished

        point, origin, depth, oom = picked
        session = self.session
        self.state.pending.pop(point, None)
        try:
            result = future.result()
        except ExecutionInterrupted as stopped:  # the worker process was stopped with this one (SIGINT)
            result = stopped.result
        session.ws.executor, inner = _Finished(result), session.ws.executor
        try:
            from infrarsi._verify import Verification

            check = Verification(
                session.ws,
                session.candidate(point),
                {"summary": session.summary, "id": session.baseline_id},
                0,
                None,
                batch=session.batch,
                kind="search",
            )
            check.seq = self._seq()
            outcome = check.run()
        finally:
            session.ws.executor = inner
            executor.journal.clear()
        obs = self._observe(point, origin, outcome, oom)
        if rescue and obs.status == "oom" and depth <= 1:  # a partner that ran out of memory gets one more try
            choice = self._partner(obs, exploration)
            if choice is not None:
                self.queue.insert(0, (choice, "partner", depth + 1, obs))

    def _seq(self) -> int:
        return len(self.session.rows())

    def _observe(self, point: Point, origin: str, outcome, oom: Observation | None = None) -> Observation:
        obs = super()._observe(point, origin, outcome)
        session = self.session
        if obs.status == "ok" and oom is not None:
            added = sorted(self.space.atoms_of(point) - self.space.atoms_of(oom.point))
            self.state.rescued.append(
                {"oom_execution": oom.execution, "rescued_by": added, "execution": obs.execution, **point.describe()}
            )
            session.meta["rescued"] = self.state.rescued
            session.save()
        return obs

    def _partner(self, oom: Observation, exploration: int) -> Point | None:
        """The partner the sequential rescue would run for ``oom`` (without running it)."""
        speed, memory = self.state.speed_model(), self.state.memory_model()
        mean, std = speed.predict([oom.point])
        if mean[0] - std[0] > self.state.best_log() or self.session.launched() >= exploration:
            return None
        near = self.space.neighbours(oom.point)
        near += [q for p in near for q in self.space.neighbours(p)]
        partners = [p for p in self._fresh(near) if self._keeps(oom.point, p)]
        fits = memory.p_fit(partners) if partners else []
        keep = [p for p, f in zip(partners, fits) if f > 0.05]
        return self._pick(keep, speed, memory) if keep else None
