"""A simulated multi-rank runtime: N "GPUs" in one process, exchanging real tensors.

    result = sim.run(fn, world_size=4, args=(x, w))

runs `fn(dist, x, w)` once per rank, each rank in its own thread, with `dist` mirroring `torch.distributed`
(`get_rank`, `send`, `recv`, `all_reduce`, `all_gather`, `reduce_scatter_tensor`, `broadcast`, `barrier`, ...).
The same `fn` runs unchanged on real processes with `fn(torch.distributed, ...)`.

How it works, in four ideas:

1. **One rank runs at a time.** A baton passes between the rank threads only when a rank makes a communication
   call or returns, always to the next rank (in rank order) that can make progress. So every run interleaves the
   same way: no races, no flaky tests. Each rank keeps its own random-number state across switches.
2. **Communication is matching.** A call posts what the rank brings (a tensor to send, its part of an all-reduce)
   and blocks until its partners have posted theirs; then the data moves, by plain tensor copies. If every rank
   that has not returned is blocked, nobody can ever proceed: that is a deadlock, and the error says what each rank
   waits for and where. A blocking `send` waits for the matching `recv` (stricter than real backends, which may
   buffer small messages, so an unsafe ordering fails every time instead of sometimes).
3. **Each rank has its own memory.** Every op a rank runs is seen by a TorchDispatchMode: it records which rank
   owns each storage (an op that uses another rank's tensor raises IsolationError: data moves only by
   communication) and charges new storages to the rank's memory ledger (simulator/memory.py).
4. **Each rank has a clock** with a compute and a communication stream (simulator/clock.py). Compute costs FLOPs,
   messages cost latency + bytes/bandwidth, a collective starts when its last participant arrives, an async op
   runs on the comm stream and `wait()` joins it to the compute stream. Ticks are integers.

The simulator, file by file, in puzzles/simulator/ (read collectives.py first to learn what each collective does):

    simulator/collectives.py  what each collective does to the data, and the records the runtime matches
    simulator/types.py        the errors, ReduceOp, ProcessGroup, P2POp, Work
    simulator/dist.py         `dist`: the torch.distributed API as one rank sees it
    simulator/world.py        one run: the rank threads, the baton (idea 1), the supervisor
    simulator/matching.py     communication is matching (idea 2), and what a deadlock looks like
    simulator/mode.py         the dispatch mode that watches every op of a rank (ideas 3 and 4)
    simulator/memory.py       the memory ledger
    simulator/clock.py        the clock and the cost model
    simulator/guards.py       inside a rank tensors stay tensors (no numpy or list copies the ledger cannot see)

A call travels: your code -> `dist` (dist.py) -> the world (world.py, matching.py) -> the data moves
(collectives.py), the ledger and the clock record it (memory.py, clock.py) -> `run` returns a SimResult.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .simulator.clock import CostModel, Event
from .simulator.memory import Ledger
from .simulator.types import (CollectiveMismatchError, DeadlockError, HiddenMemoryError, InFlightError,
                              IsolationError, P2PMismatchError, P2POp, ProcessGroup, ReduceOp, SimError,
                              TimeLimitError, UnmatchedError, Work)
from .simulator.world import World, _active

__all__ = [
    "run", "current_ledger", "SimResult", "CostModel", "Event", "Ledger", "ReduceOp", "P2POp", "Work", "ProcessGroup",
    "SimError", "DeadlockError", "CollectiveMismatchError", "P2PMismatchError", "IsolationError",
    "TimeLimitError", "UnmatchedError", "InFlightError", "HiddenMemoryError",
]


# --------------------------------------------------------------------------------------------------------------
# The result of a run, and the entry point.


@dataclass
class SimResult:
    """What a run leaves behind: each rank's return value, memory ledger and events, and the makespan."""

    world_size: int
    results: list
    ledgers: list[Ledger]
    events: list[Event]
    makespan: int
    cost: CostModel
    flops: list[int]
    warnings: list[str]

    @property
    def peak_bytes(self) -> list[int]:
        return [ledger.peak for ledger in self.ledgers]

    def events_of(self, rank: int | None = None, stream: str | None = None, kind: str | None = None) -> list[Event]:
        return [e for e in self.events if (rank is None or e.rank == rank) and (stream is None or e.stream == stream)
                and (kind is None or e.kind == kind)]

    def busy_ticks(self, rank: int, stream: str = "compute") -> int:
        return sum(e.ticks for e in self.events_of(rank, stream))

    def idle_fraction(self, rank: int | None = None) -> float:
        """Share of the makespan the compute stream sat idle (one rank, or averaged over all): the bubble."""
        if self.makespan == 0:
            return 0.0
        ranks = range(self.world_size) if rank is None else [rank]
        idle = sum(self.makespan - self.busy_ticks(r) for r in ranks)
        return idle / (self.makespan * len(ranks))

    def summary(self) -> str:
        rows = [f"{'rank':>4}  {'peak bytes':>12}  {'compute ticks':>13}  {'comm ticks':>10}"]
        for r in range(self.world_size):
            rows.append(f"{r:>4}  {self.ledgers[r].peak:>12,}  {self.busy_ticks(r):>13,}  "
                        f"{self.busy_ticks(r, 'comm'):>10,}")
        rows.append(f"makespan: {self.makespan:,} ticks")
        return "\n".join(rows)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "makespan": self.makespan, "peak_bytes": self.peak_bytes,
                "flops": self.flops, "cost": dataclasses.asdict(self.cost),
                "events": [e.to_dict() for e in self.events], "ledgers": [l.to_dict() for l in self.ledgers],
                "warnings": list(self.warnings)}


