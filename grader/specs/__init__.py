"""The puzzles' specs: one module per puzzle, each defining `SPEC` (a core.spec.PuzzleSpec).

    p1_checkpointing.py ... p15_*.py     inputs from a seed, the serial reference, what each rank runs, the
                                         budgets (formulas with their numbers) and the checks with their diagnoses
    pipeline.py, pipeline_values.py      what p5 and p6 share: the stages, their checks, the value diagnosis
    tensor_parallel_mistakes.py          p4's sizes, and the common mistakes replayed to name a wrong answer
    checkpoint_taken_away.py             torch.utils.checkpoint switched off while p1 and p2 are graded
    mixed_precision_serial.py            p9's sizes, inputs, torch's Adam + GradScaler's logic as the (forced)
                                         reference, the mistakes replayed, the comparison at a measured tolerance
    optimizer_state.py                   p8, p9: every tensor an optimizer object keeps, found whatever its style
    gathered_weights.py                  p10: the watch that notes, at each collective, the gathered buffers
                                         alive and the bytes held
    three_d_layout.py, three_d_groups.py p11's rank layout, sizes and serial pieces; its process-group rules
    expert_routing.py                    p12's sizes, the routing built into every seed, the serial mixture of
                                         experts and the common mistakes replayed on it
    interleaved_layout.py                p16's 8 one-block stages on 4 ranks (2 chunks each), the interleaved
                                         order, the serial step cut at every stage, the value diagnoses
    zero_bubble_costs.py                 p17's F, B and W as a learner splits the backward, and ZB-H1's bubble
    sub_world.py                         p13: the `dist` of a world of its own made of some of the ranks (4 of 8)
    all_reduce_runs.py                   p13's network, its eight runs and their formulas; one run's messages,
                                         time and memory read out of the whole record
    all_reduce_mistakes.py               p13: which ranks' parts a wrong chunk holds, what a run's messages were
    ring_attention_serial.py             p15's sizes, its inputs made chunk by chunk, the serial causal attention
                                         read off at each rank's tokens, the common mistakes replayed on it
    ring_attention_costs.py              p15's compute formulas and a rank's share measured on the clock
    ring_attention_checks.py             p15's checks of compute, balance, bytes per phase and exposed messages,
                                         and the wrong values named; ring_attention_memory.py its memory rules
    received_blocks.py                   p15: the watch that notes, at each message, the other ranks' data alive
    clipping_layout.py                   p19's sizes, layout, faults and the serial truth (clip_grad_norm_ and
                                         torch.optim.Adam), the mistakes of the update and of the norm replayed
    clipping_harness.py                  p19's harness on the rank: the groups, the pair's forward, the faults,
                                         the steps and what they record
    clipping_diagnoses.py                p19's likely causes: a wrong norm by value, a wrong update by replay, a
                                         step not skipped alike by who changed what

A spec sees the learner's code only through `program` (run on the ranks by a backend) and grades plain data
(an Observation). Specs import core/ and puzzles/ only. Adding a puzzle is adding a module here and a solution.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

from ..core.spec import PuzzleSpec


def _discover() -> dict[str, PuzzleSpec]:
    specs = []
    for info in pkgutil.iter_modules(__path__):
        if re.match(r"p\d+_", info.name):  # pN_name.py; helpers shared by several puzzles have other names
            specs.append(importlib.import_module(f"{__name__}.{info.name}").SPEC)
    specs.sort(key=lambda s: (int(re.match(r"p(\d+)", s.id).group(1)), s.id))
    return {s.id: s for s in specs}


SPECS = _discover()


def select(puzzle_ids=None) -> list[PuzzleSpec]:
    """The specs of `puzzle_ids` (all of them when empty), in the order given."""
    if not puzzle_ids:
        return list(SPECS.values())
    unknown = [p for p in puzzle_ids if p not in SPECS]
    if unknown:
        raise KeyError(f"unknown puzzle(s) {unknown}; known: {list(SPECS)}")
    return [SPECS[p] for p in puzzle_ids]
