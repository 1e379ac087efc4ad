"""The command line's grammar: every verb, its options and their help; argparse's own errors exit 2."""

from __future__ import annotations

import argparse
import json
import sys

from infrarsi import __version__
from infrarsi.cli._output import EXIT_USAGE

__all__ = ["build_parser", "remember_argv"]


def remember_argv(argv: list[str]) -> None:
    """What ``main`` was given, so argparse's own errors can answer --json too."""
    _Parser.argv = list(argv)


class _Parser(argparse.ArgumentParser):
    argv: list[str] = []  # what main() was given, for --json on argparse's own errors

    def error(self, message: str) -> None:  # argparse's own errors exit 2 too, without a traceback
        if "--json" in _Parser.argv:
            print(json.dumps({"error": message, "exit_code": EXIT_USAGE}, sort_keys=True))
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"infrarsi: error: {message}\n")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--contract",
        default="infrarsi.toml",
        help="the task contract (default: ./infrarsi.toml); its folder is the workspace",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _executor(parser: argparse.ArgumentParser) -> None:
    """The [executor] table's keys as flags (`infrarsi.contract.EXECUTOR_FLAGS`), each into
    ``executor_<key>``: each replaces the contract's for this command."""
    group = parser.add_argument_group(
        "executor", "replace keys of the contract's [executor] table for this command (docs/cluster.md)"
    )
    group.add_argument("--executor", dest="executor_kind", choices=["local", "slurm"], help="[executor] kind")
    group.add_argument("--partition", dest="executor_partition", help="[executor] partition (#SBATCH --partition)")
    group.add_argument("--account", dest="executor_account", help="[executor] account (#SBATCH --account)")
    group.add_argument(
        "--time-limit-min", dest="executor_time_limit_min", type=int, metavar="MIN", help="[executor] time_limit_min"
    )
    group.add_argument(
        "--gpus-per-node", dest="executor_gpus_per_node", type=int, metavar="N", help="[executor] gpus_per_node"
    )
    group.add_argument(
        "--cpus-per-task", dest="executor_cpus_per_task", type=int, metavar="N", help="[executor] cpus_per_task"
    )
    group.add_argument(
        "--sbatch",
        dest="executor_sbatch",
        action="append",
        metavar="--KEY=VALUE",
        help="more #SBATCH options, replacing the contract's list (repeat it; write --sbatch=--qos=high)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="infrarsi",
        description="Make training jobs faster without cheating: "
        "every promoted speedup comes with a full, signed receipt.",
    )
    parser.add_argument("--version", action="version", version=f"infrarsi {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    p = verbs.add_parser(
        "draft",
        help="write a commented infrarsi.toml for a script: `infrarsi draft -- python train.py ARGS...`",
    )
    p.add_argument("--out", default="infrarsi.toml", help="where to write it (default: beside the script)")
    p.add_argument("--force", action="store_true", help="overwrite an existing contract")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")

    p = verbs.add_parser("init", help="validate the contract, pin protected files, create key and ledger")
    _common(p)
    p.add_argument("--force", action="store_true", help="start a new ledger; the old state is archived")
    p.add_argument(
        "--update",
        action="store_true",
        help="pin a changed contract as the next revision: same ledger and key, the baseline kept where it can be",
    )

    p = verbs.add_parser("baseline", help="measure the original setup N times")
    _common(p)
    _executor(p)
    p.add_argument("--runs", type=int, default=5, help="number of runs (default 5)")
    p.add_argument(
        "--force",
        action="store_true",
        help="store the baseline even when its self-check finds problems (marked; candidates will fail)",
    )
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="then run it under perturbations that must not change the job (threads, deterministic kernels; "
        'seeds with [numerics.convergence]) and propose tolerances from its own noise (use them: "calibrated")',
    )

    p = verbs.add_parser("run", help="one execution with knob settings and patches")
    _common(p)
    _executor(p)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--patch", dest="patches", action="append", default=[], metavar="NAME|FILE")

    p = verbs.add_parser("verify", help="full check of one candidate: scope, integrity, numerics, timing, A/B")
    _common(p)
    _executor(p)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--patch", dest="patches", action="append", default=[], metavar="NAME|FILE")
    p.add_argument(
        "--pairs", type=int, default=None, help="A/B pairs before the first look (default: the contract's ab_pairs)"
    )
    p.add_argument(
        "--max-pairs",
        type=int,
        default=None,
        help="the most A/B pairs while undecided, one look after each (default: the contract's ab_max_pairs)",
    )
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="run the candidate even after a check before the run failed, to see every layer's verdict",
    )

    p = verbs.add_parser("search", help="guarded search over knobs x patches; promotes only candidates with receipts")
    _common(p)
    _executor(p)
    p.add_argument(
        "--budget",
        type=int,
        default=None,
        help="executions the search may launch, promotion reruns included (default: the contract's)",
    )
    p.add_argument("--resume", action="store_true", help="continue the last unfinished search from the ledger")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="explorations in flight at once (default 1): with the slurm executor, or a contract whose "
        "[task] timing_sensitive = false; promotions still run one at a time",
    )
    p.add_argument(
        "--devices",
        type=lambda text: text.split(","),
        default=None,
        metavar="0,1,...",
        help="GPUs for the local executor's workers: each gets its own CUDA_VISIBLE_DEVICES (a GPU per rank), "
        "which lets a GPU job run --workers at once",
    )
    p.add_argument("--pack", default=None, metavar="PACK.json", help="an experience pack to use as priors")
    p.add_argument("--seed", type=int, default=None, help="seed of the random starts (default: the contract's)")

    p = verbs.add_parser("pack", help="experience packs: `infrarsi pack export [--out PACK.json]`")
    p.add_argument("action", choices=["export"])
    _common(p)
    p.add_argument("--out", default=None, metavar="PACK.json", help="where to write it (default: .infrarsi/pack.json)")

    p = verbs.add_parser("receipt", help="check a receipt: `infrarsi receipt verify R.json`")
    p.add_argument("action", choices=["verify"])
    p.add_argument("path", metavar="RECEIPT.json")
    p.add_argument(
        "--key",
        default=None,
        metavar="HEX",
        help="the public key to trust (default: the one the manifest beside the receipts folder pins)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    p = verbs.add_parser("lint", help="audit a training script's source (against its baseline with --against)")
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "--against",
        default=None,
        metavar="BASE",
        help="the baseline FILE patches: report only what it adds, and check the timing boundary",
    )
    p.add_argument(
        "--contract",
        default=None,
        help="contract for allowed precisions and protected paths (default: ./infrarsi.toml if any)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    p = verbs.add_parser(
        "audit", help="re-verify every stored execution with today's rules: `infrarsi audit LEDGER.db`"
    )
    p.add_argument("ledger", metavar="LEDGER.db")
    p.add_argument("--contract", default=None, help="judge by this (newer) contract instead of the stored ones")
    p.add_argument(
        "--key",
        default=None,
        metavar="HEX",
        help="the public key to trust (default: the one the manifest beside the ledger pins)",
    )
    p.add_argument(
        "--rejudge-all",
        action="store_true",
        help="re-run the source rules even where today's exact rule code stored the verdict",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    p = verbs.add_parser("report", help="Markdown + self-contained HTML report from the ledger alone")
    _common(p)
    p.add_argument(
        "--ledger",
        default=None,
        metavar="LEDGER.db",
        help="the ledger to report on (default: the contract's .infrarsi/ledger.db)",
    )
    p.add_argument("--out", default=None, metavar="DIR", help="where to write it (default: .infrarsi/report/)")

    p = verbs.add_parser("apply", help="write a verified candidate into the workspace: a git branch or a patch file")
    _common(p)
    p.add_argument(
        "receipt",
        nargs="?",
        default=None,
        metavar="RECEIPT_ID",
        help="a receipt id (or unique prefix, or a receipt .json); default: the best verified one",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--branch",
        default=None,
        metavar="NAME",
        help="a new branch with one commit (default in a git work tree: infrarsi/<receipt id>)",
    )
    where.add_argument(
        "--patch-file",
        default=None,
        metavar="FILE",
        help="write the combined patch here instead (default outside git: .infrarsi/apply/<id>.diff)",
    )

    p = verbs.add_parser("gate", help="CI: pass a speed change only with a full receipt (carried, or measured here)")
    _common(p)
    p.add_argument("--base", default=None, metavar="REF", help="the pull request's base (e.g. origin/main)")
    p.add_argument("--head", default=None, metavar="REF", help="the pull request's head (e.g. HEAD)")
    p.add_argument("--patch", default=None, metavar="FILE", help="judge this patch on top of --base (default HEAD)")
    p.add_argument(
        "--trusted-keys",
        default=None,
        metavar="FILE",
        help="public keys whose receipts pass without a rerun (default: infrarsi-trusted-keys at the base)",
    )
    p.add_argument("--rerun", action="store_true", help="measure here even when a carried receipt verifies")
    p.add_argument("--runs", type=int, default=3, help="baseline runs when measuring here (default 3)")
    p.add_argument("--pairs", type=int, default=None, help="A/B pairs when measuring here (default: the contract's)")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="launch settings to measure with (default: a carried receipt's)",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="where a receipt made here is kept (default ./infrarsi-gate)"
    )
    p.add_argument(
        "--summary",
        default=None,
        metavar="FILE",
        help="also append the Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)",
    )

    p = verbs.add_parser("demo", help="the bundled workload through every stage built so far")
    p.add_argument("--dir", default=None, help="where to copy the workload (default: ./infrarsi-demo)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser
