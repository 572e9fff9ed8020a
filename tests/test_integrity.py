"""Verdicts the learner's code cannot fool, and the grader's own failures never blamed on the learner.

- A half-written puzzle is "partial" (naming what is left), not "not attempted"; a NotImplementedError the
  learner's code raises itself (or torch raises) is an error of the answer.
- Modifying the grader, the simulator, torch, or a module a puzzle takes away is "tampered", never a pass.
- The memory ledger's figures are cross-checked against its own timeline and the storages it tracks.
- Tensors stay tensors inside a rank: numpy arrays, Python lists and bytes would hide memory from the ledger.
- A check or diagnosis that crashes is a grader error (or a missing diagnosis), never the learner's fault.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grader.backends.simulator import grade_file
from grader.core import report
from grader.core.result import ERROR, FAIL, GRADER_ERROR, NOT_ATTEMPTED, PARTIAL, PASS, TAMPERED
from grader.frontends import cli
from grader.frontends.stubs import stub
from grader.frontends.targets import REPO
from grader.specs import SPECS
from puzzles import sim


def solution(pid: str) -> str:
    return (REPO / "solutions" / SPECS[pid].filename).read_text()


def solved(pid: str) -> str:
    """The reference solution as a learner's file (the marker lines gone)."""
    return "".join(line for line in solution(pid).splitlines(keepends=True)
                   if line.strip() not in ("# BEGIN SOLUTION", "# END SOLUTION"))


def write(tmp_path: Path, pid: str, source: str) -> Path:
    path = tmp_path / SPECS[pid].filename
    path.write_text(textwrap.dedent(source) if source.startswith("\n") else source)
    return path


def grade(tmp_path, pid, source, seed=3):
    result = grade_file(SPECS[pid], write(tmp_path, pid, source), seed)
    return result, report.pytest_message(result, seed)


P3_IMPORTS = "import torch\nfrom puzzles.model import forward, loss_fn\n"
P3_RIGHT = P3_IMPORTS + '''
def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    loss_fn(forward(x_shard, layers), target_shard).backward()
    with torch.no_grad():
        for w1, w2 in layers:
            for w in (w1, w2):
                dist.all_reduce(w.grad, op=dist.ReduceOp.AVG)
                w -= lr * w.grad
'''


# ---- partly written puzzles


def test_a_puzzle_with_one_part_left_is_partial_and_names_it(tmp_path):
    source = stub(solution("p4"), "p4_tensor_parallel.py")
    source = source.replace('raise NotImplementedError("p4: write CopyToTensorParallel.forward")',
                            "ctx.dist = dist\n        return x")
    source = source.replace('raise NotImplementedError("p4: write tp_forward")', '''for w1, w2 in shards:
        a = F.gelu(CopyToTensorParallel.apply(x, dist) @ w1)
        x = x + ReduceFromTensorParallel.apply(a @ w2, dist)
    return x''')
    result, message = grade(tmp_path, "p4", source)
    assert result.status == PARTIAL, message
    assert "ReduceFromTensorParallel.forward" in result.error and "CopyToTensorParallel.backward" in result.error
    assert "tp_forward" not in result.error.split("still to write")[1].split(".")[0], message
    assert "PARTIAL" in message


def test_a_raise_left_after_written_code_is_partial_with_its_line(tmp_path):
    source = P3_RIGHT.replace("                w -= lr * w.grad",
                              "                w -= lr * w.grad\n    raise NotImplementedError(\"p3: write data_parallel_step\")")
    result, message = grade(tmp_path, "p3", source)
    assert result.status == PARTIAL, message
    line = source.splitlines().index("    raise NotImplementedError(\"p3: write data_parallel_step\")") + 1
    assert "data_parallel_step" in result.error and f"line {line}" in result.error, message


def test_the_untouched_stub_is_not_attempted(tmp_path):
    result, message = grade(tmp_path, "p4", stub(solution("p4"), "p4_tensor_parallel.py"))
    assert result.status == NOT_ATTEMPTED, message


