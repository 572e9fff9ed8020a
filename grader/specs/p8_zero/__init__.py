"""p8 ZeRO (stage 2): reduce-scatter the gradients, Adam on the local 1/N shard, all-gather the weights.

    spec.py  SPEC: inputs, serial Adam, budgets, the optimizer-state rule and its checks

Shared: common/optimizer_state.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
