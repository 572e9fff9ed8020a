"""p1 (and p2) take torch.utils.checkpoint away while they grade: the puzzle is to write checkpointing by hand.

The public names are replaced by a refusal that explains itself, and so are the two internals that `checkpoint`
looks up when called, so that a reference bound before grading (`from torch.utils.checkpoint import checkpoint`
in a notebook cell) is refused as well. Everything is put back afterwards.
"""

from __future__ import annotations

import contextlib

import torch.utils.checkpoint as torch_checkpoint


class CheckpointingTakenAway(RuntimeError):
    pass


_TAKEN_AWAY = ("torch.utils.checkpoint is switched off while puzzle p1 is graded: the puzzle is to write "
               "activation checkpointing by hand (keep every k-th block's input in checkpointed_forward, "
               "recompute each segment with autograd on in checkpointed_backward)")


def _refuse(*args, **kwargs):
    raise CheckpointingTakenAway(_TAKEN_AWAY)


class _RefusedFunction:
    apply = staticmethod(_refuse)


@contextlib.contextmanager
def without_torch_checkpoint():
    # The public names, and the two internals that `checkpoint` looks up when called, so that a reference bound
    # before grading (`from torch.utils.checkpoint import checkpoint` in a notebook cell) is refused as well.
    names = {"checkpoint": _refuse, "checkpoint_sequential": _refuse, "CheckpointFunction": _RefusedFunction,
             "_checkpoint_without_reentrant_generator": _refuse}
    saved = {n: getattr(torch_checkpoint, n) for n in names if hasattr(torch_checkpoint, n)}
    try:
        for n in saved:
            setattr(torch_checkpoint, n, names[n])
        yield
    finally:
        for n, v in saved.items():
            setattr(torch_checkpoint, n, v)
