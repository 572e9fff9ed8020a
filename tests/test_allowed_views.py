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


def test_a_work_handle_offers_the_api_and_nothing_else():
    def fn(dist):
        x = torch.ones(4, dtype=torch.float64)
        work = dist.all_reduce(x, async_op=True)
        offered = sorted(n for n in dir(work) if not n.startswith("__"))
        with pytest.raises(AttributeError, match="holds none of the simulator's state"):
            getattr(work, "_" + "queued")
        assert not hasattr(work, "__dict__")
        work.wait()
        return offered, work.is_completed(), repr(work)

    offered, done, shown = sim.run(fn, 2).results[0]
    assert offered == ["_source_rank", "is_completed", "source_rank", "wait"] and done
    assert shown.startswith("<Work all_reduce rank=0")


def test_the_ranks_thread_holds_neither_its_target_nor_its_arguments():
    """threading.current_thread() is reachable from a rank (logging holds `threading`): its target was the world's
    own method, and its arguments the rank's state."""
    import logging

    def fn(dist):
        thread = logging.threading.current_thread()
        return [n for n in ("_target", "_args", "_kwargs") if hasattr(thread, n)], thread.name

    assert sim.run(fn, 2).results == [([], "sim-rank-0"), ([], "sim-rank-1")]


def test_a_frame_logging_hands_out_is_refused_and_logging_still_works(caplog):
    import logging

    def fn(dist):
        logging.getLogger("rank").warning("rank %d says hello", dist.get_rank())  # (logging takes frames itself)
        with pytest.raises(sim.IsolationError, match=r"took sys._getframe .* logging.currentframe\(\)"):
            logging.currentframe()  # the caller's frame: it reaches the simulator's below the rank's code

    with caplog.at_level(logging.WARNING):
        sim.run(fn, 1)
    assert "rank 0 says hello" in caplog.text


def test_puzzles_sim_offers_its_api_alone():
    """puzzles.sim's own names are what it exports (__all__), and none of its modules holds one of the simulator's
    modules by name: `from puzzles.sim import calling_rank_ledger` once handed out the ledger itself."""
    from puzzles.simulator.modules import allowed_from

    plain = {"annotations", "dataclass", "dataclasses", "_torch"}  # (the module's own bookkeeping: no lever)
    extra = {n for n in vars(sim) if not n.startswith("__")} - set(sim.__all__) - plain
    assert not extra, extra
    assert all(allowed_from("puzzles.sim", n) for n in sim.__all__)
    assert not any(allowed_from("puzzles.sim", n) for n in ("calling_rank_ledger", "World", "watchdog", "guards"))
    for name in sim.__all__:
        value = getattr(sim, name)
        if isinstance(value, types.ModuleType):  # sim.cuda
            held = [n for n, v in vars(value).items() if isinstance(v, types.ModuleType)
                    and v.__name__.startswith(("puzzles.simulator", "grader"))]
            assert not held, f"sim.{name} holds {held}"


def test_every_communication_event_is_read_again_from_the_cost_model():
    """The grader re-derives each communication op's ticks and bytes from the puzzle's cost model
    (grader/backends/simulator.py): a run whose op was made cheaper on its way to the clock is refused."""
    from grader.backends.simulator import comm_problems

    def fn(dist):
        x = torch.ones(64, dtype=torch.float64)
        dist.all_reduce(x)
        if dist.get_rank() == 0:
            dist.send(x, 1)
        else:
            dist.recv(x, 0)
        dist.barrier()

    cost = sim.CostModel()
    result = sim.run(fn, 2, cost=cost)
    assert comm_problems(result.events, cost) == []
    comm = [e for e in result.events if e.stream == "comm"]
    assert {e.kind for e in comm} == {"all_reduce", "send", "recv", "barrier"}
    comm[0].end = comm[0].start  # no time at all
    assert "took 0 ticks" in comm_problems(result.events, cost)[0]
    comm[0].end, comm[1].wire_bytes = comm[0].start + 1, 0
    assert len(comm_problems(result.events, cost)) == 2
