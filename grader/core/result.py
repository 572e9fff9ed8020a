"""The structured result of grading: one `PuzzleResult` per puzzle, a list of `Check`s in each.

The console table, `--json`, the notebook's HTML and the pytest failure message are all renderings of these
objects (see report.py); nothing is decided while rendering.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

PASS, FAIL, ERROR, NOT_ATTEMPTED = "pass", "fail", "error", "not_attempted"
PARTIAL = "partial"  # some of the puzzle's functions are written, some still raise NotImplementedError
TAMPERED = "tampered"  # the answer modified the grader, the simulator, torch, or what a puzzle takes away
GRADER_ERROR = "grader_error"  # the grader itself failed: not the answer's fault
# Every status, in the order a scoreboard counts them. Only PASS counts as passing; NOT_ATTEMPTED is the one
# status besides PASS that is not a problem (a learner who has not started yet).
STATUSES = (PASS, FAIL, PARTIAL, ERROR, TAMPERED, GRADER_ERROR, NOT_ATTEMPTED)


@dataclass
class Budget:
    """A limit the answer must stay within, stated as a formula and as its number for the graded sizes."""

    name: str
    formula: str  # "W/N + G/N + 2·B·h/N·8 bytes"
    value: int | float
    unit: str  # "bytes", "ticks", "fraction", "count"

    def describe(self) -> str:
        return f"{self.formula} = {fmt(self.value, self.unit)}"


@dataclass
class Check:
    name: str
    passed: bool
    message: str
    measured: int | float | None = None
    budget: Budget | None = None
    diagnosis: str = ""  # the most likely mistake, when the numbers point at one
    # Only the simulated clock can make this check (makespan, bubble, overlap). A spec may set it; on a real
    # backend the runner then reports the check as "simulator only" (passed=True: not made, so not failed).
    simulator_only: bool = False

    def to_dict(self) -> dict:
        d = {"name": self.name, "passed": self.passed, "message": self.message}
        if self.simulator_only:
            d["simulator_only"] = True
        if self.measured is not None:
            d["measured"] = self.measured
        if self.budget is not None:
            d["budget"] = asdict(self.budget)
        if self.diagnosis:
            d["diagnosis"] = self.diagnosis
        return d


@dataclass
class PuzzleResult:
    id: str
    name: str
    title: str
    status: str
    checks: list[Check] = field(default_factory=list)
    peak_bytes: list[int] = field(default_factory=list)
    makespan_ticks: int = 0
    error: str = ""  # for every status but pass and fail: what happened
    figures: dict = field(default_factory=dict)  # data the plots are drawn from

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def to_dict(self, figures: bool = False) -> dict:
        d = {"id": self.id, "name": self.name, "title": self.title, "status": self.status,
             "checks": [c.to_dict() for c in self.checks], "peak_bytes": list(self.peak_bytes),
             "makespan_ticks": self.makespan_ticks}
        if self.error:
            d["error"] = self.error
        if figures and self.figures:
            d["figures"] = self.figures
        return d


def status_of(checks: list[Check]) -> str:
    return PASS if all(c.passed for c in checks) else FAIL


def fmt(value, unit: str) -> str:
    """A number in its unit, for people: '1,234,567 bytes (1.18 MiB)', '12,345 ticks', '27.3%'."""
    if value is None:
        return "-"
    if unit == "bytes":
        v = int(value)
        if abs(v) >= 1 << 20:
            return f"{v:,} bytes ({v / (1 << 20):.2f} MiB)"
        if abs(v) >= 1 << 10:
            return f"{v:,} bytes ({v / (1 << 10):.1f} KiB)"
        return f"{v:,} bytes"
    if unit == "ticks":
        return f"{int(value):,} ticks"
    if unit == "fraction":
        return f"{100 * value:.1f}%"
    if unit == "count":
        return f"{int(value):,}"
    return str(value)
