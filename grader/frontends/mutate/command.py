"""`python -m grader mutate`: from the command line's arguments to the report and the exit status (cli.py
declares the arguments and hands them here)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..targets import resolve_target
from . import equivalents, report
from .operators import OPERATORS
from .outcome import SURVIVED
from .session import mutate_target


def run(args) -> int:
    if args.list_operators:
        for op in OPERATORS.values():
            print(f"{op.name:<20}{op.mistake}")
        return 0
    unknown = [o for o in args.operator or () if o not in OPERATORS]
    try:
        if unknown:
            raise KeyError(f"unknown operator(s) {unknown}; see --list-operators")
        folder = resolve_target(args.target)
        entries = list(equivalents.EQUIVALENTS) + (equivalents.load(Path(args.equivalents)) if args.equivalents else [])
        runs = mutate_target(folder, args.puzzle, args.seed, entries, args.jobs, args.operator, args.memory_mb,
                             None if args.json else progress)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (see runner._Stop); the children are gone
        print(f"\nerror: {exc or 'interrupted'} before the run finished (any survivor so far is named above)",
              file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json(runs, str(args.target), args.seed))
    else:
        print(file=sys.stderr)
        print(report.console(runs, str(args.target), args.seed, verbose=not args.quiet))
    return report.exit_status(runs)


def progress(outcome) -> None:
    """A dot per mutant judged, and a survivor named at once (a run cut short by a time limit still shows it)."""
    m = outcome.mutant
    if outcome.status == SURVIVED:
        print(f"\n{m.puzzle} {m.operator}, line {m.lineno}: survived ({m.description})", file=sys.stderr, flush=True)
    else:
        print(".", end="", file=sys.stderr, flush=True)
