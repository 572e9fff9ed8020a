"""What a rank is handed is a view without levers (issue 29): `dist`, its process groups, the work handles it
returns, `sim.current_ledger()`'s read-only view, sim.cuda's events and sim.DataLoader lead by no attribute to the
simulator's world, a rank's state, its clock or its memory ledger. (A rank's code that reads the simulator's own
module globals or closures to get there is the threat model's residue: docs/grading.md.)"""

import types

import pytest
import torch

from puzzles import sim
from puzzles.simulator.clock import RankClock
from puzzles.simulator.memory import Ledger, SiteFinder, StorageTracker
from puzzles.simulator.world import World, _RankState

STATE = (World, _RankState, RankClock, Ledger, StorageTracker, SiteFinder)
OPAQUE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type, torch.Tensor,
          str, bytes, int, float, bool, type(None))


def reachable_state(root, depth=6) -> list[str]:
    """The attribute paths from `root` (its __dict__, its slots, the items of containers in them) that end at the
    simulator's own state. Functions' closures and globals are not followed: that is code reading the simulator."""
    found, seen = [], set()

    def go(obj, path, left):
        if id(obj) in seen or left < 0:
            return
        seen.add(id(obj))
        if isinstance(obj, STATE):
            found.append(f"{path} ({type(obj).__name__})")
        elif isinstance(obj, dict):
            for k, v in list(obj.items()):
                go(v, f"{path}[{k!r}]", left - 1)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for i, v in enumerate(list(obj)):
                go(v, f"{path}[{i}]", left - 1)
        elif not isinstance(obj, OPAQUE):
            attrs = dict(getattr(obj, "__dict__", None) or {})
            for cls in type(obj).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if slot not in ("__weakref__", "__dict__") and hasattr(obj, slot):
                        attrs[slot] = getattr(obj, slot)
            for k, v in attrs.items():
                go(v, f"{path}.{k}", left - 1)

    go(root, "", depth)
    return found


def test_nothing_a_rank_holds_leads_to_the_simulators_state():
    def fn(dist):
        x = torch.ones(4, dtype=torch.float64)
        held = {"dist": dist, "dist.group.WORLD": dist.group.WORLD}
        work = dist.all_reduce(x, async_op=True)
        held["an all_reduce's handle in flight"] = reachable_state(work)
        work.wait()
        held["the handle waited for"] = work
        held["a group of new_group"] = dist.new_group([0, 1])
        held["sim.current_ledger()"] = sim.current_ledger()
        event = sim.cuda.Event(enable_timing=True)
        event.record()
        held["a sim.cuda.Event"] = event
        if dist.get_rank() == 0:
            send = dist.isend(x, 1)
            held["an isend's handle"] = reachable_state(send)
            send.wait()
        else:
            dist.recv(x, 0)
        loader = sim.DataLoader(sim.TensorDataset(torch.zeros(8, 2, dtype=torch.float64)), batch_size=2)
        batches = iter(loader)
        held["a DataLoader and its iterator"] = (loader, batches)
        next(batches)
        return {what: v if isinstance(v, list) else reachable_state(v) for what, v in held.items()}

    for rank, found in enumerate(sim.run(fn, 2).results):
        assert not any(found.values()), f"rank {rank}: {({k: v for k, v in found.items() if v})}"


@pytest.mark.parametrize("name", ["_me", "_world", "world", "ledger", "_" + "me"])
def test_a_private_or_unknown_name_on_dist_says_dist_holds_no_state(name):
    def fn(dist):
        with pytest.raises(AttributeError, match="holds none of the simulator's state"):
            getattr(dist, name)
        assert not hasattr(dist, "__dict__")  # (no instance dictionary to hang state on, or to read it from)

    sim.run(fn, 1)


def test_dist_still_offers_the_whole_api_with_its_signatures():
    import inspect

    from puzzles.simulator.dist import SimDist, _Dist

    offered = {n for n, m in vars(_Dist).items() if not n.startswith("_") and inspect.isfunction(m)}
    assert offered <= set(dir(SimDist))
    for name in offered:
        assert inspect.signature(getattr(SimDist, name)) == inspect.signature(getattr(_Dist, name)), name
        assert getattr(SimDist, name).__doc__ == getattr(_Dist, name).__doc__, name
