"""Verifiers: pure functions from stored evidence to a CheckResult. No I/O, no clock."""

from ._convergence import check_convergence, judge_long_run, run_losses
from ._evidence import (
    BaselineReference,
    RunEvidence,
    StepRecord,
    merged_steps,
    receipt_lines,
    step_ranges,
    steps_from_lines,
)
from ._integrity import check_containment, check_manifest, check_run_integrity
from ._judge import RULE_VERSION, UNCALIBRATED, Rules, combine_ranks, judge_run, resolve_tolerance
from ._numerics import check_trajectory, compare_param_grads
from ._precision import check_precision, observed_precisions
from ._result import FAMILIES, STATUSES, CheckResult
from ._scope import check_scope
from ._sequential import SequentialPlan, check_speedup, run_looks
from ._stats import (
    SpeedupEstimate,
    ab_order,
    baseline_drift,
    estimate_speedup,
    min_detectable_speedup,
    pairs_to_resolve,
)
from ._timing import (
    CLOCK_LATENCY_NS,
    CLOCK_SPAN_RTOL,
    check_clock,
    check_window,
    region_share,
    runner_step_time,
    window_periods,
)

__all__ = [
    "BaselineReference",
    "RunEvidence",
    "StepRecord",
    "steps_from_lines",
    "merged_steps",
    "receipt_lines",
    "step_ranges",
    "check_convergence",
    "judge_long_run",
    "run_losses",
    "check_containment",
    "check_manifest",
    "check_run_integrity",
    "RULE_VERSION",
    "Rules",
    "judge_run",
    "combine_ranks",
    "resolve_tolerance",
    "UNCALIBRATED",
    "check_precision",
    "check_trajectory",
    "compare_param_grads",
    "observed_precisions",
    "FAMILIES",
    "STATUSES",
    "CheckResult",
    "check_scope",
    "SpeedupEstimate",
    "ab_order",
    "baseline_drift",
    "check_speedup",
    "SequentialPlan",
    "run_looks",
    "estimate_speedup",
    "min_detectable_speedup",
    "pairs_to_resolve",
    "CLOCK_LATENCY_NS",
    "CLOCK_SPAN_RTOL",
    "check_clock",
    "check_window",
    "region_share",
    "runner_step_time",
    "window_periods",
]
