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
   and blocks until its partners have posted theirs; then the data moves, by plain tensor copies (every input of
   a collective is read before any output is written, as gloo does, so an output may overlap its own input). If
   every rank that has not returned is blocked, nobody can ever proceed: that is a deadlock, and the error says
   what each rank waits for, on which lines, and what it last computed. A blocking `send` waits for the matching
   `recv`, as gloo's does (measured); other backends may buffer small messages, so an unsafe ordering fails here
   every time instead of sometimes.
3. **Each rank has its own memory.** Every op a rank runs is seen by a TorchDispatchMode: it records which rank
   owns each storage (an op that uses another rank's tensor raises IsolationError: data moves only by
   communication) and charges new storages to the rank's memory ledger (simulator/memory.py).
4. **Each rank has a clock** with a compute stream and a communication queue (simulator/clock.py). Every op
   costs its roofline time, max(FLOPs / FLOP rate, bytes / memory bandwidth) plus a launch (simulator/cost.py,
   op_costs.py); messages cost latency + bytes/bandwidth; each rank's communication runs in the order it was
   issued, a collective starts when its last participant arrives, an async op runs on the communication queue
   and `wait()` joins it to the compute stream. Ticks are integers. `sim.tally()` shows what any code costs.

The simulator, file by file, in puzzles/simulator/ (read collectives.py first to learn what each collective does):

    simulator/collectives.py  what each collective does to the data, and the records the runtime matches
    simulator/types.py        the errors, ReduceOp, ProcessGroup, P2POp, Work
    simulator/dist.py         `dist`: the torch.distributed API as one rank sees it
    simulator/world.py        one run: the rank threads, the baton (idea 1), the supervisor
    simulator/matching.py     communication is matching (idea 2)
    simulator/handles.py      async ops' work handles: in flight until wait()
    simulator/deadlock.py     what a deadlock looks like
    simulator/failures.py     a rank's own error, which thread may call dist
    simulator/mode.py         the dispatch mode that watches every op of a rank (ideas 3 and 4)
    simulator/memory.py       the memory ledger
    simulator/clock.py        the clock: a compute stream and a communication queue per rank
    simulator/cost.py         the cost model: the device profile (roofline) and the network (alpha-beta)
    simulator/op_costs.py     what each op costs: its FLOPs and bytes
    simulator/tally.py        what a piece of code costs, outside a run
    simulator/allowed.py      what a rank may do: the policy (one thread, no processes; what guards.py and
                              escapes.py refuse), a list of what is allowed rather than of what was caught
    simulator/modules.py      what a puzzle's code may import: torch's public API, puzzles.model, puzzles.sim, a
                              list of standard modules, and per puzzle what its stub needs (p18: io, zlib, ...)
    simulator/guards.py       inside a rank tensors stay tensors (no numpy or list copies the ledger cannot see)
    simulator/filesystem.py   a disk every rank and every run of a job shares, and a rank that dies (checkpoints)

Part IV (debugging a run) adds, each off unless a run asks for it:

    simulator/watchdog.py        collective timeouts: NCCL's watchdog on the simulated clock
    simulator/flight_recorder.py each rank's last communication calls (torch's Flight Recorder), dumped on a hang
    simulator/fr_analysis.py     reading a dump as torch's fr_trace does: the first collective where ranks part
    simulator/host.py            the host that launches a rank's kernels ahead of the device; syncs (.item())
    simulator/loader.py          sim.DataLoader: torch's batches, loaded by the host or by workers on the clock
    simulator/timing.py          sim.cuda.Event(enable_timing=True): torch.cuda's timing events, on the rank's clock

A call travels: your code -> `dist` (dist.py) -> the world (world.py, matching.py) -> the data moves
(collectives.py), the ledger and the clock record it (memory.py, clock.py) -> `run` returns a SimResult.

