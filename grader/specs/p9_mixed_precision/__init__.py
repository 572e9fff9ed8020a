"""p9 mixed precision: float16 forward and backward, float32 master weights and Adam, dynamic loss scaling.

    spec.py    SPEC: budgets, the skipped-step rule and the checks
    serial.py  the sizes and inputs, torch's mixed-precision step as the (forced) reference, the mistakes replayed,
               the comparison at a measured tolerance (p18 reuses its loss-scale constants)

Shared: common/optimizer_state.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
