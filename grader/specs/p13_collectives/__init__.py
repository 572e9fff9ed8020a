"""p13 collectives from point-to-point: an all-reduce written with send/recv only, ring and recursive doubling.

    spec.py       SPEC: the eight runs' checks
    runs.py       the sizes, the network, the eight runs and their formulas; one run read out of the whole record
    mistakes.py   which ranks' parts a wrong chunk holds, what a run's messages were
    sub_world.py  the `dist` of a world of its own made of some of the ranks (4 of 8)

Shared: common/costs.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