What it refuses, where torch.distributed (gloo) would hang, fail or silently compute something else; each error
names the rank and the learner's line, and says what to do (simulator/types.py has them all):

    DeadlockError            every rank that has not returned waits for another
    CollectiveMismatchError  ranks meet in one collective with different ops, shapes, dtypes, roots or groups
    P2PMismatchError         a recv buffer of another shape or dtype than the message
    IsolationError           a tensor of another rank (data moves only by communication)
    InFlightError            a buffer used before its async op was waited for
    UnwaitedWorkError        a handle never waited for (gloo can lose the message)
    WorkError                a send or recv handle waited for twice, or polled forever (gloo hangs)
    NonContiguousError       a strided tensor in any collective or send/recv (gloo misreads or refuses it; NCCL refuses)
    AutogradWriteError       a gather or reduce-scatter into (or from) a tensor that requires grad (gloo refuses)
    OverlapError             an all-to-all whose output is its input (gloo overwrites rows it still sends)
    UncostedOpError          an aten op with no cost formula (op_costs.py): the clock cannot charge it honestly
    HiddenMemoryError        a tensor turned into numpy, a list or bytes, which the memory ledger cannot see
    RankThreadError          a rank started a thread or a process; dist used from another thread or after the run
    ImportRefusedError       a module outside the list of what a puzzle may import (simulator/modules.py)
    UnmatchedError           every rank returned, but a message or collective was never matched
    TimeLimitError           a rank computes too long without communicating (an endless loop)
    CollectiveTimeoutError   with a collective timeout (sim.run's, init_process_group's): a call not completed in
                             time, as NCCL's watchdog says it; a hang ends so, with the flight recorder's dump

Each error is a rank's own: the other ranks run on until they return, raise or wait for it, and the report says
whether every rank raised it. One more is no mistake: RankCrashed, a rank that died at a failure a harness injected
(simulator/filesystem.py); a dead rank's dist and disk calls raise it again. The differential corpus (tests/corpus/,
bench/CORPUS.md) holds all of this to gloo.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch as _torch  # (the run's own bookkeeping: sim.torch is no name of the API)

from .simulator.clock import Event
from .simulator import timing as cuda  # sim.cuda.Event, sim.cuda.synchronize: torch.cuda's timing
from .simulator.cost import PUZZLE_GPU, CostModel, DeviceProfile
from .simulator.filesystem import CrashPoint, Disk, DiskProfile
from .simulator.flight_recorder import FlightRecorderDump
from .simulator.host import HostProfile
from .simulator.loader import DataLoader, TensorDataset
from .simulator.op_costs import OpCost, op_cost
from .simulator.tally import Tally, tally
from .simulator.memory import Ledger, LedgerView
from .simulator.types import (AutogradWriteError, CollectiveMismatchError, CollectiveTimeoutError, DeadlockError,
                              HiddenMemoryError, ImportRefusedError, InFlightError, IsolationError, NonContiguousError, OverlapError,
                              P2PMismatchError, P2POp, ProcessGroup, RankCrashed, RankThreadError, ReduceOp, SimError,
                              TimeLimitError, UncostedOpError, UnmatchedError, UnwaitedWorkError, WorkError)
from .simulator.types import WorkHandle as Work  # (what a rank holds: the simulator's own Work stays inside)
from .simulator import host as _host, watchdog as _watchdog, world as _world  # noqa: E402  (loaded now: run and
del _host, _watchdog, _world  # current_ledger take them inside, so that sim's own names are its API alone)

