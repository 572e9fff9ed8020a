"""p14 sequence parallelism: Megatron's TP on the transformer block, norms and dropout sharded by tokens.

    spec.py      SPEC: budgets and checks
    layout.py    the sizes, the serial blocks, how the weights are cut between the ranks
    costs.py     the serial blocks' work, one rank's share, the activations' bytes
    mistakes.py  the common mistakes replayed in one serial graph to name a wrong answer

Shared: common/costs.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
