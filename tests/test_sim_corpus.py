"""The differential corpus (tests/corpus/) on the simulator, against what gloo did with each case (recorded in
tests/corpus/gloo_results.json by `python bench/bench_corpus.py --write`): every case must behave as the relation
written next to it says. tests/test_corpus_gloo.py runs gloo itself."""

import inspect
import re

import pytest
from corpus.case import LOOSER, REFUSED, SAME, STRICTER
from corpus.runner import (fingerprint, intended_values, judge, load_cases, load_record, recorded_outcome,
                           run_on_sim)

from puzzles.simulator.dist import SimDist

CASES = load_cases()
RECORD = load_record()["cases"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_simulator_agrees_with_gloo_as_the_case_says(name):
    c = CASES[name]
    entry = RECORD.get(name)
    assert entry is not None and entry["fingerprint"] == fingerprint(c), (
        f"{name}: gloo's outcome is not recorded for this version of the case: run "
        f"`python bench/bench_corpus.py --write`")
    problems = judge(c, run_on_sim(c.fn, c.ranks), recorded_outcome(entry), intended_values(c))
    assert not problems, f"{name} ({c.relation}): " + "; ".join(problems)


def test_the_record_holds_no_case_that_is_gone():
    assert sorted(RECORD) == sorted(CASES)


def test_the_corpus_is_large_and_uses_every_op_the_simulator_offers():
    assert len(CASES) >= 60
    assert {c.relation for c in CASES.values()} == {SAME, REFUSED, STRICTER, LOOSER}
    # get_backend is left out: its answer is the backend's name ("sim" on the simulator, "gloo" there)
    offered = {name for name, member in inspect.getmembers(SimDist, inspect.isfunction)
               if not name.startswith("_") and name != "get_backend"}
    source = "".join(inspect.getsource(inspect.getmodule(c.fn)) for c in CASES.values())
    unused = sorted(name for name in offered if not re.search(rf"dist\.{name}\(", source))
    assert not unused, f"no corpus case calls dist.{unused}"
    for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        assert f"ReduceOp.{op}" in source, op
    for kind in ("is_completed()", "wait()", "async_op=True", "tag=", "group_src=", "group_dst=", "recv(x)"):
        assert kind in source, kind


def test_every_deliberate_divergence_says_why():
    for c in CASES.values():
        if c.relation in (STRICTER, LOOSER):
            assert len(c.why) > 80, c.name
