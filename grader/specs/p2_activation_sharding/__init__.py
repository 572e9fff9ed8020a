"""p2 activation sharding: p1's checkpoints split by rows across N ranks, gathered before each recompute.

    spec.py  SPEC, a subclass of p1's; the watch at each collective, the gathered-in-time rule

Builds on p1 (p1_checkpointing/spec.py): its sizes, serial truth, value checks and launch.
"""

from .spec import SPEC

__all__ = ["SPEC"]
