"""Each simulated rank gets its own instance of the learner's module, as each real process imports its own: a
module-level queue, step counter, cache or tensor is per rank. For a file, every rank imports it afresh (in its
own thread, sim.run's make_fn); for the notebook's check cell, whose module has no file, every rank gets a copy of
the notebook's globals (learner_code.namespace_copy_for_rank)."""

import types
from pathlib import Path

import pytest
import torch

from grader.backends.learner_code import load_module, namespace_copy_for_rank
from grader.backends.simulator import grade_file, rank_programs
from grader.core.result import PASS
from grader.specs import SPECS
from puzzles import sim
from puzzles.simulator.memory import AT_IMPORT

REPO = Path(__file__).resolve().parent.parent


def rewrite(tmp_path: Path, puzzle: str, replacements: list[tuple[str, str]]) -> Path:
    """The reference solution of `puzzle` with each `old` replaced by `new` (each must occur)."""
    spec = SPECS[puzzle]
    text = (REPO / "solutions" / spec.filename).read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / spec.filename
    path.write_text(text)
    return path


def test_a_1f1b_with_its_queue_at_module_level_passes(tmp_path):
    path = rewrite(tmp_path, "p6", [
        ("from collections import deque\n", "from collections import deque\n\nheld = deque()  # module level\n"),
        ("    held = deque()  # (i, stage input, stage output)", "    # (i, stage input, stage output)"),
    ])
    result = grade_file(SPECS["p6"], path, seed=3)
    assert result.status == PASS, result.error or [c.message for c in result.failed_checks()]


def test_a_zero_with_a_module_level_step_counter_passes(tmp_path):
    path = rewrite(tmp_path, "p8", [
        ("import torch\n", "import torch\n\nSTEP = 0  # module level: one per process\n"),
        ("        self.t = 0\n", ""),
        ("        self.t += 1\n", "        global STEP\n        STEP += 1\n"),
        ("(1 - beta2 ** self.t)", "(1 - beta2 ** STEP)"),
        ("(1 - beta1 ** self.t)", "(1 - beta1 ** STEP)"),
    ])
    result = grade_file(SPECS["p8"], path, seed=3)
    assert result.status == PASS, result.error or [c.message for c in result.failed_checks()]


class FakeSpec:
    """Just what rank_programs needs: the entry names and how to make the rank function from the module."""

    entries = ("fn",)

    @staticmethod
    def program(module):
        return module.fn


LEARNER = '''
import torch

CACHE = {}
CALLS = 0
W = torch.full((3,), 2.0, dtype=torch.float64)  # a module-level tensor
DRAWN = torch.randn(2)  # module-level random numbers


def fn(dist):
    global CALLS
    CALLS += 1
    CACHE.setdefault("first rank here", dist.get_rank())
    return CACHE["first rank here"], CALLS, (W * (dist.get_rank() + 1)).tolist(), torch.randn(2)
'''


def expected(n):
    streams = sim.run(lambda dist: torch.randn(2), n, seed=4).results
    return [(r, 1, [2.0 * (r + 1)] * 3, streams[r]) for r in range(n)]


def check(results, n):
    for r, (got, want) in enumerate(zip(results, expected(n))):
        assert got[:3] == want[:3], f"rank {r}: {got[:3]} != {want[:3]}"
        assert torch.equal(got[3], want[3]), f"rank {r}: module-level draws moved the rank's random stream"


def test_module_level_state_of_a_file_is_per_rank(tmp_path):
    path = tmp_path / "learner.py"
    path.write_text(LEARNER)
    result = sim.run(None, 4, make_fn=rank_programs(FakeSpec, load_module(path)), seed=4)
    check(result.results, 4)
    for ledger in result.ledgers:  # module-level tensors are the rank's memory, charged from its start
        at_import = {site: nbytes for site, nbytes, *_ in ledger.peak_by_line() if AT_IMPORT in site}
        assert sorted(at_import.values()) == [8, 24], at_import  # DRAWN: float32[2]; W: float64[3]
        assert any("learner.py:7" in site for site in at_import), at_import  # W's line, as the learner wrote it


def test_module_level_state_of_a_notebook_is_per_rank():
    namespace = {"__name__": "__main__"}
    exec(compile(LEARNER, "<notebook cell>", "exec"), namespace)
    module = types.ModuleType("notebook_p0")
    module.__dict__.update({k: v for k, v in namespace.items() if not k.startswith("__")})
    result = sim.run(None, 4, make_fn=rank_programs(FakeSpec, module), seed=4)
    for r, got in enumerate(result.results):
        assert got[:3] == (r, 1, [2.0 * (r + 1)] * 3)
    assert namespace["CACHE"] == {} and namespace["CALLS"] == 0  # the notebook's own globals are untouched


def test_a_notebook_copy_rebinds_functions_and_copies_containers_but_not_modules():
    namespace = {"__name__": "__main__", "torch": torch}
    exec("from collections import deque\nQ = deque([1])\nclass Box:\n    pass\nBOX = Box()\n"
         "def f():\n    return Q\n_i3 = 'history'\n", namespace)
    module = types.ModuleType("nb")
    module.__dict__.update({k: v for k, v in namespace.items() if not k.startswith("__")})
    module.fn = namespace["f"]
    copy = namespace_copy_for_rank(module, ("fn",))
    assert copy.fn() is not namespace["Q"] and list(copy.fn()) == [1]
    assert copy.BOX is not namespace["BOX"] and copy.torch is torch and copy._i3 == "history"


@pytest.mark.parametrize("where", ["file", "notebook"])
def test_a_module_that_fails_to_import_on_a_rank_is_the_rank_s_error(tmp_path, where):
    source = "import torch\nfn = lambda dist: dist.get_rank()\nif __name__ == 'never':\n    pass\n"
    path = tmp_path / "ok.py"
    path.write_text(source)
    module = load_module(path)
    path.write_text("raise RuntimeError('edited since')\n")  # the file changed between the check and the run
    with pytest.raises(Exception) as info:
        sim.run(None, 2, make_fn=rank_programs(FakeSpec, module))
    assert "edited since" in str(info.value)
