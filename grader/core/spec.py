"""What a puzzle is, to the grader: a `PuzzleSpec`.

A spec is data plus a few functions:
    make_inputs(seed)      the serial inputs, fresh for every seed
    reference(inputs)      what the serial computation gives (the truth)
    launch(inputs)         what each rank is handed: (args shared by all ranks, one tuple of extra args per rank)
    program(module)        the function every rank runs: calls the learner's code, returns what it computed
    budgets(inputs)        the limits, each a formula with its number for the graded sizes
    check(obs, ref, inputs) the checks, from what the ranks returned and what the ledger and clock recorded

The learner's code runs only inside `program`, on the ranks; `check` runs in the grader with plain data (an
`Observation`), so the same checks grade the simulator, real torch.distributed processes, and a submission
graded in a child process.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from puzzles.sim import CostModel

from .compare import values_check
from .result import Budget, Check


@dataclass
class Observation:
    """Everything a run of the learner's code produced, as plain data."""

    results: list  # what `program` returned on each rank
    peak_bytes: list[int]
    ledgers: list[dict]  # Ledger.to_dict() per rank
    events: list[dict]  # Event.to_dict(), sorted by start
    makespan: int
    warnings: list[str] = field(default_factory=list)
    backend: str = "sim"

    @classmethod
    def from_sim(cls, result) -> Observation:
        return cls(result.results, result.peak_bytes, [l.to_dict() for l in result.ledgers],
                   [e.to_dict() for e in result.events], result.makespan, list(result.warnings))

    @property
    def world_size(self) -> int:
        return len(self.results)

    def events_of(self, rank=None, stream=None, kind=None, phase=None) -> list[dict]:
        return [e for e in self.events if (rank is None or e["rank"] == rank)
                and (stream is None or e["stream"] == stream) and (kind is None or e["kind"] == kind)
                and (phase is None or e["phase"] == phase)]

    def busy_ticks(self, rank: int, stream: str = "compute") -> int:
        return sum(e["end"] - e["start"] for e in self.events_of(rank, stream))

    def idle_fraction(self) -> float:
        """The bubble: the share of the makespan the compute streams sat idle, averaged over the ranks."""
        if not self.makespan:
            return 0.0
        busy = sum(self.busy_ticks(r) for r in range(self.world_size))
        return 1 - busy / (self.makespan * self.world_size)


class PuzzleSpec:
    id = ""  # "p3"
    name = ""  # "data_parallel": the puzzle file is f"{id}_{name}.py"
    title = ""  # "Data parallel"
    entries: tuple[str, ...] = ()  # the names the learner implements in that file
    world_size = 1
    cost = CostModel()
    timeout = 60.0
    hints: tuple[str, ...] = ()
    simulator_only: tuple[str, ...] = ()  # names of the checks only the simulated clock can make (see backends/real/)
    # What this puzzle's code may import beyond what every puzzle may (puzzles/simulator/modules.py): what its stub
    # needs (p18: io, zlib, json, hashlib, struct for a checkpoint's bytes)
    modules: tuple[str, ...] = ()

    @property
    def filename(self) -> str:
        return f"{self.id}_{self.name}.py"

    def make_inputs(self, seed: int) -> dict:
        raise NotImplementedError

    def reference(self, inputs: dict) -> dict:
        raise NotImplementedError

    def launch(self, inputs: dict) -> tuple[tuple, list | None]:
        raise NotImplementedError

    def program(self, module):
        raise NotImplementedError

    def budgets(self, inputs: dict) -> dict[str, Budget]:
        return {}

    def check(self, obs: Observation, ref: dict, inputs: dict) -> list[Check]:
        raise NotImplementedError

    def memory_lines(self, inputs: dict) -> list | None:
        """The budget line of each rank's memory plot, in total bytes (None where a rank has none)."""
        budget = self.budgets(inputs).get("peak memory")
        return [budget.value] * self.world_size if budget else None

    # A puzzle graded on a job of several launches that share a disk (p18: a failure, then a restart) sets this and
    # defines `job`; every other puzzle is one run of `program`.
    job_of_launches = False

    def job(self, launcher, inputs: dict) -> Observation:
        """Run the job's launches through `launcher` (the backend's: backends/launches.py, real/launches.py) and
        return what they did as one Observation."""
        raise NotImplementedError

    def run_context(self):
        """A context around loading and running the learner's file (p1 uses it to take torch.utils.checkpoint
        away)."""
        return contextlib.nullcontext()

    # Part IV: a puzzle about debugging a run sets up the machine its run is on from the grading seed (where the
    # fault sits varies with it): which rank is slow (the cost model), a collective timeout, a host.

    def cost_for(self, inputs: dict) -> CostModel:
        """The cost model of the run on these inputs (p23: the slow rank is the seed's); both backends use it."""
        return self.cost

    def sim_options(self, inputs: dict) -> dict:
        """sim.run's Part IV options for the run (collective_timeout, trace_buffer_size, host): {} for none."""
        return {}


def pair_at(sequence, i: int) -> tuple:
    """sequence[i] as a pair (w1, w2) when it is one, else (None, None): what an answer handed back is read, never
    trusted to have the right structure."""
    if isinstance(sequence, (list, tuple)) and i < len(sequence):
        item = sequence[i]
        if isinstance(item, (list, tuple)) and len(item) == 2:
            return tuple(item)
    return None, None


def layer_pairs(got_layers_per_rank, expected_layers, what: str = "") -> list:
    """(label, got, expected) for every weight of every rank: labels like 'rank 2: layers[3].w1'."""
    pairs = []
    for rank, got_layers in enumerate(got_layers_per_rank):
        for i, expected in enumerate(expected_layers):
            got = pair_at(got_layers, i)
            for name, g, e in (("w1", got[0], expected[0]), ("w2", got[1], expected[1])):
                pairs.append((f"rank {rank}: {what}layers[{i}].{name}", g, e, (rank, i, name)))
    return pairs


def check_layers(name: str, got_layers_per_rank, expected_layers, what: str, diagnose=None, prefix="") -> Check:
    return values_check(name, layer_pairs(got_layers_per_rank, expected_layers, prefix), what, diagnose)
