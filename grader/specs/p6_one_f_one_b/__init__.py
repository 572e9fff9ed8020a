"""p6 pipeline parallel, 1F1B: p5's checks, the 1F1B order itself, and its memory bound.

    spec.py  SPEC: common/pipeline.py's spec with the 1F1B order and memory rules

Shared: common/pipeline.py, common/pipeline_values.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
