"""p1 takes torch.utils.checkpoint away while it grades: the refusal explains itself, reaches references bound
before grading (a notebook cell that imported `checkpoint` earlier), and everything is restored afterwards."""

from pathlib import Path

import torch.utils.checkpoint as torch_checkpoint

from grader.backends.simulator import grade_file, grade_module
from grader.core.result import ERROR
from grader.specs import SPECS

WRONG = Path(__file__).parent / "wrong" / "p1_uses_torch_checkpoint.py"


def test_torch_checkpoint_is_restored_after_grading():
    before = (torch_checkpoint.checkpoint, torch_checkpoint.checkpoint_sequential,
              torch_checkpoint.CheckpointFunction)
    result = grade_file(SPECS["p1"], WRONG, seed=0)
    assert result.status == ERROR
    assert (torch_checkpoint.checkpoint, torch_checkpoint.checkpoint_sequential,
            torch_checkpoint.CheckpointFunction) == before


def test_a_checkpoint_bound_before_grading_is_refused_too():
    source = WRONG.read_text().replace("torch.utils.checkpoint.checkpoint(", "early_checkpoint(")
    source = source.replace("import torch.utils.checkpoint\n",
                            "import torch.utils.checkpoint\nfrom torch.utils.checkpoint import checkpoint as "
                            "early_checkpoint\n")
    namespace = {}
    exec(compile(source, "notebook_cell", "exec"), namespace)  # bound outside the run context, as in a notebook
    assert namespace["early_checkpoint"] is torch_checkpoint.checkpoint
    module = type(torch_checkpoint)("notebook_p1")
    module.__dict__.update(namespace)
    spec = SPECS["p1"]
    with spec.run_context():
        result = grade_module(spec, module, seed=0)
    assert result.status == ERROR
    assert "the puzzle is to write activation checkpointing by hand" in result.error
