"""The grader kills the mutants of every reference solution at least as well as it did when this was measured.

Each mutant is a reference with one learner's mistake in it (grader/frontends/mutate/); the kill rate is killed
over the mutants that are not on the reviewed equivalents list. Raise a threshold when the checks get stronger;
never lower one to make a change pass. bench/MUTATION.md has the full run, its survivors and its equivalents.

Mutating all nineteen puzzles takes minutes, so `pytest tests` mutates the two smallest (p3, a collective written
by the learner; p4, Megatron's f and g as autograd functions: 19 mutants) and the rest are `slow` (`pytest tests
-m slow`, CI's second step). Each puzzle is mutated once per process, by whichever of its tests runs first (one
xdist group).
"""

from __future__ import annotations

import functools

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
    "p22": 1.0,
    "p23": 1.0,
}

FAST = ("p3", "p4")  # run by `pytest tests`; the others by `pytest tests -m slow`


@functools.cache
def mutated(puzzle: str):
    [run] = mutate_target(REPO / "solutions", [puzzle], SEED, list(EQUIVALENTS), jobs=2)
    return run


def each_puzzle():
    """Every puzzle, the slow ones marked so, each in its own xdist group (its two tests share one mutation run)."""
    return [pytest.param(p, id=p, marks=[pytest.mark.xdist_group(f"mutate-{p}")] + ([] if p in FAST else
                                                                                     [pytest.mark.slow]))
            for p in SPECS]


def test_every_puzzle_has_a_threshold():
    assert set(KILL_RATE_AT_LEAST) == set(SPECS)
    assert set(FAST) <= set(SPECS)


@pytest.mark.parametrize("puzzle", each_puzzle())
def test_the_kill_rate_stays_at_least_what_it_was(puzzle):
    run = mutated(puzzle)
    assert not run.error, run.error
    assert run.kill_rate >= KILL_RATE_AT_LEAST[puzzle] - 1e-9, (
        f"{puzzle}: kill rate {run.kill_rate:.3f} < {KILL_RATE_AT_LEAST[puzzle]:.3f}; what got through:\n"
        + report.console([run], "solutions", SEED, verbose=False))


@pytest.mark.parametrize("puzzle", each_puzzle())
def test_the_equivalents_list_matches_the_mutants_of_today(puzzle):
    run = mutated(puzzle)
    stale = [(e.operator, e.line, e.mutant) for e in run.stale]
    assert not stale, f"{puzzle}: entries of grader/frontends/mutate/equivalents.py that match no mutant: {stale}"
    killed = [(o.mutant.operator, o.mutant.line, o.killed_by) for o in run.outcomes if o.listed_equivalent]
    assert not killed, (f"{puzzle}: listed as equivalent, yet killed (a correct answer rejected, or a wrong entry): "
                        f"{killed}")


def test_every_equivalent_names_a_puzzle():
    """Each puzzle's equivalents are checked by that puzzle's run above: an entry for no puzzle would never be."""
    assert {e.puzzle for e in EQUIVALENTS} <= set(SPECS)
