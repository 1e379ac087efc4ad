"""One execution: sandbox copy, patches, launch, and the evidence it leaves.

The runner never writes the ledger; it hands an :class:`ExecutionResult` to the
driver, which records it. Executors sit behind :class:`Executor`, so a cluster
executor can replace :class:`LocalExecutor` with one constructor call.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from infrarsi._hashing import diff_hashes, hash_framework, hash_protected
from infrarsi.contract import Candidate, Contract, launch_settings
from infrarsi.errors import ExecutionInterrupted, PatchRejected
from infrarsi.probe import RECEIPTS_ENV, SAMPLE_ENV, STEPS_ENV
from infrarsi.runner._environment import workload_env
from infrarsi.runner._fingerprint import environment_fingerprint
from infrarsi.runner._interpreter import EnvironmentWatch
from infrarsi.runner._launch import GUARD_INTERVAL_S, LaunchSpec, launch
from infrarsi.runner._nodes import NodePlace
from infrarsi.runner._receipts import parse_receipts
from infrarsi.runner._sandbox import make_sandbox, origin_listing
from infrarsi.runner._sources import pre_images
from infrarsi.verifiers import RunEvidence, region_share, step_ranges, window_periods

__all__ = [
    "ExecutionResult",
    "Executor",
    "LocalExecutor",
    "build_argv",
    "conclude",
    "OPTIONS_WITH_VALUE",
    "SAMPLED_STEPS",
    "sampling_plan",
]


@dataclass
class ExecutionResult:
    candidate: Candidate
    status: str
    detail: str = ""
    exit_code: int | None = None
    step_time_s: float | None = None
    peak_mem_mb: float | None = None
    device_s: float = 0.0
    wall_s: float = 0.0
    stderr_tail: str = ""
    receipts: bytes = b""
    evidence: dict = field(default_factory=dict)
    sources: dict[str, bytes] = field(default_factory=dict)


# Python's options that take the next word as their value (`-c` and `-m` end the options).
OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})  # the interpreter's, before a script


# Steps of each run at which the job's probe records the dtypes operators ran in and the
# per-parameter gradient norms. Drawn by the runner for every execution, so the job can't
# count on a step going unobserved; their periods are left out of the step time (the
# observation itself costs time).
SAMPLED_STEPS = 2


class Executor(Protocol):
    def run(
        self, contract: Contract, pinned: dict[str, str], candidate: Candidate, sample_all: bool = False
    ) -> ExecutionResult: ...


def sampling_plan(total_steps: int, rng: random.Random | None = None) -> list[int]:
    """The steps to observe closely: ``SAMPLED_STEPS`` of 2..total (step 1 has no period before it)."""
    rng = rng or random.SystemRandom()
    candidates = range(2, total_steps + 1)
    return sorted(rng.sample(candidates, min(SAMPLED_STEPS, len(candidates))))


def build_argv(
    contract: Contract, candidate: Candidate, node: NodePlace | None = None
) -> tuple[list[str], dict[str, str]]:
    """The command line and knob environment for ``candidate`` (on ``node`` of a job across nodes:
    torch's static rendezvous at node 0 instead of ``--standalone``)."""
    command, env = launch_settings(contract, candidate.knobs)
    if command[0] == "torchrun" and contract.task.launcher == "torchrun":
        # torchrun under this interpreter, on this node; a rank that fails ends the job (no restarts).
        at = 3  # torchrun --nnodes=N --nproc_per_node=M, then the script (or -m MODULE)
        if contract.task.evidence == "auto":
            command[at:at] = ["-m", "infrarsi.autoprobe"]
        # -P: the workspace is not on the launcher's path (a file there named torch/ can't stand in for it).
        meeting = node.torchrun_args() if node is not None and node.count > 1 else ["--standalone"]
        command[:1] = [sys.executable, "-P", "-m", "torch.distributed.run", *meeting, "--max-restarts=0"]
        return command, env
    if command[0] == "python":
        command[0] = sys.executable
        if contract.task.evidence == "auto":
            # The interpreter's own options (python -u -W ignore train.py) stay with the
            # interpreter; the autoprobe goes right before the script.
            # Only the contract's own command is scanned: the knob flags come after the script.
            at, end = 1, len(contract.task.command)
            while at < end and command[at].startswith("-") and command[at] != "-":
                at += 2 if command[at] in OPTIONS_WITH_VALUE else 1
            command[at:at] = ["-m", "infrarsi.autoprobe"]
    return command, env


class LocalExecutor:
    """Runs executions one at a time on this machine."""

    def __init__(self, keep_sandbox: bool = False, devices: str | None = None) -> None:
        self.keep_sandbox = keep_sandbox
        self.devices = devices  # the job's CUDA_VISIBLE_DEVICES (a search worker's own GPUs); None: as given
        self._framework = hash_framework()
        self._environment = EnvironmentWatch()
        self._watch = threading.Lock()  # runs side by side (search --workers) take the environment's watch in turn

    def run(
        self,
        contract: Contract,
        pinned: dict[str, str],
        candidate: Candidate,
        sample_all: bool = False,
        node: NodePlace | None = None,
        sampled: list[int] | None = None,
    ) -> ExecutionResult:
        """Execute ``candidate``; ``pinned`` is the manifest's {path: sha256}.

        ``sample_all`` observes every step closely (the baseline's reference run), not a few.
        ``node``: this machine runs one node's ranks of a job across nodes (runner/_nodes.py);
        its result is one part, which the driver merges with the others'. ``sampled``: the
        steps to observe (every node of a job observes the same ones); None draws them here.
        """
        sources = pre_images(contract.workspace, candidate.patches)
        origin = origin_listing(contract.workspace)
        box = make_sandbox(contract.workspace)
        try:
            before = hash_protected(box.workspace, contract.protected_globs)
            try:
                for patch in candidate.patches:
                    box.apply(patch.name, patch.text)
            except PatchRejected as exc:
                return ExecutionResult(
                    candidate,
                    "rejected",
                    detail=str(exc),
                    sources=sources,
                    evidence={"version": 1, "rejected": exc.message, "fingerprint": environment_fingerprint()},
                )
            started = time.monotonic()
            try:
                return self._launch(
                    contract, pinned, candidate, box, (before, origin), sources, sample_all, node, sampled
                )
            except ExecutionInterrupted:
                raise
            except KeyboardInterrupt:
                wall = time.monotonic() - started
                raise ExecutionInterrupted(
                    ExecutionResult(
                        candidate,
                        "crash",
                        detail=f"interrupted after {wall:.1f} s: infrarsi was stopped "
                        f"(SIGINT or SIGTERM) while the workload ran; the workload was killed",
                        device_s=wall,
                        wall_s=wall,
                        sources=sources,
                        evidence={"version": 1, "interrupted": True, "fingerprint": environment_fingerprint()},
                    )
                ) from None
        finally:
            if not self.keep_sandbox:
                box.remove()

    def _launch(self, contract, pinned, candidate, box, befores, sources, sample_all, node, sampled) -> ExecutionResult:
        before, origin = befores
        argv, knob_env = build_argv(contract, candidate, node)
        part = node is not None and node.count > 1
        log_mode = contract.task.evidence == "log"
        extra = dict(knob_env)
        extra[STEPS_ENV] = str(contract.total_steps)
        if self.devices is not None:
            extra["CUDA_VISIBLE_DEVICES"] = self.devices
        if sample_all:
            sampled = list(range(1, contract.total_steps + 1))
        elif sampled is None:
            sampled = sampling_plan(contract.total_steps)
        # Under a launcher: one socket for every rank, on which the kernel says which process
        # (so which rank) wrote; the launcher's own processes are not the job's memory. On one
        # node of several: that node's ranks only.
        ranks = contract.ranks if contract.task.launcher != "none" else None
        first_rank = 0
        if part and ranks:
            ranks = contract.task.nproc_per_node
            first_rank = node.rank * ranks
        if not log_mode:
            extra[SAMPLE_ENV] = "all" if sample_all else ",".join(map(str, sampled))
            extra[RECEIPTS_ENV] = f"unix:{box.receipts_socket}" if ranks else str(box.receipts)
        env = workload_env(os.environ, home=str(box.home), extra=extra)
        limit = int(contract.resources.memory_limit_mb * 2**20)
        seen = launch(
            LaunchSpec(
                argv=argv,
                cwd=box.workspace,
                env=env,
                timeout_s=contract.task.timeout_s,
                memory_limit_bytes=limit,
                receipts_fifo=None if log_mode or ranks else box.receipts,
                receipts_socket=box.receipts_socket if ranks and not log_mode else None,
                ranks=ranks,
                first_rank=first_rank,
                stop_when=node.stop_reason if part else None,
            )
        )

        if log_mode:
            from infrarsi.runner._logevidence import receipts_from_log

            records = receipts_from_log(seen.stdout_lines, contract.log_patterns, seen.started_ns)
            lines = [json.dumps(r, separators=(",", ":")) for r in records]
            arrivals = [r["t1_ns"] for r in records]
        else:
            lines = [text for _, text in seen.receipt_lines]
            arrivals = [stamp for stamp, _ in seen.receipt_lines]
        receipts = parse_receipts(lines)

        after = hash_protected(box.workspace, contract.protected_globs)
        origin_after = origin_listing(contract.workspace)
        with self._watch:
            framework_after = hash_framework()
            environment = self._environment.after_run()
        integrity = {
            "protected_changed_before_run": diff_hashes(pinned, before),
            "protected_changed_by_run": diff_hashes(before, after),
            # The workspace the sandbox was copied from, which every later run copies.
            "workspace_changed_by_run": diff_hashes(origin, origin_after),
            "protected_after": after,
            "framework_changed": diff_hashes(self._framework, framework_after),
            "containment": seen.containment,
            # What the run left in the interpreter's import folders (files it added are removed again).
            "environment": environment,
            "environment_changed": [
                f"{p} (added, removed again)" if p in environment["removed"] else f"{p} (added)"
                for p in environment["added"]
            ]
            + [
                f"{p} (changed, removed again)" if p in environment["removed"] else f"{p} (changed)"
                for p in environment["changed"]
            ]
            + [f"{p} (deleted)" for p in environment["deleted"]],
        }
        evidence = {
            "version": 1,
            "argv": [os.path.basename(argv[0])] + argv[1:],
            **(_rank_evidence(contract.ranks, seen) if ranks else {}),
            "knob_env": knob_env,
            "evidence_kind": contract.task.evidence,
            "started_ns": seen.started_ns,
            "ended_ns": seen.ended_ns,
            "arrivals_ns": arrivals,
            "sampled_steps": [] if log_mode else sampled,
            "stdout_lines": len(seen.stdout_lines),
            "bad_receipt_lines": receipts.bad_lines,
            "receipts_ended": receipts.ended,
            "guard": {
                "interval_s": GUARD_INTERVAL_S,
                "samples": seen.guard_samples,
                "max_gap_ms": round(seen.guard_max_gap_ns / 1e6, 2),
                "limit_bytes": limit,
                "peak_rss_bytes": seen.peak_rss_bytes,
                "censored": seen.status == "oom",
            },
            "integrity": integrity,
            "fingerprint": environment_fingerprint(),
            **({"devices": self.devices} if self.devices is not None else {}),
        }
        if log_mode:
            evidence["stdout"] = [[stamp, text] for stamp, text in seen.stdout_lines[:10000]]
        if part:  # one node's share: timed and judged once the driver has every node's
            evidence["node"] = {
                "rank": node.rank,
                "count": node.count,
                "master": f"{node.master_addr}:{node.master_port}",
            }
            return ExecutionResult(
                candidate,
                seen.status,
                detail=seen.detail,
                exit_code=seen.exit_code,
                peak_mem_mb=None if seen.status == "oom" else round(seen.peak_rss_bytes / 2**20, 1),
                device_s=seen.wall_s,
                wall_s=seen.wall_s,
                stderr_tail=seen.stderr_tail,
                receipts=("\n".join(lines) + "\n").encode() if lines else b"",
                evidence=evidence,
                sources=sources,
            )
        return conclude(
            contract,
            candidate,
            status=seen.status,
            detail=seen.detail,
            exit_code=seen.exit_code,
            lines=lines,
            evidence=evidence,
            peak_rss_bytes=seen.peak_rss_bytes,
            wall_s=seen.wall_s,
            device_s=seen.wall_s,
            stderr_tail=seen.stderr_tail,
            sources=sources,
            sample_all=sample_all,
        )


def conclude(
    contract: Contract,
    candidate: Candidate,
    *,
    status: str,
    detail: str,
    exit_code: int | None,
    lines: list[str],
    evidence: dict,
    peak_rss_bytes: int,
    wall_s: float,
    device_s: float,
    stderr_tail: str,
    sources: dict[str, bytes],
    sample_all: bool,
) -> ExecutionResult:
    """The execution's result from what its launch (or every node's, merged) left: the step
    time on the runner's clock, and what the run changed said in the detail."""
    evidence["timing"] = _timing_evidence(RunEvidence.from_stored(lines, evidence), contract)
    step_time = evidence["timing"]["step_time_s"]
    if status == "ok" and step_time is None and not sample_all:  # a reference run is not timed
        detail = (
            f"finished, but the receipts hold no complete measured window "
            f"(steps {contract.timing.warmup_steps + 1}..{contract.total_steps}): " + evidence["timing"]["missing"]
        )
    integrity = evidence["integrity"]
    changed = (
        integrity["protected_changed_by_run"]
        + [f"{p} (the workspace every run copies)" for p in integrity.get("workspace_changed_by_run", [])]
        + [f"infrarsi/{p}" for p in integrity["framework_changed"]]
        + integrity["environment_changed"]
    )
    if changed:
        detail = (detail + "; " if detail else "") + "changed at run time: " + ", ".join(changed)
    return ExecutionResult(
        candidate=candidate,
        status=status,
        detail=detail,
        exit_code=exit_code,
        step_time_s=step_time if status == "ok" else None,
        # An oom gives a lower bound only ("more than the limit"), never a value.
        peak_mem_mb=None if status == "oom" else round(peak_rss_bytes / 2**20, 1),
        device_s=device_s,
        wall_s=wall_s,
        stderr_tail=stderr_tail,
        receipts=("\n".join(lines) + "\n").encode() if lines else b"",
        evidence=evidence,
        sources=sources,
    )


def _rank_evidence(ranks: int, seen) -> dict:
    """Which rank's channel each receipt line came through, and each rank's memory peak."""
    return {
        "ranks": ranks,
        "line_ranks": list(seen.receipt_ranks),
        "rank_peak_rss_bytes": {str(r): b for r, b in sorted(seen.rank_peaks_bytes.items())},
    }


def _timing_evidence(run: RunEvidence, contract: Contract) -> dict:
    """The step time on the runner's clock (the mean measured period), the periods, and the
    probe's region share beside them; ``missing`` says why there is no step time."""
    warmup, measure = contract.timing.warmup_steps, contract.timing.measure_steps
    found = window_periods(run, warmup, measure)
    if isinstance(found, str):
        arrived = sorted({s.step for s in run.steps})
        seen = f"steps that arrived: {step_ranges(arrived)}" if arrived else "no step lines arrived"
        return {
            "clock": "runner",
            "step_time_s": None,
            "periods_s": None,
            "region_share": None,
            "missing": f"{found}; {seen} (receipts count from 1; a probe loop may count from 0 or 1)",
        }
    steps, periods = found
    share = region_share(run, warmup, measure)
    return {
        "clock": "runner",
        "step_time_s": sum(periods) / len(periods),
        "steps": steps,
        "periods_s": [round(p, 9) for p in periods],
        "region_share": None if share is None else round(share, 4),
        "missing": None,
    }
