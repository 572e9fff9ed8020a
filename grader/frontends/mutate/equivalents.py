"""The reviewed list of equivalent mutants: mutants that survive because they are not wrong answers.

Each entry is keyed by what stays put when the file is edited: the puzzle, the operator, the reference's line
(stripped) and what the mutant made of it (stripped; "" when the line is gone), plus `occurrence` when the same
line text appears more than once in the file. Never by line number. Each entry says why the mutant computes the
same thing, with the same memory and time, or why no rule of the puzzle forbids the difference. A mutant on this
list that the grader kills is reported (the grader rejects a correct answer, or the entry is wrong).

Instructors add entries for their own puzzles in a JSON file (a list of objects with these fields), passed with
`python -m grader mutate --equivalents FILE`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .source import Mutant


@dataclass(frozen=True)
class Equivalent:
    puzzle: str
    operator: str
    line: str
    mutant: str
    reason: str
    occurrence: int | None = None  # None: every line with this text

    def matches(self, m: Mutant) -> bool:
        return (self.puzzle, self.operator, self.line, self.mutant) == (m.puzzle, m.operator, m.line, m.mutant) and (
            self.occurrence is None or self.occurrence == m.occurrence)


def reason_for(mutant: Mutant, entries) -> str:
    return next((e.reason for e in entries if e.matches(mutant)), "")


def load(path: Path) -> list[Equivalent]:
    """Entries from a JSON file: [{"puzzle", "operator", "line", "mutant", "reason", "occurrence"?}, ...]."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of equivalent mutants")
    fields = {"puzzle", "operator", "line", "mutant", "reason", "occurrence"}
    out = []
    for i, item in enumerate(data):
        missing = {"puzzle", "operator", "line", "mutant", "reason"} - set(item)
        if missing or set(item) - fields:
            raise ValueError(f"{path}: entry {i} needs the fields puzzle, operator, line, mutant and reason "
                             f"(and may give occurrence); it has {sorted(item)}")
        out.append(Equivalent(**item))
    return out


EQUIVALENTS: tuple[Equivalent, ...] = ()
