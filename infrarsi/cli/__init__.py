"""`infrarsi`: a thin command line over the library. Each verb parses, calls one function, reports.

Exit codes (DESIGN.md): 0 success / accepted / clean, 1 rejected / findings /
a run that did not succeed, 2 bad input. Nothing heavy is imported until a verb runs.
This package is the only part of InfraRSI that knows the command line; nothing imports it.
"""

from __future__ import annotations

import json
import sys

from infrarsi.cli._output import EXIT_OK, EXIT_REJECTED, EXIT_USAGE
from infrarsi.cli._parser import build_parser, remember_argv
from infrarsi.cli._verbs import COMMANDS

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_REJECTED", "EXIT_USAGE"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    remember_argv(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return EXIT_USAGE
    import signal

    from infrarsi.errors import USAGE_ERRORS

    def _terminated(signum, frame):  # kill, timeout, Slurm, docker stop: clean up as for ^C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminated)
    try:
        return COMMANDS[args.verb](args)
    except USAGE_ERRORS as exc:
        print(f"infrarsi {args.verb}: error: {exc}", file=sys.stderr)
        if getattr(args, "json", False):  # --json promises one object on stdout, errors included
            print(json.dumps({"error": str(exc), "exit_code": EXIT_USAGE}, sort_keys=True))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"infrarsi {args.verb}: interrupted; executions that finished before are in the ledger", file=sys.stderr)
        return 130