def test_a_handed_out_program_is_not_attempted_until_its_line_goes(tmp_path):
    """Part IV hands out a broken program behind one `raise NotImplementedError(...)` line: as generated, and
    with the program below it edited while the line stays, it has not run (not attempted, no flight recorder
    note); with code put above the line, it is partial and says to delete the line."""
    source = stub(solution("p20"), "p20_hang.py")
    result, message = grade(tmp_path, "p20", source)
    assert result.status == NOT_ATTEMPTED and "delete this line" in result.error, message
    edited = source.replace("    world = dist.get_world_size()\n", "    world = 4\n", 1)
    assert edited != source
    result, message = grade(tmp_path, "p20", edited)
    assert result.status == NOT_ATTEMPTED, message
    line = next(x for x in source.splitlines() if "delete this line to run it" in x)
    above = source.replace(line, "    layers = list(layers)\n" + line)
    result, message = grade(tmp_path, "p20", above)
    assert result.status == PARTIAL and "delete that line" in result.error, message
    assert "flight recorder" not in result.error, message


def test_a_not_implemented_error_of_the_answers_own_is_an_error(tmp_path):
    source = P3_IMPORTS + '''
def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    raise NotImplementedError("I will do the sparse case later")
'''
    result, message = grade(tmp_path, "p3", source)
    assert result.status == ERROR and "sparse case" in result.error, message


def test_partial_counts_as_not_passing_on_the_command_line(tmp_path, capsys):
    write(tmp_path, "p3", P3_RIGHT.replace("                w -= lr * w.grad",
                                           "                w -= lr * w.grad\n    raise NotImplementedError('p3: write data_parallel_step')"))
    assert cli.main(["check", str(tmp_path), "-p", "p3", "--seed", "1"]) == 1
    out = capsys.readouterr().out
    assert "PARTIAL" in out and "1 partial" in out


# ---- tampering


def test_an_honest_answer_is_not_flagged(tmp_path):
    result, message = grade(tmp_path, "p3", P3_RIGHT)
    assert result.status == PASS, message


# Each cheat names its modules with computed strings, as a determined cheat would, so that the static scans (for
# internals and for modules off the list, tested below and in test_allowed_modules.py) do not see it and the
# fingerprint has to: it reaches `__import__` through a builtin's `__self__`, never by name.
IMP = "getattr(print.__self__, '__imp' + 'ort__')"
GRADER = f"{IMP}('importlib'.replace('lib', 'lib')).import_module('grad' + 'er.core.compare')"
@pytest.mark.parametrize("cheat, what", [
    (f"c = {GRADER}\nc.REL_TOL = 1e9\n", "grader.core.compare.REL_TOL"),
    (f"c = {GRADER}\nsetattr(c.values_check, '__co' + 'de__', getattr(lambda *a, **k: None, '__co' + 'de__'))\n",
     "grader.core.compare.values_check"),
    (f"sys = {IMP}('sys')\ns = sys.modules['grad' + 'er.specs.p3_data_parallel']\ns.SPEC.check = lambda obs, ref, inputs: []\n",
     "SPEC.check"),
    ("import torch\ntorch.allclose = lambda *a, **k: True\n", "torch.allclose"),
    ("import torch\ntorch.Tensor.__sub__ = lambda a, b: a * 0\n", "torch.Tensor.__sub__"),
    ("builtins = print.__self__\nbuiltins.max = lambda *a, **k: 0\n", "builtins.max"),
    (f"sys = {IMP}('sys')\nk = sys.modules['puzzles.sim' + 'ulator.cost']\nk.CostModel.compute_ticks = lambda self, c, d=None: 0\n",
     "CostModel.compute_ticks"),
    (f"sys = {IMP}('sys')\nk = sys.modules['puzzles.sim' + 'ulator.op_costs']\n"
     "getattr(k, '_RU' + 'LES')[torch.ops.aten.mm.default] = k.FREE\n",  # matmuls made free
     "op_costs._RULES"),
    (f"sys = {IMP}('sys')\nk = sys.modules['puzzles.sim' + 'ulator.op_costs']\n"
     "getattr(k, '_RU' + 'LES')[torch.ops.aten.cholesky_solve.default] = (False, 'none', 'memory')\n",
     "op_costs._RULES"),
    ("from torch.utils import flop_counter\ngetattr(flop_counter, 'flop_' + 'registry').clear()\n", "flop_registry"),
    # a class Python marks immutable keeps its Python functions watched (the fingerprint skips only its other
    # members, which no assignment can change): torch.DoubleTensor's storage() with another's code
    ("import torch\nf = vars(torch.DoubleTensor)['storage']\n"
     "setattr(f, '__co' + 'de__', getattr(lambda self: None, '__co' + 'de__'))\n", "storage was changed"),
    # torch's names rebound to torch's own objects, or torch's own functions changed inside: not torch's doing
    ("import torch\ntorch.float64 = torch.float32\n", "torch.float64 was rebound"),
    ("import torch\ntorch.nn.functional.mse_loss = torch.nn.functional.l1_loss\n", "mse_loss was rebound"),
    ("import torch\nF = torch.nn.functional\nsetattr(F.mse_loss, '__co' + 'de__', getattr(F.l1_loss, '__co' + 'de__'))\n",
     "mse_loss was modified in place"),
    # a torch class may note a flag in itself (checkpoint's DefaultDeviceType does), not have a method swapped
    ("import torch.utils.checkpoint as c\nc.DefaultDeviceType.get_device_type = staticmethod(lambda: 'cpu')\n",
     "DefaultDeviceType.get_device_type was changed"),
])
def test_modifying_the_grader_simulator_or_torch_is_tampering(tmp_path, cheat, what):
    # The cheat runs inside the learner's step (a cheat at import time is caught the same way).
    source = P3_IMPORTS + "\n\ndef data_parallel_step(dist, x_shard, target_shard, layers, lr):\n" + \
        textwrap.indent(cheat, "    ") + "    pass\n"
    result, message = grade(tmp_path, "p3", source)
    assert result.status == TAMPERED, message
    assert what in result.error, message
    # and the grader undid the change: the honest answer graded next passes
    again, message = grade(tmp_path, "p3", P3_RIGHT)
    assert again.status == PASS, message


