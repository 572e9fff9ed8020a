"""p11 3-D parallelism: 2 data-parallel replicas x 2 pipeline stages x 2 tensor-parallel ranks on 8 ranks.

    spec.py    SPEC: budgets and checks
    layout.py  the sizes, the rank layout, the serial model cut into each rank's pieces
    groups.py  the process-group rules: which group each collective and message ran on

Shared: common/costs.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
