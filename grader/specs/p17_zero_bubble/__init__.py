"""p17 zero-bubble pipeline (ZB-H1): p6's stages, the backward split into B and W to fill the bubble.

    spec.py   SPEC: common/pipeline.py's spec with the B/W split, its order and its bubble
    costs.py  F, B and W as a learner splits the backward, and ZB-H1's bubble

Shared: common/costs.py, common/pipeline.py, common/pipeline_values.py. Builds on p6 (p6_one_f_one_b/spec.py): its
activation and workspace sizes.
"""

from .spec import SPEC

__all__ = ["SPEC"]