def current_ledger() -> Ledger | None:
    """The memory ledger of the simulated rank calling this (None outside a rank): for a harness that wants to
    know how many bytes a rank holds at some moment, say between a forward and a backward."""
    world = getattr(_active, "world", None)
    return None if world is None else world.ledgers[world.current_rank()]


def run(fn, world_size: int, *, args=(), rank_args=None, cost: CostModel | None = None, seed: int = 0,
        timeout: float = 60.0, library_files=(), harness_files=()) -> SimResult:
    """Run `fn(dist, *args, *rank_args[rank])` on `world_size` simulated ranks and return a SimResult.

    args:      the same for every rank; each rank gets its own copy of every tensor in it (which counts on its ledger).
    rank_args: a sequence with one tuple of extra arguments per rank (say, each rank's shard of the batch).
    cost:      the CostModel of the simulated machine.
    seed:      seeds each rank's random-number generator (rank r gets its own stream).
    timeout:   seconds of wall time a rank may compute without communicating before it is stopped (an endless
               loop); the whole run may take ten times that.
    library_files: source files whose lines are not the learner's (allocations are charged to their caller).
    harness_files: source files of the code that calls the learner's (a grader): their lines are marked "[harness]".

    An exception in any rank stops the others and is re-raised here, with a note naming the rank.
    """
    if rank_args is not None and len(rank_args) != world_size:
        raise ValueError(f"rank_args needs one entry per rank: {world_size}, got {len(rank_args)}")
    world = World(world_size, cost or CostModel(), seed, timeout, library_files, harness_files)
    world.run(fn, tuple(args), rank_args)  # raises the first error of any rank
    for ledger in world.ledgers:
        ledger.close()
    events = sorted((e for r in world.ranks for e in r.clock.events),
                    key=lambda e: (e.start, e.rank, e.stream, e.end))
    makespan = max([max(r.clock.compute, r.clock.comm) for r in world.ranks] + [0])
    return SimResult(world.size, [r.result for r in world.ranks], world.ledgers, events, makespan, world.cost,
                     [r.flops for r in world.ranks], world.warnings)
