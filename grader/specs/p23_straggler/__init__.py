"""p23 the straggler: one rank's device is slower than the others (which one comes from the seed), so every step
waits for it at the gradients' all-reduce; the learner finds it by timing the ranks at run time and gives each
rank rows in proportion to its speed.

    layout.py     the sizes, the data (each step's batch, StepBatch, which notes the rows a rank reads), which rank
                  is slow, the serial run, the budgets' terms
    spec.py       SPEC: the harness, the checks
    diagnoses.py  how long a device sat idle waiting for a partner, the rows each rank read, and the likely
                  causes of a failure

Uses the simulator's straggler (CostModel.slow_ranks, puzzles/simulator/cost.py) and its timing events
(sim.cuda.Event, puzzles/simulator/timing.py).
"""

from .spec import SPEC

__all__ = ["SPEC"]
