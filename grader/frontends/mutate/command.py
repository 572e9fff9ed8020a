"""`python -m grader mutate`: from the command line's arguments to the report and the exit status (cli.py
declares the arguments and hands them here)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..progress import Progress, duration
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
        watch = None if args.json else Watch(sys.stderr)
        try:
            runs = mutate_target(folder, args.puzzle, args.seed, entries, args.jobs, args.operator, args.memory_mb,
                                 watch)
        finally:
            if watch:
                watch.close()
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
        print(report.console(runs, str(args.target), args.seed, verbose=not args.quiet))
    return report.exit_status(runs)


class Watch:
    """What a person sees while mutants are judged: each survivor named at once (a run cut short by a time limit
    still shows it); at a terminal, a progress line per puzzle with its time left (progress.py) and a line as each
    puzzle is done; elsewhere (a log, a pipe) a dot per mutant, as before. session.py calls begin and judged."""

    def __init__(self, stream):
        self.stream = stream
        self.bar = Progress(0, "mutants judged", stream)
        self.dots = False  # a line of dots is open (off a terminal)

    def begin(self, puzzle: str, mutants: int) -> None:
        self.bar.restart(mutants, label=puzzle)

    def judged(self, outcome) -> None:
        m = outcome.mutant
        if outcome.status == SURVIVED:
            self._line(f"{m.puzzle} {m.operator}, line {m.lineno}: survived ({m.description})")
        elif not self.bar.enabled:
            print(".", end="", file=self.stream, flush=True)
            self.dots = True
        self.bar.advance()
        if self.bar.enabled and self.bar.done == self.bar.total:  # the puzzle is done: a line of the log says so
            self.bar.write(f"{self.bar.label}: {self.bar.total} mutants judged in "
                           f"{duration(self.bar.clock() - self.bar.started)}")
            self.bar.close()  # until the next puzzle's mutants are made (its reference is graded first)

    def _line(self, text: str) -> None:
        if self.dots:
            print(file=self.stream)
            self.dots = False
        self.bar.write(text)

    def close(self) -> None:
        self.bar.close()
        if self.dots:
            print(file=self.stream, flush=True)
