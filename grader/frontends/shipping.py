"""What ships to learners, and what stays in the instructor's repository.

Every copy a learner can read is built from the same packages: the student release (release.py), the Gradescope
bundle (reports/gradescope_bundle.py, which runs beside the learner's code) and the standalone notebook's embedded
package (notebooks/standalone.py). None of them may carry an instructor's tool or data that quotes the reference
solutions: the reviewed equivalent mutants of `grader mutate` (mutate/equivalents.py) hold lines of them (p6's
schedule, p11's layout, ...), and the tool that uses them has no use outside the instructor's checkout.
tests/test_release.py checks that no distinctive line of a solution region is in any of the three.
"""

from __future__ import annotations

from pathlib import PurePosixPath

INSTRUCTOR_ONLY = ("grader/frontends/mutate",)  # folders, relative to the repository's root


def shipped(rel) -> bool:
    """Whether the file at `rel` (relative to the repository's root) goes into what learners receive."""
    path = PurePosixPath(str(rel).replace("\\", "/"))
    if any(part.startswith(".") or part == "__pycache__" or part.endswith(".egg-info") for part in path.parts):
        return False
    if path.suffix in (".pyc", ".pyo"):
        return False
    return not any(path == PurePosixPath(folder) or PurePosixPath(folder) in path.parents
                   for folder in INSTRUCTOR_ONLY)
