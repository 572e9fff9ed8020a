"""p18 recovery: a sharded checkpoint, a failure, an exact resume, resharding from 4 ranks to 2.

    spec.py      SPEC: the job's comparisons, the byte budgets and the checks
    training.py  the training run: the state a checkpoint must hold, one step of the job
    job.py       the launches the job is made of and what each rank runs in one

Builds on p9 (p9_mixed_precision/serial.py): its loss-scale constants and Adam.
"""

from .spec import SPEC

__all__ = ["SPEC"]