# What an answer can change without rebinding anything the grader's modules hold: hooks that watch every call,
# modes left entered, torch's switches, the dispatcher's kernels, and the standard library a record leaves through.
# Each cheat runs at import (so the grader's own thread, which grades next, is the one affected) and turns p3's
# summed-not-averaged gradients (a wrong answer) into a pass if it goes unnoticed; names are computed, as a
# determined cheat's would be, so that the static scan does not see them.
P3_WRONG = P3_RIGHT.replace("op=dist.ReduceOp.AVG", "op=dist.ReduceOp.SUM")
HIDDEN_CHEATS = {
    "sys.setprofile": f"sys = {IMP}('sys')\ngetattr(sys, 'set' + 'profile')(lambda *a: None)\n",
    "sys.settrace": f"sys = {IMP}('sys')\ngetattr(sys, 'set' + 'trace')(lambda *a: None)\n",
    "threading.setprofile": "import threading\nthreading.setprofile(lambda *a: None)\n",
    "os.write": f"os = {IMP}('os')\n_w = os.write\nos.write = lambda fd, data: _w(fd, data)\n",
    "json.dumps": f"json = {IMP}('json')\n_d = json.dumps\njson.dumps = lambda *a, **k: _d(*a, **k)\n",
    "JSONEncoder.iterencode": f"e = {IMP}('json.encoder', fromlist=['e'])\n_i = e.JSONEncoder.iterencode\n"
                              "e.JSONEncoder.iterencode = lambda self, o, _one_shot=False: _i(self, o)\n",
    "function modes entered": "import torch\nfrom torch.overrides import TorchFunctionMode\n\n\n"
                              "class Zero(TorchFunctionMode):\n"
                              "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
                              "        out = func(*args, **(kwargs or {}))\n"
                              "        return out * 0 if getattr(func, '__name__', '') == 'max' else out\n\n\n"
                              "Zero().__enter__()\n",
    "grad mode": "import torch\ntorch.set_grad_enabled(False)\n",
    "default dtype": "import torch\ntorch.set_default_dtype(torch.float64)\n",
    "aten::max: a CPU kernel": "import torch\n_lib = torch.library.Library('aten', 'IMPL')\n"
                               "_lib.impl('max', lambda t: torch.zeros((), dtype=t.dtype), 'CPU')\n",
}


@pytest.mark.parametrize("what", list(HIDDEN_CHEATS))
def test_changing_the_process_without_rebinding_the_grader_is_tampering(tmp_path, what):
    cheat = HIDDEN_CHEATS[what]
    if what == "grad mode":  # (the step needs gradients: it switches them on for itself)
        body = P3_WRONG.split(P3_IMPORTS)[1].replace("lr):\n", "lr):\n    torch.set_grad_enabled(True)\n", 1)
    else:
        body = P3_WRONG.split(P3_IMPORTS)[1]
    result, message = grade(tmp_path, "p3", P3_IMPORTS + cheat + body)
    assert result.status == TAMPERED, message
    assert what in result.error, message
    # and the grader put the process back: the same wrong answer, graded next without the cheat, fails
    again, message = grade(tmp_path, "p3", P3_WRONG)
    assert again.status == FAIL, message
    from grader.backends import process_state

    assert process_state.hooks() == (None, None, None, None) or sys_trace_of_a_coverage_tool()
    assert torch.tensor([1.0, 5.0]).max().item() == 5.0 and torch.is_grad_enabled()


