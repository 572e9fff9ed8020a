"""p10 ZeRO-3 / FSDP: each layer all-gathered just before it computes, let go after, gathered again in backward.

    spec.py              SPEC: inputs, serial reference, budgets and checks
    gathered_weights.py  the watch that notes, at each collective, the gathered buffers alive and the bytes held

Shared: common/costs.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
