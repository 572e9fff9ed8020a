"""What a ZeRO-3 rank holds at each collective call: p10's two memory rules, measured whatever the answer's style.

The learner's code sees `dist` through `GatherWatch`. Every call goes to the real handle (the simulator's or
torch.distributed); before it, the watch notes the output of each all-gather (or broadcast) it is given, and then
records, at that call:
    gathered   the bytes of the noted buffers still alive (each storage once, whatever views of it are held:
               a weak reference to the storage says whether it lives), plus the shards the rank was handed;
    beyond     the bytes the rank holds beyond what it held when the step began (the ledger: memory_now()),
               which a copy of the weights cannot hide from;
    forward    True before the first collective that carries gradients (a reduce-scatter or an all-reduce):
               the forward, and the first gather of the backward.
The same wrapper works on torch.distributed, since it only wraps the handle (p2's CollectiveWatch does the same).
"""

from __future__ import annotations

import weakref

from ..core.probe import memory_now

GATHERS = ("all_gather_into_tensor", "all_gather", "broadcast")
GRADIENT_COLLECTIVES = ("reduce_scatter_tensor", "reduce_scatter", "all_reduce", "reduce")
COMMUNICATION = {*GATHERS, *GRADIENT_COLLECTIVES, "gather", "scatter", "all_to_all", "all_to_all_single", "send",
                 "recv", "isend", "irecv", "batch_isend_irecv", "barrier"}


def _outputs(name, args, kwargs) -> list:
    """The tensors a gather writes: its first argument (a tensor, or a list of them)."""
    out = args[0] if args else kwargs.get("output_tensor", kwargs.get("tensor_list", kwargs.get("tensor")))
    items = out if isinstance(out, (list, tuple)) else [out]
    return [t for t in items if hasattr(t, "untyped_storage")]


class GatherWatch:
    """`dist` as the learner's code sees it: see the module docstring."""

    def __init__(self, dist, shards):
        self._dist = dist
        self._shard_bytes = sum(s.untyped_storage().nbytes() for s in shards)
        self._noted: dict[int, tuple] = {}  # storage key -> (weak reference to the storage, its bytes)
        self._forward = True
        self.base = memory_now()
        self.held: list[dict] = []

    def __getattr__(self, name):
        attr = getattr(self._dist, name)
        if name not in COMMUNICATION or not callable(attr):
            return attr

        def noted(*args, **kwargs):
            self._note(name, args, kwargs)
            return attr(*args, **kwargs)

        return noted

    def _note(self, name, args, kwargs) -> None:
        if name in GATHERS:
            for t in _outputs(name, args, kwargs):
                storage = t.untyped_storage()
                key = storage._cdata
                old = self._noted.get(key)
                if old is None or old[0]() is None:  # a new storage (or a dead one's address reused)
                    self._noted[key] = (weakref.ref(storage), storage.nbytes())
        if name in GRADIENT_COLLECTIVES:
            self._forward = False
        alive = sum(n for ref, n in self._noted.values() if ref() is not None)
        self.held.append({"kind": name, "gathered": self._shard_bytes + alive, "beyond": memory_now() - self.base,
                          "forward": self._forward})


def layers_held(held: list[dict], shard_bytes: int, layer_bytes: int) -> list[float]:
    """At each collective, the gathered buffers alive in layers' worth (the shards left out)."""
    return [(h["gathered"] - shard_bytes) / layer_bytes for h in held]


def describe_layers(counts: list[float]) -> str:
    return ", ".join(f"{c:.2f}".rstrip("0").rstrip(".") for c in counts)
