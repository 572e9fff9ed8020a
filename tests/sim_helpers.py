"""Helpers shared by the runtime's tests."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def site_in(path: str, marker: str) -> str:
    """How the runtime names the line of the file `path` that ends with `# marker`."""
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# {marker}"):
                return f"{os.path.basename(path)}:{lineno}: {line.strip()}"
    raise LookupError(marker)


class WrappedDist:
    """A grader-style wrapper of `dist` (as p2's GatherWatch): it forwards every call. Pass this file as one of
    sim.run's harness_files: a line of it is never the learner's site when a learner's line called it."""

    def __init__(self, dist):
        self._dist = dist

    def __getattr__(self, name):
        return getattr(self._dist, name)

    def all_gather_into_tensor(self, output, input, *args, **kwargs):
        return self._dist.all_gather_into_tensor(output, input, *args, **kwargs)


def harness_program(fn):
    """What a grader's program does around the learner's `fn`: wrap dist, then call it. Returns the rank function
    and an allocation the harness makes itself (a line of this file, marked [harness])."""
    def run(dist):
        scratch = dist.get_rank() + __import__("torch").zeros(2)  # harness-allocation
        return fn(WrappedDist(dist)), scratch

    return run
