"""The grader kills the mutants of every reference solution at least as well as it did when this was measured.

Each mutant is a reference with one learner's mistake in it (grader/frontends/mutate/); the kill rate is killed
over the mutants that are not on the reviewed equivalents list. Raise a threshold when the checks get stronger;
never lower one to make a change pass. bench/MUTATION.md has the full run, its survivors and its equivalents.
"""

from __future__ import annotations

import pytest

from grader.frontends.mutate import report
from grader.frontends.mutate.equivalents import EQUIVALENTS
from grader.frontends.mutate.session import mutate_target
from grader.frontends.targets import REPO
from grader.specs import SPECS

SEED = 1
# Measured with `python -m grader mutate solutions --seed 1` (bench/MUTATION.md): killed / (mutants - equivalent).
KILL_RATE_AT_LEAST = {  # every puzzle: every mutant that is not a reviewed equivalent is killed
    "p1": 1.0,
    "p2": 1.0,
    "p3": 1.0,
    "p4": 1.0,
    "p5": 1.0,
    "p6": 1.0,
    "p7": 1.0,
    "p8": 1.0,
    "p9": 1.0,
    "p10": 1.0,
    "p11": 1.0,
    "p12": 1.0,
    "p16": 1.0,
    "p17": 1.0,
    "p18": 1.0,
    "p13": 1.0,
    "p14": 1.0,
    "p15": 1.0,
    "p19": 1.0,
    "p20": 1.0,
    "p21": 1.0,
}

@pytest.fixture(scope="module")
def runs():
    return {r.id: r for r in mutate_target(REPO / "solutions", None, SEED, list(EQUIVALENTS), jobs=2)}


def test_every_puzzle_has_a_threshold():
    assert set(KILL_RATE_AT_LEAST) == set(SPECS)


@pytest.mark.parametrize("puzzle", list(SPECS))
def test_the_kill_rate_stays_at_least_what_it_was(runs, puzzle):
    run = runs[puzzle]
    assert not run.error, run.error
    assert run.kill_rate >= KILL_RATE_AT_LEAST[puzzle] - 1e-9, (
        f"{puzzle}: kill rate {run.kill_rate:.3f} < {KILL_RATE_AT_LEAST[puzzle]:.3f}; what got through:\n"
        + report.console([run], "solutions", SEED, verbose=False))


def test_the_equivalents_list_matches_the_mutants_of_today(runs):
    stale = [(r.id, e.operator, e.line, e.mutant) for r in runs.values() for e in r.stale]
    assert not stale, f"entries of grader/frontends/mutate/equivalents.py that match no mutant: {stale}"
    killed = [(r.id, o.mutant.operator, o.mutant.line, o.killed_by) for r in runs.values() for o in r.outcomes
              if o.listed_equivalent]
    assert not killed, f"listed as equivalent, yet killed (a correct answer rejected, or a wrong entry): {killed}"
