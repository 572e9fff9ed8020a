"""Where the in-process tamper detector plugs into `batch` (the verdict-integrity work, issue 12).

Each puzzle's process calls `tamper_report()` once, after the learner's code has run, and carries what it returns
to the batch's parent, which puts every line in the row's flags and grades the puzzle as an error, never a pass.

STUB until that detector lands: it returns no findings. Replace the body with the detector's import, e.g.
`from ..backends.integrity import tamper_report`. (snapshot.py, the sandbox's own check that the grader's and the
simulator's code are unchanged, runs beside it whatever this returns.)
"""

from __future__ import annotations


def tamper_report() -> list[str]:
    """One line per change the learner's code made to the grader, the simulator or the run's records."""
    return []
