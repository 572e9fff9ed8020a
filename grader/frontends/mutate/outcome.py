"""What grading one mutant came to (an Outcome), and the limits it was graded under."""

from __future__ import annotations

from dataclasses import dataclass, field

from .source import Mutant

KILLED, SURVIVED, EQUIVALENT, GRADER_ERROR, TOOL_ERROR = "killed", "survived", "equivalent", "grader-error", "tool-error"
TIME_FACTOR, MIN_SIM_TIMEOUT = 10, 2.0  # the simulator's limit: 10x the reference's run time, at least 2 s


@dataclass
class Outcome:
    mutant: Mutant
    status: str  # KILLED, SURVIVED, EQUIVALENT, GRADER_ERROR or TOOL_ERROR
    killed_by: str = ""  # the checks that failed ("updated weights, all-reduce volume"), or "error: ..."
    detail: str = ""  # the grader's or the tool's error; for an equivalent, why it is one
    seconds: float = 0.0
    listed_equivalent: str = ""  # on the equivalents list, yet killed: the list's reason
    peak_bytes: list[int] = field(default_factory=list)  # per rank, when the mutant ran to the end
    makespan: int | None = None

    def to_dict(self) -> dict:
        d = {**self.mutant.key, "lineno": self.mutant.lineno, "description": self.mutant.description,
             "status": self.status, "killed_by": self.killed_by, "seconds": round(self.seconds, 3)}
        if self.detail:
            d["detail"] = self.detail
        if self.listed_equivalent:
            d["listed_equivalent"] = self.listed_equivalent
        if self.status != KILLED:
            d["diff"] = self.mutant.diff
            d["peak_bytes"], d["makespan_ticks"] = self.peak_bytes, self.makespan
        return d


@dataclass(frozen=True)
class Limits:
    sim_timeout: float  # seconds a rank may compute without communicating (the simulator's limit)
    wall: float  # seconds before the parent kills the child
    memory_mb: int  # address space a child may add to the parent's

    @classmethod
    def from_reference(cls, seconds: float, memory_mb: int = 4096) -> Limits:
        sim = max(MIN_SIM_TIMEOUT, TIME_FACTOR * seconds)
        return cls(round(sim, 2), round(3 * sim + 5, 2), memory_mb)
