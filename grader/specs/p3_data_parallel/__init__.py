"""p3 data parallel: one SGD step, gradients averaged across ranks by all-reduce.

    spec.py  SPEC; the sizes, the serial step, the checks (p7 reuses them)

Shared: common/costs.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
