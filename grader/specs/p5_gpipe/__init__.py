"""p5 pipeline parallel (GPipe): p stages, m microbatches, all forwards then all backwards.

    spec.py  SPEC: common/pipeline.py's spec with GPipe's budgets

Shared: common/pipeline.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