def sys_trace_of_a_coverage_tool() -> bool:
    import sys

    return sys.gettrace() is not None and "coverage" in type(sys.gettrace()).__module__


def test_a_rank_that_installs_a_hook_in_its_own_thread_is_refused(tmp_path):
    """A rank's thread runs the simulator's and the spec's code after the learner's: a hook installed there would
    see (and could change) what they measure. The rank's rules refuse it where it is set (allowed.py)."""
    body = P3_WRONG.split(P3_IMPORTS)[1].replace(
        "lr):\n", f"lr):\n    getattr({IMP}('sys'), 'set' + 'profile')(lambda *a: None)\n", 1)
    result, message = grade(tmp_path, "p3", P3_IMPORTS + body)
    assert result.status == "error" and "rank 0 took sys.setprofile" in result.error, message


# What sim.current_ledger() hands a rank is a read-only view of its ledger's figures, no lever on the ledger: each
# cheat, put into GPipe's order for p6 (which fails its memory budget), fails on the view itself. The last one
# forges a consistent ledger (a peak under the budget, a timeline that agrees with it), which the ledger's own audit
# could not tell from an honest one: it passed p6's memory check when the ledger itself was handed out.
GPIPE = (Path(__file__).parent / "naive" / "p6_one_f_one_b.py").read_text()
FORGED = ("led = sim.current_ledger()\n"
          "    led.timeline[:] = [(t, min(b, max(400_000, led.current))) for t, b in led.timeline]\n"
          "    led.peak = max(b for _, b in led.timeline)")


@pytest.mark.parametrize("cheat, outcome", [
    ("sim.current_ledger().peak = 0", "its peak cannot be written"),
    ("led = sim.current_ledger()\n    led.current = led.peak = led.peak_tick = 0", "its current cannot be written"),
    ("led = sim.current_ledger()\n    [led.free(k) for k in range(3)]", "no attribute 'free'"),
    ("sim.current_ledger().close()", "no attribute 'close'"),
    ("getattr(sim.current_ledger(), '_li' + 've').clear()", "no attribute '_live'"),
    (FORGED, "does not support item assignment"),  # (the timeline it reads is a copy, a tuple)
])
def test_a_rank_holds_a_copy_of_its_ledger_not_a_lever(tmp_path, cheat, outcome):
    source = GPIPE.replace("import torch\n", "import torch\nfrom puzzles import sim\n", 1).replace(
        "    return torch.cat(input_grads)", f"    {cheat}\n    return torch.cat(input_grads)")
    result, message = grade(tmp_path, "p6", source, seed=7)
    assert result.status == ERROR and outcome in result.error, message


def test_the_view_of_the_ledger_reads_its_figures_as_they_are(tmp_path):
    def fn(dist):
        ledger = sim.current_ledger()
        start = ledger.current
        x = torch.zeros(1000, dtype=torch.float64)
        return start, ledger.current, ledger.peak, len(ledger.timeline), ledger.live_by_line(), x.sum().item()

    (start, end, peak, length, live, _), *_ = sim.run(fn, 2).results
    assert end - start == 8000 and peak >= end and length >= 2
    assert any(nbytes == 8000 and "torch.zeros(1000" in site for site, nbytes, _ in live), live
    assert sim.current_ledger() is None  # outside a rank


def test_reloading_what_p1_takes_away_is_tampering(tmp_path):
    source = solved("p1")
    source = source.replace("import torch\n", "import torch\nimport torch.utils.checkpoint\n"
                                              f"{IMP}('imp' + 'ortlib').reload(torch.utils.checkpoint)\n", 1)
    result, message = grade(tmp_path, "p1", source)
    assert result.status == TAMPERED, message
    assert "torch.utils.checkpoint" in result.error, message


def test_the_grader_itself_is_unharmed_after_a_tampered_run(tmp_path):
    grade(tmp_path, "p3", P3_IMPORTS + "torch.allclose = lambda *a, **k: True\n" + P3_RIGHT.split(P3_IMPORTS)[1])
    assert torch.allclose(torch.zeros(1), torch.ones(1)) is False  # the grader put torch back


