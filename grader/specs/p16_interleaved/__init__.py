"""p16 interleaved 1F1B: 8 one-block stages on 4 ranks, 2 chunks each, 8 microbatches.

    spec.py    SPEC: budgets and checks
    layout.py  the stages and chunks, the interleaved order, the serial step cut at every stage, the value diagnoses

Shared: common/costs.py, common/pipeline_values.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
