"""p13's sizes, its network, the eight runs it grades, their budgets as formulas, and how one run's share of the
record (its messages, its clock, its memory) is read back out of the whole run.

The eight runs: each function at two sizes on either side of the crossover, in a world of 8 ranks and in two worlds
of 4 at once (ranks 0-3 and 4-7), one after the other. A barrier of the harness's separates them, so each starts
at the same tick on every rank:

    | barrier | ring, N=4, 4 KiB | barrier | ring, N=4, 512 KiB | barrier | ... | doubling, N=8, 512 KiB | barrier |

A run's messages are the communication events between its two barriers (in each rank's issue order, which both
backends keep); its time, on the simulator, from the end of the first barrier to its last event; its memory, the
ledger timeline's entries between the marks the harness takes around the call (probe.ledger_mark()).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import log2

from puzzles.sim import CostModel

from ...core.rules import BOOKKEEPING_BYTES
from ...core.spec import Observation
from ..common.costs import elementwise

ALPHA, LINK = 128, 64  # ticks of latency per message; bytes per tick on a link (beta = 1/64 tick per byte)
COST = CostModel(latency_ticks=ALPHA, bytes_per_tick=LINK)
WORLD = 8
TOLERANCE_PERCENT = 10
SHAPES = {"small": (512,), "large": (512, 128)}  # 4,096 and 524,288 bytes of float64
FUNCTIONS = {"ring": "ring_all_reduce", "doubling": "recursive_doubling_all_reduce"}


def kib(nbytes: int) -> str:
    return f"{nbytes // 1024:,} KiB"


def reduction_ticks(numel: int) -> int:
    """One in-place add of `numel` received elements into as many of t's (reads two, writes one) on the clock."""
    return elementwise(COST, numel, tensors=3).ticks


@dataclass(frozen=True)
class Run:
    """One call of one function on every rank: `algorithm` ("ring" or "doubling") in worlds of `n` ranks on a
    tensor of `shape`."""

    algorithm: str
    n: int
    shape: tuple

    @property
    def key(self) -> str:
        return f"{self.algorithm}, N={self.n}, {kib(self.nbytes)}"

    @property
    def function(self) -> str:
        return FUNCTIONS[self.algorithm]

    @property
    def numel(self) -> int:
        out = 1
        for s in self.shape:
            out *= s
        return out

    @property
    def nbytes(self) -> int:  # S
        return self.numel * 8

    def world_of(self, rank: int) -> tuple[int, ...]:
        """The global ranks of `rank`'s world in this run."""
        first = rank // self.n * self.n
        return tuple(range(first, first + self.n))

    # ---- the formulas

    @property
    def steps(self) -> int:
        return 2 * (self.n - 1) if self.algorithm == "ring" else int(log2(self.n))

    @property
    def message_bytes(self) -> int:
        """Each step's message: a chunk S/N on the ring, the whole tensor S in recursive doubling."""
        return self.nbytes // self.n if self.algorithm == "ring" else self.nbytes

    @property
    def sent_bytes(self) -> int:
        """Bytes each rank sends: 2(N-1)/N·S on the ring, log2(N)·S in recursive doubling."""
        return self.steps * self.message_bytes

    @property
    def alpha_beta_ticks(self) -> int:
        """The α-β formula: 2(N-1)(α + S/(Nβ)) on the ring, log2(N)(α + S/β) in recursive doubling."""
        return self.steps * COST.comm_ticks("send", self.message_bytes, 2)

    @property
    def reductions(self) -> int:
        """The adds on the critical path: N-1 chunks on the ring (each before it is passed on), log2 N tensors."""
        return self.n - 1 if self.algorithm == "ring" else self.steps

    @property
    def reduction_ticks(self) -> int:
        return self.reductions * reduction_ticks(self.message_bytes // 8)

    @property
    def tolerance_ticks(self) -> int:
        return self.alpha_beta_ticks * TOLERANCE_PERCENT // 100

    @property
    def makespan_budget(self) -> int:
        return self.alpha_beta_ticks + self.reduction_ticks + self.tolerance_ticks

    @property
    def held_budget(self) -> int:
        """Bytes held beyond what the rank held before the call: two messages' worth (a receive buffer, and room for
        a second), a chunk each on the ring, the whole tensor each in recursive doubling."""
        return 2 * self.message_bytes + BOOKKEEPING_BYTES


RUNS = tuple(Run(algorithm, n, SHAPES[size]) for algorithm in FUNCTIONS for n in (4, 8) for size in SHAPES)


def runs_of(algorithm: str) -> list[Run]:
    return [run for run in RUNS if run.algorithm == algorithm]


def crossover_bytes(n: int) -> float:
    """The size S* at which the two α-β formulas are equal: 2(N-1)α + 2(N-1)/N·Sβ = log2N·α + log2N·Sβ, so
    S* = α/β · (2(N-1) - log2 N) / (log2 N - 2(N-1)/N)."""
    lg = log2(n)
    return ALPHA * LINK * (2 * (n - 1) - lg) / (lg - 2 * (n - 1) / n)


# ---- reading one run's share back out of the whole record


def is_harness_barrier(event: dict) -> bool:
    return event["kind"] == "barrier" and str(event.get("site", "")).startswith("[harness]")


def comm_by_run(obs: Observation, rank: int) -> list[list[dict]]:
    """The rank's communication events, one list per run, in issue order (split at the harness's barriers)."""
    runs: list[list[dict]] = []
    current = None
    for e in obs.events_of(rank, "comm"):  # sorted by start; a rank's zero-length events (gloo's) keep issue order
        if is_harness_barrier(e):
            current = [] if len(runs) < len(RUNS) else None
            if current is not None:
                runs.append(current)
        elif current is not None and e["kind"] != "new_group":
            current.append(e)
    return runs + [[] for _ in range(len(RUNS) - len(runs))]


def windows(obs: Observation) -> list[tuple[int, int]]:
    """(start, end) ticks of each run on the simulated clock: from the end of the barrier before it to the start of
    the barrier after it (the same on every rank: a barrier ends for all of its ranks at once)."""
    barriers = sorted({(e["start"], e["end"]) for e in obs.events_of(0, "comm") if is_harness_barrier(e)})
    return [(barriers[i][1], barriers[i + 1][0]) for i in range(min(len(RUNS), len(barriers) - 1))]


def run_makespan(obs: Observation, run_index: int, ranks) -> int:
    """Ticks from the run's start to the last event of any rank of `ranks` inside its window."""
    spans = windows(obs)
    if run_index >= len(spans):
        return 0
    start, end = spans[run_index]
    last = start
    for r in ranks:
        for e in obs.events_of(r):
            if e["start"] >= start and e["end"] <= end and not is_harness_barrier(e):
                last = max(last, e["end"])
    return last - start


def held_beyond(obs: Observation, rank: int, marks) -> int:
    """The most bytes the rank held during the call beyond what it held when the call began."""
    if not (isinstance(marks, (tuple, list)) and len(marks) == 2):
        return 0
    timeline = obs.ledgers[rank]["timeline"]
    start, end = marks
    base = timeline[start - 1][1] if 0 < start <= len(timeline) else 0
    inside = [b for _, b in timeline[start:end]]
    return max(inside, default=base) - base
