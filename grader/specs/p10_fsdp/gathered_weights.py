"""What a ZeRO-3 rank holds at each collective call: p10's two memory rules, measured whatever the answer's style.

The learner's code sees `dist` through a watch (`watched()`). Every call goes to the real handle (the simulator's
or torch.distributed); before it, the watch notes the output of each all-gather (or broadcast) it is given, and
then records, at that call:
    gathered   the bytes of the noted buffers still alive (each storage once, whatever views of it are held:
               a weak reference to the storage says whether it lives), plus the shards the rank was handed;
    beyond     the bytes the rank holds beyond what it held when the step began (the ledger: memory_now()),
               which a copy of the weights cannot hide from;
    forward    True before the first collective that carries a layer's gradient (a reduce-scatter or an
               all-reduce of at least a layer's bytes: a small one cannot end the window early): the forward,
               and the first gather of the backward;
    layer      for a gather whose input is one of the shards the rank was handed (or a view of one), its index:
               the order the layers were gathered in (None for any other call).
The same wrapper works on torch.distributed, since it only wraps the handle (p2's CollectiveWatch does the same).
"""

from __future__ import annotations

import weakref

from ...core.probe import memory_now

GATHERS = ("all_gather_into_tensor", "all_gather", "broadcast")
GRADIENT_COLLECTIVES = ("reduce_scatter_tensor", "reduce_scatter", "all_reduce", "reduce")
COMMUNICATION = {*GATHERS, *GRADIENT_COLLECTIVES, "gather", "scatter", "all_to_all", "all_to_all_single", "send",
                 "recv", "isend", "irecv", "batch_isend_irecv", "barrier"}


def _outputs(name, args, kwargs) -> list:
    """The tensors a gather writes: its first argument (a tensor, or a list of them)."""
    out = args[0] if args else kwargs.get("output_tensor", kwargs.get("tensor_list", kwargs.get("tensor")))
    items = out if isinstance(out, (list, tuple)) else [out]
    return [t for t in items if hasattr(t, "untyped_storage")]


def _largest_tensor_bytes(args, kwargs) -> int:
    tensors = [t for a in [*args, *kwargs.values()] for t in (a if isinstance(a, (list, tuple)) else [a])
               if hasattr(t, "untyped_storage")]
    return max((t.numel() * t.element_size() for t in tensors), default=0)


class Records:
    """What the watch noted: `held` (one dict per collective call, as in the module docstring)."""

    def __init__(self, shards, layer_bytes: int):
        self.shard_bytes = sum(s.untyped_storage().nbytes() for s in shards)
        self.shard_keys = [s.untyped_storage()._cdata for s in shards]
        self.layer_bytes = layer_bytes
        self.noted: dict[int, tuple] = {}  # storage key -> (weak reference to the storage, its bytes)
        self.forward = True
        self.base = memory_now()
        self.held: list[dict] = []

    def note(self, name, args, kwargs) -> None:
        if name in GATHERS:
            for t in _outputs(name, args, kwargs):
                storage = t.untyped_storage()
                key = storage._cdata
                old = self.noted.get(key)
                if old is None or old[0]() is None:  # a new storage (or a dead one's address reused)
                    self.noted[key] = (weakref.ref(storage), storage.nbytes())
        if name in GRADIENT_COLLECTIVES and _largest_tensor_bytes(args, kwargs) >= self.layer_bytes:
            self.forward = False  # a layer's gradient is on its way: the backward has begun
        alive = sum(n for ref, n in self.noted.values() if ref() is not None)
        self.held.append({"kind": name, "gathered": self.shard_bytes + alive, "beyond": memory_now() - self.base,
                          "forward": self.forward, "layer": self.layer_of(name, args, kwargs)})

    def layer_of(self, name, args, kwargs) -> int | None:
        """The index of the shard a gather's input is (or views), else None."""
        if name not in ("all_gather_into_tensor", "all_gather"):
            return None
        inp = args[1] if len(args) > 1 else kwargs.get("input_tensor", kwargs.get("tensor"))
        if not hasattr(inp, "untyped_storage"):
            return None
        key = inp.untyped_storage()._cdata
        return self.shard_keys.index(key) if key in self.shard_keys else None


def watched(dist, shards, layer_bytes: int):
    """(the `dist` the learner's code is handed, the Records it fills). The handle keeps `dist` and the records in
    a closure, not in attributes, so that the learner's code cannot reach past the watch by an attribute name."""
    records = Records(shards, layer_bytes)

    class GatherWatch:
        __slots__ = ()

        def __getattr__(self, name):
            attr = getattr(dist, name)
            if name not in COMMUNICATION or not callable(attr):
                return attr

            def noted(*args, **kwargs):
                records.note(name, args, kwargs)
                return attr(*args, **kwargs)

            return noted

    return GatherWatch(), records


def layers_held(held: list[dict], shard_bytes: int, layer_bytes: int) -> list[float]:
    """At each collective, the gathered buffers alive in layers' worth (the shards left out)."""
    return [(h["gathered"] - shard_bytes) / layer_bytes for h in held]


def describe_layers(counts: list[float]) -> str:
    return ", ".join(f"{c:.2f}".rstrip("0").rstrip(".") for c in counts)