@pytest.mark.parametrize("cheat, what", [
    ("import grader.core.compare as c\nc.REL_TOL = 1e9\n", "imports grader.core.compare"),
    ("from torch.utils._python_dispatch import _disable_current_modes\n", "torch.utils._python_dispatch"),
    ("import gc\nx = [o for o in gc.get_objects()]\n", "imports gc"),
    ("import torch\nfrom puzzles import sim\nsim.current_ledger()._live.clear()\n", "._live"),
])
def test_reaching_into_internals_is_not_graded(tmp_path, cheat, what):
    source = P3_IMPORTS + "\n\ndef data_parallel_step(dist, x_shard, target_shard, layers, lr):\n" + \
        textwrap.indent(cheat, "    ") + "    pass\n"
    result, message = grade(tmp_path, "p3", source)
    assert result.status == TAMPERED and what in result.error and "internals" in result.error, message
    token = what.split()[-1].lstrip(".")
    line = next(i for i, text in enumerate(source.splitlines(), 1) if token in text)
    assert f"line {line}:" in result.error, message


def test_the_scan_spares_every_reference_naive_and_wrong_answer():
    from grader.backends.tamper import internals_used

    files = [*(REPO / "solutions").glob("p*.py"), *(REPO / "tests" / "naive").glob("p*.py"),
             *(REPO / "tests" / "wrong").glob("p*.py"), *(REPO / "puzzles").glob("p*.py")]
    honest = [f for f in files if 'EXPECTED_STATUS = "tampered"' not in f.read_text()]  # the cheats are meant to be
    flagged = {f.name: internals_used(f.read_text()) for f in honest if internals_used(f.read_text())}
    assert not flagged, flagged
    assert len(honest) < len(files)  # the cheats that are meant to reach in were set aside, not missed


# ---- memory hidden from the ledger


CONVERSIONS = {
    "numpy": lambda t: t.numpy().copy(),
    "list": lambda t: t.tolist(),
    "bytes": lambda t: bytes(t.untyped_storage()),
    "pickle": lambda t: __import__("pickle").dumps(t),
    "numbers one by one": lambda t: [float(v) for v in t.reshape(-1)],
}


@pytest.mark.parametrize("conversion", list(CONVERSIONS))
def test_tensors_turned_into_python_data_inside_a_rank_are_refused(conversion):
    def rank(dist):
        t = torch.randn(256, 32, dtype=torch.float64)
        return CONVERSIONS[conversion](t)

    with pytest.raises(sim.HiddenMemoryError) as info:
        sim.run(rank, world_size=2)
    message = str(info.value)
    assert "ledger" in message and "test_integrity.py" in message, message


def test_small_conversions_are_fine():
    def rank(dist):
        counts = torch.tensor([3, 1, 4, 1], dtype=torch.int64)
        loss = torch.randn(8, dtype=torch.float64).sum()
        return counts.tolist(), loss.item(), counts.numpy().sum()

    result = sim.run(rank, world_size=2)
    assert result.results[0][0] == [3, 1, 4, 1]
    assert torch.tensor([1.0]).numpy().tolist() == [1.0]  # outside a rank, nothing is refused


def test_hidden_memory_in_a_puzzle_is_an_error_that_says_why(tmp_path):
    source = solved("p1")
    source = source.replace("saved.append(x)", "saved.append(x.numpy().copy())").replace(
        "start = saved[s].detach()", "start = torch.from_numpy(saved[s]).detach()")
    result, message = grade(tmp_path, "p1", source)
    assert result.status == ERROR, message
    assert "HiddenMemoryError" in result.error and "numpy" in result.error, message


# ---- the grader's own failures


def test_a_check_that_crashes_is_a_grader_error(monkeypatch, tmp_path):
    spec = SPECS["p3"]
    path = write(tmp_path, "p3", P3_RIGHT)

    def broken(obs, ref, inputs):
        raise KeyError("layers")

    monkeypatch.setattr(spec, "check", broken)
    result = grade_file(spec, path, 3)
    assert result.status == GRADER_ERROR, report.pytest_message(result, 3)
    assert "not your answer" in result.error and "KeyError" in result.error


