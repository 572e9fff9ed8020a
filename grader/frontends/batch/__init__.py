"""`python -m grader batch`: grading a class for credit, each puzzle of each submission in a jail of its own.

    parent.py   the batch itself: the workers, each submission's puzzles, the rows (run_batch)
    submissions.py  what SUBMISSIONS holds, one Submission per learner (../handed_in.py), and its private copy
    verdict.py  the parent's verdict from a puzzle's record: checked, the reference computed here, never pickled
    zygote.py   a worker: torch imported once; a warden forked per puzzle keeps its time and its processes
    runner.py   the puzzle's own process in the jail: runs one puzzle, writes what it observed (record.py)
    sandbox.py  the operating system's isolation: namespaces, pivot_root, an unprivileged uid, rlimits
    reaper.py   killing everything a puzzle started; wire.py, the messages between the parent and a worker
    record.py   what a puzzle's process sends back: JSON and raw tensor bytes, each checked (no pickle)

A submission flows: its copy -> a worker forks a warden -> the warden forks the jailed puzzle -> the puzzle's
record comes back on a pipe -> verdict.py grades it in the parent -> a row -> the reports (../reports/).
The threat model (what each part guarantees, and the tests that attack it) is in docs/grading.md, "Grading for credit".
"""

from .parent import run_batch, summary
from .submissions import private_copy, submissions_in

__all__ = ["run_batch", "private_copy", "submissions_in", "summary"]
