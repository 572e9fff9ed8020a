"""What the simulator's reports say: a deadlock names the learner's line, the lines that called it, and what the
rank was computing; an error names the learner's line even when the grader's wrapper of `dist` sits between;
an error that every rank makes says so."""

import re

import pytest
import torch
from sim_helpers import harness_program, site_in

import sim_helpers
from puzzles import sim


def site(marker: str) -> str:
    return site_in(__file__, marker)


def raises(error, fn, n, **kwargs):
    with pytest.raises(error) as info:
        sim.run(fn, n, **kwargs)
    return info.value


def test_a_deadlock_names_the_helper_line_its_caller_and_the_last_compute():
    def fn(dist):
        peer = 1 - dist.get_rank()

        def send_next(t):
            dist.send(t, peer)  # helper-send

        with torch.profiler.record_function("F3"):
            y = torch.ones(4, 4, dtype=torch.float64) @ torch.ones(4, 4, dtype=torch.float64)
        send_next(y)  # calls-helper

    text = str(raises(sim.DeadlockError, fn, 2))
    assert f"at {site('helper-send')}\n      called from {site('calls-helper')}" in text, text
    assert "rank 0's last compute: a forward [F3]" in text and "ranks 0 and 1 both send first" in text
    assert not re.search(r":\s*:|\): rank|: rank \d has posted", text), f"a doubled colon:\n{text}"


def test_a_deadlock_in_a_backward_hook_says_so():
    def fn(dist):
        w = torch.ones(3, dtype=torch.float64, requires_grad=True)
        if dist.get_rank() == 0:
            w.register_hook(lambda g: dist.all_reduce(g))  # in-hook
        (w * 2).sum().backward()  # runs-backward

    text = str(raises(sim.DeadlockError, fn, 2))
    assert f"at {site('in-hook')}\n      called from {site('runs-backward')}" in text
    assert "rank 0 is in a backward pass (autograd's backward issued the call)" in text
    assert "rank 1: has returned" in text


def test_a_line_that_ends_with_a_colon_is_not_followed_by_another():
    def fn(dist):
        x = torch.ones(2, dtype=torch.float64)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 1 - dist.get_rank())]):  # batch-line
            w.wait()

    text = str(raises(sim.DeadlockError, fn, 2))
    assert f"at {site('batch-line')}\n" in text and "neither posts the matching receive" in text
    assert "::" not in text


def test_a_harness_wrapper_between_the_simulator_and_the_learner_is_not_the_site():
    def learner(dist):
        out = torch.empty(4, dtype=torch.float64)
        work = dist.all_gather_into_tensor(out, torch.ones(2, dtype=torch.float64), async_op=True)  # learner-issue
        y = out * 2  # learner-read
        work.wait()
        return y

    e = raises(sim.InFlightError, harness_program(learner), 2, harness_files=[sim_helpers.__file__])
    assert site("learner-read") in str(e) and f"issued at {site('learner-issue')}" in str(e)
    assert "[harness]" not in str(e)


def test_a_harness_allocation_with_no_learner_line_beyond_it_stays_marked():
    result = sim.run(harness_program(lambda dist: None), 1, harness_files=[sim_helpers.__file__])
    sites = [s for s, _, _ in result.ledgers[0].peak_by_line()]
    assert any(s.startswith("[harness] sim_helpers.py") and "harness-allocation" in s for s in sites), sites


def test_an_error_every_rank_makes_is_reported_as_such():
    def fn(dist):
        dist.barrier()
        return 1 / 0  # everyone

    e = raises(ZeroDivisionError, fn, 4)
    assert e.sim_rank == 0
    assert "(raised on every rank, 4 of 4; this is rank 0's)" in e.__notes__


def test_an_error_some_ranks_make_names_them_and_the_ranks_stopped():
    def fn(dist):
        if dist.get_rank() in (1, 3):
            raise KeyError("layer")  # some
        dist.barrier()

    e = raises(KeyError, fn, 4)
    assert e.sim_rank == 1
    assert "(raised on ranks [1, 3] of 4; this is rank 1's; ranks [0, 2] were stopped)" in e.__notes__


def test_one_rank_s_error_while_the_others_wait_for_it():
    def fn(dist):
        if dist.get_rank() == 2:
            raise ValueError("boom")
        dist.all_reduce(torch.ones(1))

    e = raises(ValueError, fn, 3)
    assert e.sim_rank == 2 and "(raised on rank 2 of 3; ranks [0, 1] were stopped)" in e.__notes__


def test_different_errors_on_different_ranks_report_the_first_rank_s():
    def fn(dist):
        dist.barrier()
        if dist.get_rank() == 0:
            raise ValueError("first")
        raise KeyError("other")

    e = raises(ValueError, fn, 3)
    assert "(raised on rank 0 of 3; ranks [1, 2] raised other errors)" in e.__notes__


def test_p2_names_the_learner_s_line_not_the_grader_s_wrapper(tmp_path):
    """p2's grader hands the learner `dist` wrapped (GatherWatch, to see each all-gather): an InFlightError must
    still point at the learner's own lines."""
    from grader.backends.simulator import grade_file
    from grader.specs import SPECS

    spec = SPECS["p2"]
    text = (sim_helpers.REPO / "solutions" / spec.filename).read_text()
    old = "        dist.all_gather_into_tensor(full, shard)\n        start = full.requires_grad_()\n"
    new = ("        work = dist.all_gather_into_tensor(full, shard, async_op=True)  # p2-issue\n"
           "        peek = full.sum()  # p2-too-early\n        work.wait()\n        start = full.requires_grad_()\n")
    assert old in text
    path = tmp_path / spec.filename
    path.write_text(text.replace(old, new))
    result = grade_file(spec, path, seed=1)
    assert result.status == "error" and "InFlightError" in result.error, result.error
    assert site_in(str(path), "p2-too-early") in result.error
    assert f"issued at {site_in(str(path), 'p2-issue')}" in result.error
    assert "[harness]" not in result.error


def test_simulator_errors_from_different_lines_are_not_the_same_error():
    def fn(dist):
        x = torch.ones(2, dtype=torch.float64)
        work = dist.all_reduce(x, async_op=True)
        if dist.get_rank() == 0:
            y = x + 1  # early-0
        else:
            y = x * 2  # early-1
        work.wait()
        return y

    e = raises(sim.InFlightError, fn, 3)
    assert site("early-0") in str(e)
    assert "(raised on rank 0 of 3; ranks [1, 2] raised other errors)" in e.__notes__
