"""The ways out of the ledger and the clock besides a tensor's contents (puzzles/simulator/escapes.py, issue 19's
blind attack): a rank's own code that switches torch's dispatch modes off, writes a file or maps memory gets an
IsolationError naming its line, on the simulator and on real processes alike; torch's own use of
the same levers (printing a tensor) and reading files stay fine; and data hung on any module is tampering.
Budget: a few seconds, and one gloo group."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from escape_helpers import REFUSED, prints_and_reads

from grader.backends.simulator import grade_file
from grader.frontends.targets import REPO
from grader.specs import SPECS
from puzzles import sim
from puzzles.sim import IsolationError


@pytest.mark.parametrize("program", list(REFUSED), ids=lambda f: f.__name__)
def test_each_escape_is_refused_on_the_simulator_with_its_line(program):
    with pytest.raises(IsolationError) as raised:
        sim.run(program, 2)
    text = str(raised.value)
    assert REFUSED[program] in text and "escape_helpers.py:" in text, text


def test_torchs_own_use_of_the_levers_and_reading_files_stay_fine():
    assert sim.run(prints_and_reads, 2).results[0] > 0


def test_the_levers_are_torchs_own_again_after_a_run():
    import torch.utils._python_dispatch as python_dispatch

    before = python_dispatch._disable_current_modes
    sim.run(prints_and_reads, 1)
    assert python_dispatch._disable_current_modes is before
    with python_dispatch._disable_current_modes():  # outside a run, anyone may
        pass


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="gloo is not available")
def test_each_escape_is_refused_on_real_processes_too():
    from grader.backends import real

    programs = [*REFUSED, prints_and_reads]
    outcomes = real.run_tasks([real.FunctionTask(p, ()) for p in programs], 1, timeout=60.0)
    for program, outcome in zip(programs, outcomes):
        if program is prints_and_reads:
            assert outcome.ok, outcome.error
        else:
            assert outcome.status == "error" and REFUSED[program] in outcome.error, (program.__name__, outcome.error)


def test_data_hung_on_a_module_is_tampering(tmp_path):
    reference = (REPO / "solutions" / SPECS["p3"].filename).read_text()
    # (p18 may import zlib, where a restart should lose what is not on the disk; p3 a module on the list: heapq)
    answer = "import heapq\n" + reference.replace("def data_parallel_step(", "def _step(", 1) + (
        "\n\ndef data_parallel_step(*args, **kwargs):\n"
        "    heapq.kept = {'step': list(range(1000))}  # survives the run, where no ledger looks\n"
        "    return _step(*args, **kwargs)\n")
    path = tmp_path / SPECS["p3"].filename
    path.write_text(answer)
    result = grade_file(SPECS["p3"], path, seed=0)
    assert result.status == "tampered" and "heapq.kept was added" in result.error, (result.status, result.error)
    import heapq

    assert not hasattr(heapq, "kept")  # undone, so that what runs next is sound
