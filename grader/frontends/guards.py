"""What a learner's code must not do to the grading process, and the messages for a few slips every learner makes.

    no_exit()               while the learner's code runs in this process, os._exit raises instead of ending the
                            process (it would end it with no word, and exit status 0 reads as "all passed")
    exit_result(...)        sys.exit() or `raise SystemExit` in a puzzle: an error of that puzzle
    syntax_error(...)       a puzzle file that does not parse: the message with the line and a caret, instead of
                            the import machinery's frames
    advise(result)          a hint appended to an error a learner can fix in one move (torch.distributed called
                            instead of the `dist` the function receives)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import traceback
from pathlib import Path

from ..backends.learner_code import describe_exception
from ..core.result import ERROR, PuzzleResult


class ExitCalled(Exception):
    """The learner's code called os._exit() while being graded in-process."""


@contextlib.contextmanager
def no_exit():
    """os._exit raises ExitCalled for as long as the learner's code runs here (restored afterwards)."""
    real = os._exit

    def refuse(status=0):
        raise ExitCalled(f"os._exit({status}) was called: a puzzle's code must return, not end the process (the "
                         f"grader stopped it, so that it ends only this puzzle)")

    os._exit = refuse
    try:
        yield
    finally:
        os._exit = real


def exit_result(spec, exc: SystemExit, learner_file=None) -> PuzzleResult:
    what = describe_exception(exc, learner_file)
    return PuzzleResult(spec.id, spec.name, spec.title, ERROR,
                        error=f"{what}\nyour code called sys.exit() (or raised SystemExit): a puzzle's functions must "
                              f"return, not exit; this counts as an error of {spec.id} only")


def syntax_error(spec, path: Path) -> PuzzleResult | None:
    """The error result for a puzzle file that does not compile, or None when it does (or is missing)."""
    try:
        source = path.read_bytes()
    except OSError:
        return None
    try:
        compile(source, str(path), "exec", dont_inherit=True)
        return None
    except (SyntaxError, ValueError) as exc:
        if not isinstance(exc, SyntaxError):  # null bytes
            text = f"{type(exc).__name__}: {exc}\n  in {path.name}"
        else:
            lines = traceback.format_exception_only(type(exc), exc)
            shown = [line.rstrip("\n") for line in lines[1:-1]]  # the source line and its caret
            text = "\n".join([lines[-1].strip(), f"  at {path.name}:{exc.lineno}", *shown])
    return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=f"{path.name} could not be imported: {text}")


_NO_GROUP = "Default process group has not been initialized"
_USE_DIST = ("hint: use the `dist` your function receives (its first argument), not torch.distributed: the ranks "
             "here are simulated, and torch.distributed has no process group in this process")


def advise(result: PuzzleResult) -> PuzzleResult:
    if result.status == ERROR and _NO_GROUP in result.error and _USE_DIST not in result.error:
        return dataclasses.replace(result, error=f"{result.error}\n{_USE_DIST}")
    return result
