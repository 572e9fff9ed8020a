"""p12 expert parallelism: a top-1 mixture of experts on 4 ranks, tokens exchanged with all-to-all.

    spec.py     SPEC: budgets and checks
    routing.py  the sizes, the routing built into every seed, the serial mixture of experts, the mistakes replayed
"""

from .spec import SPEC

__all__ = ["SPEC"]
