"""p22 the NaN: a float16 data-parallel run whose loss is nan at one step and inf at another; the learner finds the
three causes (an overflow in the forward, a poisoned sample, clipping before unscaling) and fixes each, so that the
run matches the float32 reference's loss curve. Where the poisoned sample and the spike sit comes from the seed.

    layout.py     the sizes, the data (where the poisoned sample and the spike step sit), the float32 reference
                  (with a knob that replays clipping before unscaling), the tolerances
    spec.py       SPEC: the harness (its log reads the masters at each step), the checks
    diagnoses.py  the likely causes of a failure, named only when the evidence singles one out

Builds on p9's story (float16 copies of float32 master weights, the loss computed in float32, the loss scale and
its skip-and-halve rule) but imports nothing from p9's package: its serial truth is torch.optim.Adam under a dynamic
scale in the same precisions, where p22's is SGD in float32, the run a float16 one must match.
"""

from .spec import SPEC

__all__ = ["SPEC"]
