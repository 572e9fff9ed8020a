"""A rank's own code may take no frame and may not trace, profile or list the process's objects (allowed.py): a
frame reaches every frame below it and their locals, the simulator's world, clock and ledger among them (a blind
attack on p20 and p21 found the world that way, read the grading seed from it and rewound a rank's clock). Code
that takes frames for its own work (traceback, logging, warnings) runs as before."""

import gc
import inspect
import io
import logging
import sys
import traceback
import warnings

import pytest

from puzzles import sim


def _raised():
    try:
        raise ValueError("for its traceback")
    except ValueError as e:
        return e


def _generator():
    yield 1


REFUSED = {
    "sys._getframe": (lambda: sys._getframe(), "sys._getframe"),
    "inspect.currentframe": (lambda: inspect.currentframe(), "sys._getframe"),
    "inspect.stack": (lambda: inspect.stack(), "sys._getframe"),
    "a traceback's frame": (lambda: _raised().__traceback__.tb_frame, ".tb_frame"),
    "a generator's frame": (lambda: _generator().gi_frame, ".gi_frame"),
    "traceback.walk_stack": (lambda: next(traceback.walk_stack(None)), "sys._getframe"),
    "sys._current_frames": (lambda: sys._current_frames(), "sys._current_frames()"),
    "gc.get_objects": (lambda: gc.get_objects(), "gc.get_objects()"),
    "gc.get_referrers": (lambda: gc.get_referrers(sim), "gc.get_referrers()"),
    "sys.settrace": (lambda: sys.settrace(None), "sys.settrace"),
    "sys.setprofile": (lambda: sys.setprofile(None), "sys.setprofile"),
}


@pytest.mark.parametrize("how", sorted(REFUSED))
def test_a_rank_may_take_no_frame_and_list_no_object(how):
    take, named = REFUSED[how]

    def fn(dist):
        if dist.get_rank() == 1:
            take()
        dist.barrier()

    with pytest.raises(sim.IsolationError) as info:
        sim.run(fn, 2)
    text = str(info.value)
    assert f"rank 1 took {named}" in text and "test_allowed_frames.py:" in text, text
    assert "traceback.print_exc() works" in text


HONEST = {
    "traceback.print_exc": lambda: traceback.print_exc(file=io.StringIO()),
    "traceback.format_exception": lambda: "".join(traceback.format_exception(_raised())),
    "traceback.extract_stack": lambda: traceback.extract_stack(),
    "logging": lambda: logging.getLogger("a learner's").info("step done"),
    "warnings.warn": lambda: warnings.warn("a learner's warning", stacklevel=2),
}


@pytest.mark.filterwarnings("ignore:a learner's warning")
@pytest.mark.parametrize("how", sorted(HONEST))
def test_code_that_takes_frames_for_its_own_work_runs(how):
    def fn(dist):
        try:
            raise RuntimeError("caught, then printed")
        except RuntimeError:
            HONEST[how]()
        return dist.get_rank()

    assert sim.run(fn, 2).results == [0, 1]


def test_outside_a_run_frames_are_anyones():
    assert sys._getframe().f_code.co_name == "test_outside_a_run_frames_are_anyones"
    assert gc.get_referrers(sim) is not None
