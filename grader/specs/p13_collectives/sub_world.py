"""A world of its own made of some of the ranks: the `dist` p13's functions are handed, so that the same function
runs as a 4-rank all-reduce on ranks 0-3 and on ranks 4-7 at once, and as an 8-rank one on all of them.

Inside the view a rank is numbered within its world (rank 4 of the world [4, 5, 6, 7] is rank 0 and sends to its
rank 1 as `dist.send(t, 1)`), as inside a real world of that size:

    view call                               what runs (on the simulator's dist, or on torch.distributed)
    get_rank(), get_world_size()            the rank's place in `ranks`, len(ranks)
    send / recv / isend / irecv (peer p)    the same call to the global rank ranks[p] (recv returns a view rank)
    P2POp(op, t, p), batch_isend_irecv      the same, each op's peer made global
    all_reduce, all_gather, ..., barrier    the collective on `group` (the world's own process group), a root
                                            (broadcast's src) made global: a collective is graded, not refused
    ReduceOp, is_initialized, get_backend   as they are

Anything else (new_group, groups of its own) raises AttributeError naming what the view offers. The handle keeps
the real `dist` in a closure, not in an attribute, so that the learner's code cannot reach past the view by name
(p10's gathered_weights.py watch does the same). Works on torch.distributed too: it only calls the handle.
"""

from __future__ import annotations

P2P = ("send", "recv", "isend", "irecv")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
               "all_to_all", "barrier")
PASSED_THROUGH = ("ReduceOp", "is_initialized", "is_available", "get_backend")
OFFERED = ("get_rank", "get_world_size", *P2P, "P2POp", "batch_isend_irecv", *COLLECTIVES, "broadcast",
           *PASSED_THROUGH)


def sub_world(dist, ranks, group=None):
    """The `dist` a rank of `ranks` (global ranks, in order) is handed: a world of len(ranks) ranks. `group` is
    the process group of `ranks` for collectives (None when `ranks` is the whole world)."""
    ranks = tuple(ranks)
    size = len(ranks)

    def own(group_arg, what):
        if group_arg is not None:
            raise ValueError(f"{what}(group=...): this puzzle's dist is a world of {size} ranks with no groups of "
                             f"its own; leave group out")

    def global_rank(peer, what):
        if not isinstance(peer, int) or not 0 <= peer < size:
            shown = (f"a tensor {str(peer.dtype).replace('torch.', '')}{list(peer.shape)}"
                     if hasattr(peer, "dtype") and hasattr(peer, "shape") else repr(peer))
            raise ValueError(f"{what}: the peer, {shown}, is not a rank of this world of {size} ranks "
                             f"(0..{size - 1})")
        return ranks[peer]

    def local_rank(source):
        return ranks.index(source) if source in ranks else source

    def point_to_point(name):
        call = getattr(dist, name)
        peer_key = "dst" if "send" in name else "src"

        def run(tensor, peer=None, group=None, tag=0, **kwargs):
            own(group, name)
            peer = kwargs.pop(peer_key, kwargs.pop(f"group_{peer_key}", peer))
            if kwargs:
                raise TypeError(f"{name}() got unexpected keyword arguments {sorted(kwargs)}")
            if peer is None and name in ("recv", "irecv"):  # from any rank (a handle's source_rank() stays global)
                out = call(tensor, tag=tag)
                return local_rank(out) if name == "recv" else out
            out = call(tensor, global_rank(peer, name), tag=tag)
            return local_rank(out) if name == "recv" else out

        run.__name__ = name
        return run

    def collective(name):
        call = getattr(dist, name)

        def run(*args, group=None, **kwargs):
            own(group, name)
            return call(*args, group=group_arg, **kwargs)

        run.__name__ = name
        return run

    group_arg = group

    class World:
        """A world of `len(ranks)` ranks (see this module's docstring)."""

        __slots__ = ()

        def get_rank(self, group=None):
            own(group, "get_rank")
            return ranks.index(dist.get_rank())

        def get_world_size(self, group=None):
            own(group, "get_world_size")
            return size

        def P2POp(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
            own(group, "P2POp")
            kind = getattr(op, "__name__", "")
            if kind not in ("isend", "irecv"):
                raise ValueError(f"P2POp's op must be dist.isend or dist.irecv, got {op!r}")
            peer = peer if group_peer is None else group_peer
            return dist.P2POp(getattr(dist, kind), tensor, global_rank(peer, "P2POp"), tag=tag)

        def batch_isend_irecv(self, p2p_op_list):
            return dist.batch_isend_irecv(p2p_op_list)

        def broadcast(self, tensor, src=None, group=None, async_op=False, group_src=None):
            own(group, "broadcast")
            src = src if group_src is None else group_src
            return dist.broadcast(tensor, global_rank(src, "broadcast"), group=group_arg, async_op=async_op)

        def __getattr__(self, name):
            if name in PASSED_THROUGH:
                return getattr(dist, name)
            raise AttributeError(f"this puzzle's dist (a world of {size} ranks) has no {name!r}; it offers "
                                 f"{', '.join(OFFERED)}")

        def __repr__(self):
            return f"<dist: a world of {size} ranks>"

    for name in P2P:
        setattr(World, name, staticmethod(point_to_point(name)))
    for name in COLLECTIVES:
        setattr(World, name, staticmethod(collective(name)))
    return World()
