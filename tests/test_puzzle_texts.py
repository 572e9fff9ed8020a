"""The story a learner reads states every budget, with the same number the grader enforces (older puzzle sets
printed targets that drifted away from what their own solutions achieved)."""

import ast

import pytest

from grader.core.result import fmt
from grader.frontends.targets import REPO
from grader.specs import SPECS


def docstring(spec):
    return ast.get_docstring(ast.parse((REPO / "solutions" / spec.filename).read_text()))


@pytest.mark.parametrize("puzzle", list(SPECS))
def test_every_budget_is_stated_in_the_puzzle_text(puzzle):
    spec = SPECS[puzzle]
    text = docstring(spec)
    assert text, f"solutions/{spec.filename} has no module docstring (the puzzle's story)"
    for budget in spec.budgets(spec.make_inputs(0)).values():
        number = fmt(budget.value, budget.unit).split(" ")[0]
        assert number in text, f"{spec.filename} never states the {budget.name} budget {number} ({budget.formula})"


@pytest.mark.parametrize("puzzle", list(SPECS))
def test_budgets_do_not_depend_on_the_seed(puzzle):
    spec = SPECS[puzzle]
    assert spec.budgets(spec.make_inputs(0)) == spec.budgets(spec.make_inputs(12345))