def test_a_diagnosis_that_crashes_leaves_the_check_failed_without_a_cause(monkeypatch, tmp_path):
    spec = SPECS["p3"]
    path = write(tmp_path, "p3", P3_RIGHT.replace("op=dist.ReduceOp.AVG", "op=dist.ReduceOp.SUM"))

    def broken(*args):
        raise StopIteration

    monkeypatch.setattr(type(spec), "diagnose", broken)
    result = grade_file(spec, path, 3)
    assert result.status == FAIL, report.pytest_message(result, 3)
    [weights] = [c for c in result.checks if c.name == "updated weights"]
    assert not weights.passed and "could not work out" in weights.diagnosis


def test_every_status_renders():
    from grader.core.result import STATUSES, PuzzleResult

    results = [PuzzleResult("p3", "data_parallel", "Data parallel", s, error=f"why {s}") for s in STATUSES]
    text = report.console(results, "x", 1)
    for s in STATUSES:
        assert report.BADGES[s] in text
    assert all(report.to_html(r, 1) for r in results)


@pytest.mark.parametrize("when", ["at import", "inside the step"])
def test_tampering_is_caught_on_real_processes_too(tmp_path, when):
    """At import the grader's own process sees it (it loads the file to report import errors); inside the step,
    each rank's process does."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    from grader.backends import real

    cheat = f"c = {GRADER}\nc.REL_TOL = 1e9\n"
    body = P3_RIGHT.split(P3_IMPORTS)[1].replace("op=dist.ReduceOp.AVG", "op=dist.ReduceOp.SUM")
    if when == "at import":
        source = P3_IMPORTS + cheat + body
    else:
        source = P3_IMPORTS + body.replace("lr):\n", "lr):\n" + textwrap.indent(cheat, "    "), 1)
    write(tmp_path, "p3", source)
    [result] = real.grade_folder(tmp_path, [SPECS["p3"]], seed=3, timeout=60)
    assert result.status == TAMPERED, report.pytest_message(result, 3)
    assert "grader.core.compare.REL_TOL" in result.error
    import grader.core.compare

    assert grader.core.compare.REL_TOL == 1e-8  # this process is sound again


def test_the_mutants_grader_mutate_found_now_fail(tmp_path):
    """Two wrong answers `grader mutate` found passing, both divergences from gloo: a p2 buffer made a leaf before
    it is gathered into (gloo: autograd refuses the in-place copy), and an empty batch_isend_irecv in p6."""
    source = solved("p2").replace("        dist.all_gather_into_tensor(full, shard)\n        start = full.requires_grad_()",
                                  "        start = full.requires_grad_()\n        dist.all_gather_into_tensor(full, shard)")
    result, message = grade(tmp_path, "p2", source)
    assert result.status == ERROR and "AutogradWriteError" in result.error, message
    source = solved("p6").replace("        if ops:\n", "        if True:\n")
    result, message = grade(tmp_path, "p6", source)
    assert result.status == ERROR and "batch_isend_irecv with an empty list" in result.error, message


def test_a_rank_that_returns_an_object_is_an_error_and_runs_no_code_in_the_grader(tmp_path):
    """The real backend's parent loads each rank's report with weights_only=True only: a rank's result is the
    learner's data, and a full unpickle would run whatever code it names in the grader's own process."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    from grader.backends import real

    marker = tmp_path / "ran-in-the-grader"
    write(tmp_path, "p3", P3_IMPORTS + f'''

class Trap:
    def __reduce__(self):
        return ({IMP}("pathlib").Path.touch, ({IMP}("pathlib").Path({str(marker)!r}),))


def data_parallel_step(dist, x_shard, target_shard, layers, lr):
    layers.append(Trap())
''')
    [result] = real.grade_folder(tmp_path, [SPECS["p3"]], seed=3, timeout=60)
    assert result.status == ERROR and "will not load" in result.error, report.pytest_message(result, 3)
    assert not marker.exists()


def test_torchs_own_lazy_kernels_are_not_tampering():
    # torch.vmap's first call makes torch register batching kernels of its own (torch/_functorch/predispatch.py):
    # an answer, or an earlier test in the same process, that uses vmap once made every later run "tampered".
    # A fresh interpreter, so that vmap has not run yet.
    code = ("import torch\n"
            "from grader.backends import process_state as ps\n"
            "before = ps.kernels(force=True)\n"
            "torch.vmap(lambda x: x.sum())(torch.ones(3, 4))\n"
            "now = ps.kernels(force=True)\n"
            "assert now != before, 'vmap registered nothing: the test no longer tests'\n"
            "print(ps.kernel_changes(before, now))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
