"""The differential corpus (tests/corpus/) on gloo processes: every case, run on torch.distributed itself, must
behave as the relation written next to it says (the simulator's side is run again here too). Budget: about 30 s
on 2 cores, most of it the processes' start and the cases that hang until gloo's 1 s time limit.

`pytest tests` runs one case of each file and relation (20 of 128, the first by name); the others are `slow`
(`pytest tests -m slow`). Every case is held to gloo's recorded outcome on every run (test_sim_corpus.py)."""

import pytest
import torch.distributed as dist
from corpus.runner import intended_values, judge, load_cases, run_on_gloo, run_on_sim

pytestmark = [pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                 reason="torch.distributed with gloo is not available"),
              pytest.mark.xdist_group("gloo-corpus")]  # one worker starts gloo once for the selected cases

CASES = load_cases()


def representatives() -> set[str]:
    """The first case, by name, of each corpus file and relation."""
    first = {}
    for name in sorted(CASES):
        first.setdefault((CASES[name].fn.__module__, CASES[name].relation), name)
    return set(first.values())


FAST = representatives()


@pytest.fixture(scope="module")
def gloo_outcomes(request):
    """Every case this session runs (FAST alone under `pytest tests`), run on gloo together: one start for all."""
    names = [item.callspec.params["name"] for item in request.session.items
             if item.module is request.module and hasattr(item, "callspec")]
    return run_on_gloo([CASES[n] for n in names])


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in sorted(CASES)])
def test_gloo_and_the_simulator_agree_as_the_case_says(name, gloo_outcomes):
    c = CASES[name]
    problems = judge(c, run_on_sim(c.fn, c.ranks), gloo_outcomes[name], intended_values(c))
    assert not problems, f"{name} ({c.relation}): " + "; ".join(problems)
