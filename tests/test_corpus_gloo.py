"""The differential corpus (tests/corpus/) on gloo processes: every case, run on torch.distributed itself, must
behave as the relation written next to it says (the simulator's side is run again here too). Budget: about 30 s
on 2 cores, most of it the processes' start and the cases that hang until gloo's 1 s time limit."""

import pytest
import torch.distributed as dist
from corpus.runner import intended_values, judge, load_cases, run_on_gloo, run_on_sim

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")

CASES = load_cases()


@pytest.fixture(scope="module")
def gloo_outcomes():
    return run_on_gloo(list(CASES.values()))


@pytest.mark.parametrize("name", sorted(CASES))
def test_gloo_and_the_simulator_agree_as_the_case_says(name, gloo_outcomes):
    c = CASES[name]
    problems = judge(c, run_on_sim(c.fn, c.ranks), gloo_outcomes[name], intended_values(c))
    assert not problems, f"{name} ({c.relation}): " + "; ".join(problems)
