"""p5 pipeline parallel (GPipe): p stages, m microbatches, all forwards then all backwards.

Everything is shared with p6 (1F1B) in common/pipeline.py: the stages, the reference, and the checks of the rules both
puzzles state (values, each stage's compute, the bubble read off the makespan). GPipe's order is the puzzle's
lesson, not a rule: any order that meets the budgets passes (puzzle 6's 1F1B does).
"""

from __future__ import annotations

from ..common.pipeline import PipelineSpec


class GPipe(PipelineSpec):
    id, name, title = "p5", "gpipe", "Pipeline parallel (GPipe)"
    entries = ("gpipe_step",)
    hints = ("Scale each microbatch's loss by 1/m: the full-batch loss is their mean.",
             "Every rank must run its backwards in the order the next rank sends the gradients.")


SPEC = GPipe()
