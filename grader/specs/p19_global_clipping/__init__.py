"""p19 numerics under sharding: global gradient clipping and non-finite steps, on ZeRO-2 x TP.

    spec.py       SPEC: budgets and checks
    layout.py     the sizes, the layout, the faults, the serial truth, the mistakes replayed
    harness.py    what runs on each rank around the learner's optimizer: groups, forward, faults, steps
    diagnoses.py  the likely causes, each named only when the evidence singles it out

Shared: common/optimizer_state.py.
"""

from .spec import SPEC

__all__ = ["SPEC"]
