"""p15 context parallelism: causal attention on 4 ranks, ring attention with the online softmax.

    spec.py             SPEC: budgets and the value checks
    serial.py           the sizes, the inputs made chunk by chunk, the serial causal attention, the mistakes replayed
    costs.py            one rank's share of the attention, in FLOPs and on the clock
    checks.py           compute, balance, bytes per phase and to whom (round the ring), exposed messages, and the
                        wrong values named
    memory.py           the memory rules: blocks held at each message, what the forward keeps, the peak
    received_blocks.py  the watch that notes, at each message, the other ranks' data alive

Shared: common/costs.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
