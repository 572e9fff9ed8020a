"""p21 the slow step: a data-parallel run twice over its time budget from host syncs, a synchronous all-reduce and
a loader that does not overlap; the learner finds them in the trace and removes them.

    layout.py     the sizes, the data, the serial run, the budget's terms
    spec.py       SPEC: the harness (the rank's rows as a sim.TensorDataset), the checks and their diagnoses

Uses the simulator's host (puzzles/simulator/host.py) and data loader (loader.py). Builds on p7 (its model sizes,
costs and overlap).
"""

from .spec import SPEC

__all__ = ["SPEC"]
