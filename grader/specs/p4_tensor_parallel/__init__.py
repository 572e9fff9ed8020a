"""p4 tensor parallel: the Megatron MLP, column-parallel w1 and row-parallel w2, joined by f and g.

    spec.py      SPEC: inputs, serial reference, budgets and checks
    mistakes.py  p4's sizes, and the common mistakes replayed in one serial graph to name a wrong answer

Shared: common/costs.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