__all__ = [
    "run", "current_ledger", "SimResult", "CostModel", "DeviceProfile", "PUZZLE_GPU", "OpCost", "op_cost", "Tally",
    "tally", "Event", "Ledger", "LedgerView", "ReduceOp", "P2POp", "Work", "ProcessGroup",
    "SimError", "DeadlockError", "CollectiveMismatchError", "P2PMismatchError", "IsolationError",
    "TimeLimitError", "UnmatchedError", "InFlightError", "WorkError", "UnwaitedWorkError", "NonContiguousError",
    "RankThreadError", "ImportRefusedError", "UncostedOpError", "HiddenMemoryError", "AutogradWriteError", "OverlapError",
    "Disk", "DiskProfile", "CrashPoint", "RankCrashed", "CollectiveTimeoutError", "FlightRecorderDump",
    "HostProfile", "DataLoader", "TensorDataset", "cuda",
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
    flight_recorder: FlightRecorderDump | None = None  # Part IV: each rank's last communication calls, when on

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


def current_ledger() -> LedgerView | None:
    """The memory ledger of the simulated rank calling this (None outside a rank): for a harness that wants to know
    how many bytes a rank holds at some moment, say between a forward and a backward. A read-only view of its
    figures (current, peak, peak_tick, timeline, live_by_line(), peak_by_line()), not the ledger: what a rank holds is
    a view without levers (simulator/allowed.py)."""
    from .simulator.world import calling_rank_ledger  # (inside: sim's own names are its API and nothing else)

    ledger = calling_rank_ledger()
    return None if ledger is None else LedgerView(ledger)


def run(fn, world_size: int, *, args=(), rank_args=None, cost: CostModel | None = None, seed: int = 0,
        timeout: float = 60.0, library_files=(), harness_files=(), make_fn=None, charge_imports=True,
        collective_timeout=None, trace_buffer_size: int | None = None, host: HostProfile | None = None) -> SimResult:
    """Run `fn(dist, *args, *rank_args[rank])` on `world_size` simulated ranks and return a SimResult.

    args:      the same for every rank; each rank gets its own copy of every tensor in it (which counts on its ledger).
    rank_args: a sequence with one tuple of extra arguments per rank (say, each rank's shard of the batch).
    cost:      the CostModel of the simulated machine.
    seed:      seeds each rank's random-number generator (rank r gets its own stream).
    timeout:   seconds of wall time a rank may compute without communicating before it is stopped (an endless
               loop); the whole run may take ten times that.
    library_files: source files whose lines are not the learner's (allocations are charged to their caller).
    harness_files: source files of the code that calls the learner's (a grader): their lines are marked "[harness]".
    make_fn:   instead of one `fn` for every rank (pass fn=None), `make_fn(rank)` returns rank's fn, called in
               the rank's own thread before it runs: each rank can import its own copy of a module, as each real
               process does, so module-level state (a queue, a counter, a cache) is per rank. Tensors made then
               by the module's own lines belong to the rank and are charged to its ledger; more than
               guards.IMPORT_BYTES of them is a HiddenMemoryError. charge_imports=False leaves them off the ledger
               (a module made of a notebook's cells, experiments included).

    Part IV, debugging a run (each off unless asked for):
    collective_timeout: init_process_group's timeout=, in ticks or a timedelta (a tick is a nanosecond): a
               communication call not completed that long after its rank issued it fails the run with
               CollectiveTimeoutError, as NCCL's watchdog does (simulator/watchdog.py).
    trace_buffer_size: the flight recorder's records per rank (TORCH_FR_BUFFER_SIZE); a collective timeout turns
               it on with 2,000. The result, or the error of a run that fails, carries its dump as
               `.flight_recorder` (simulator/flight_recorder.py; its analysis: fr_analysis.py).
    host:      a HostProfile: each rank's host launches its ops ahead of the device, and a sync (.item(),
               .tolist(), .cpu(), printing a tensor, nonzero, ...) makes it wait for the device's queue to empty
               (simulator/host.py). None: no host (the device never waits for a launch; syncs cost nothing).

    An exception in a rank finishes it; the others run on until each returns, raises or waits for it, and the
    error of the first rank (in rank order) that raised is re-raised here, with a note naming the ranks.
    """
    if rank_args is not None and len(rank_args) != world_size:
        raise ValueError(f"rank_args needs one entry per rank: {world_size}, got {len(rank_args)}")
    if (fn is None) == (make_fn is None):
        raise ValueError("sim.run needs either fn or make_fn (not both)")
    from .simulator import host as host_model, watchdog  # (inside: sim's own names are its API and nothing else)
    from .simulator.world import World

    world = World(world_size, cost or CostModel(), seed, timeout, library_files, harness_files)
    world.charge_imports = charge_imports
    watchdog.start(world, collective_timeout, trace_buffer_size)  # Part IV
    host_model.start(world, host)
    # autograd's anomaly mode is one switch for the whole process: a rank that turns it on while it debugs (p22's
    # story shows how) would leave every later run checking each backward op for nan. Each run gets it back.
    anomaly = (_torch.is_anomaly_enabled(), _torch.is_anomaly_check_nan_enabled())
    try:
        world.run(fn, tuple(args), rank_args, make_fn)  # raises the first error of any rank
    finally:
        _torch.set_anomaly_enabled(*anomaly)
    for ledger in world.ledgers:
        ledger.close()
    for r in world.ranks:
        r.clock.close()
    events = sorted((e for r in world.ranks for e in r.clock.events),
                    key=lambda e: (e.start, e.rank, e.stream, e.end))
    makespan = max([max(r.clock.compute, r.clock.comm) for r in world.ranks] + [e.end for e in events] + [0])
    return SimResult(world.size, [r.result for r in world.ranks], world.ledgers, events, makespan, world.cost,
                     [r.flops for r in world.ranks], world.warnings,
                     flight_recorder=world.flight.snapshot() if world.flight is not None else None)
