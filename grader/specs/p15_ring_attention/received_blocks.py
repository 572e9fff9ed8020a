"""What a rank holds of other ranks' data at each message: p15's rule "no rank holds more than two K/V blocks at
once", measured whatever the answer's style.

The learner's code sees `dist` through a watch (`watched()`). Before each communication call, the watch notes the
buffers the call fills with other ranks' data (a recv's or irecv's tensor, the receives of batch_isend_irecv, a
gather's or an all-to-all's output, an all-reduced or broadcast tensor), then records at that call:
    held     the bytes of every noted buffer still alive (each storage once, whatever views of it are kept: a weak
             reference to the storage says whether it lives), the one the call fills included;
    phase    "backward" while autograd's backward runs (the dK/dV travel then, beside the K/V), else "forward".
A copy of a received block escapes the watch; the peak memory budget does not. `dist.P2POp` hands the real
isend and irecv to torch.distributed, which refuses any other function; the watch notes the receives in
batch_isend_irecv itself. The same wrapper works on torch.distributed.
"""

from __future__ import annotations

import weakref

import torch

RECEIVES = {"recv": 0, "irecv": 0, "broadcast": 0, "all_reduce": 0, "all_gather": 0, "all_gather_into_tensor": 0,
            "all_to_all": 0, "all_to_all_single": 0, "reduce_scatter_tensor": 0, "reduce_scatter": 0,
            "scatter": 0, "gather": 1}  # the position of the buffer the call fills with other ranks' data
COMMUNICATION = {*RECEIVES, "send", "isend", "batch_isend_irecv", "barrier"}
KEYWORDS = ("tensor", "output", "output_tensor", "output_tensor_list", "tensor_list", "gather_list")


def _tensors(value) -> list:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [t for t in items if isinstance(t, torch.Tensor)]


def _filled(name, args, kwargs) -> list:
    """The tensors a call writes other ranks' data into."""
    if name == "batch_isend_irecv":
        ops = args[0] if args else kwargs.get("p2p_op_list", [])
        return [op.tensor for op in ops if getattr(op.op, "__name__", "") == "irecv"]
    at = RECEIVES.get(name)
    if at is None:
        return []
    if len(args) > at:
        return _tensors(args[at])
    return [t for key in KEYWORDS if key in kwargs for t in _tensors(kwargs[key])]


class Records:
    """What the watch noted: `held`, one {"kind", "phase", "held"} per communication call."""

    def __init__(self):
        self.noted: dict[int, tuple] = {}  # storage key -> (weak reference to the storage, its bytes)
        self.held: list[dict] = []

    def note(self, name, args, kwargs) -> None:
        for t in _filled(name, args, kwargs):
            storage = t.untyped_storage()
            key = storage._cdata
            old = self.noted.get(key)
            if old is None or old[0]() is None:  # a new storage (or a dead one's address reused)
                self.noted[key] = (weakref.ref(storage), storage.nbytes())
        phase = "backward" if torch._C._current_autograd_node() is not None else "forward"
        alive = sum(n for ref, n in self.noted.values() if ref() is not None)
        self.held.append({"kind": name, "phase": phase, "held": alive})


def watched(dist):
    """(the `dist` the learner's code is handed, the Records it fills). The handle keeps `dist` and the records in
    a closure, not in attributes, so that the learner's code cannot reach past the watch by an attribute name."""
    records = Records()
    real_ops = {}  # the watch's isend/irecv -> the real ones, for P2POp

    def p2p_op(op, tensor, *args, **kwargs):
        return dist.P2POp(real_ops.get(op, op), tensor, *args, **kwargs)

    class ReceiveWatch:
        __slots__ = ()

        def __getattr__(self, name):
            if name == "P2POp":
                return p2p_op
            attr = getattr(dist, name)
            if name not in COMMUNICATION or not callable(attr):
                return attr

            def noted(*args, **kwargs):
                records.note(name, args, kwargs)
                return attr(*args, **kwargs)

            noted.__name__ = name
            if name in ("isend", "irecv"):
                real_ops[noted] = attr
            return noted

    return ReceiveWatch(), records


def most_held(held: list[dict], phase: str) -> tuple[int, int]:
    """(the most bytes held at one call of `phase`, that call's index among all calls; -1 if none)."""
    best, at = 0, -1
    for i, h in enumerate(held):
        if h["phase"] == phase and h["held"] > best:
            best, at = h["held"], i
    return best, at
