"""p16 (interleaved 1F1B) and p17 (zero bubble, ZB-H1): their figures against the formulas, at the graded sizes and
at others, run on the simulator with the references themselves (and with puzzle 6's 1F1B beside them).

    python bench/bench_pipelines_part_three.py

1. p16: for p = 4, m in {4, 8, 16} and v in {1, 2, 4} (one block a stage, v·p stages): the makespan less the
   last rank's work, over that work, against (p-1)/(v·m); rank 0's chunk activations before its first backward
   against v·p + p - 1 (Megatron-LM's warm-up and one); every rank's bytes sent against one message per chunk boundary each way.
2. p17: for p = 4 and m in {4, 8, 16}: the last stage's idle ticks against (p-1)·max(F, B, F + B - W), and 1F1B's
   against (p-1)·(F + BW); the makespans; the same with the WeightGradStore split (tests/alternatives).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.backends.learner_code import load_module  # noqa: E402
from grader.core.rules import sent  # noqa: E402
from grader.core.spec import Observation  # noqa: E402
from grader.frontends.targets import REPO  # noqa: E402
from grader.specs.common.costs import block_costs, loss_costs  # noqa: E402
from grader.specs.common.pipeline_values import COST  # noqa: E402
from grader.specs.p17_zero_bubble.costs import split_costs  # noqa: E402
from puzzles import sim  # noqa: E402
from puzzles.model import init_layers, make_batch  # noqa: E402

P, MB, D, H = 4, 8, 64, 256
INTERLEAVED = load_module(REPO / "solutions" / "p16_interleaved.py").interleaved_step
ZERO_BUBBLE = load_module(REPO / "solutions" / "p17_zero_bubble.py").zero_bubble_step
ONE_F_ONE_B = load_module(REPO / "solutions" / "p6_one_f_one_b.py").one_f_one_b_step
STORE = load_module(REPO / "tests" / "alternatives" / "p17_weight_gradient_store.py").zero_bubble_step


def run(step, layers_of, m: int, n_layers: int) -> Observation:
    """`step` on p ranks, the batch m microbatches of MB rows; rank r gets layers_of(layers, r)."""
    layers = init_layers(n_layers, D, H, 1)
    x, target = make_batch(m * MB, D, 0)

    def program(dist, mine, x, target):
        for w in _weights(mine):
            w.grad = torch.zeros_like(w)
        return step(dist, mine, x, target, m, (MB, D))

    rank_args = [(layers_of(layers, r), x if r == 0 else None, target if r == P - 1 else None) for r in range(P)]
    from puzzles import model  # the model's lines are the library's; this file's (the zeroed .grad) the harness's
    return Observation.from_sim(sim.run(program, P, cost=COST, rank_args=rank_args, library_files=[model.__file__],
                                        harness_files=[__file__]))


def _weights(mine):
    flat = []
    for item in mine:
        flat.extend(_weights(item) if isinstance(item, list) else item)
    return flat


def interleaved() -> None:
    print("## 1. p16: interleaved 1F1B (one block a stage, v·p stages on p = 4 ranks)")
    f, b = block_costs(MB, D, H, COST, input_grad=True, accumulate=True)
    print(f"  F/v = {f.ticks:,}, BW/v = {b.ticks:,} ticks a chunk; the messages 1 tick")
    print(f"  {'v':>2} {'m':>3} {'makespan':>9} {'W (last)':>9} {'(mk-W)/W':>9} {'(p-1)/(v·m)':>12} "
          f"{'held r0':>8} {'v·p+p-1':>8} {'bytes r0..r3':>32} {'formula':>32} {'cat':>5}")
    # cat: the returned gradients' copies, the last rank's busy beyond W
    for v in (1, 2, 4):
        for m in (4, 8, 16):
            if m < P:
                continue
            obs = run(INTERLEAVED, lambda layers, r, v=v: [[layers[c * P + r]] for c in range(v)], m, v * P)
            lf, lb = loss_costs(MB, D, COST, divide_by=m)  # each microbatch's loss is divided by m
            work = m * v * (f + b).ticks + m * (lf + lb).ticks
            last = obs.busy_ticks(P - 1)
            seq_held = _held_before_first_backward(obs, f.flops)
            bytes_ = [sum(n for _, n in sent(obs, r).values()) for r in range(P)]
            formula = [((v * m - (m if r == P - 1 else 0)) + (v * m - (m if r == 0 else 0))) * MB * D * 8
                       for r in range(P)]
            print(f"  {v:>2} {m:>3} {obs.makespan:>9,} {work:>9,} {(obs.makespan - work) / work:>9.2%} "
                  f"{(P - 1) / (v * m):>12.2%} {seq_held:>8} {min(v * P + P - 1, v * m):>8} "
                  f"{' / '.join(f'{n:,}' for n in bytes_):>32} {' / '.join(f'{n:,}' for n in formula):>32}"
                  f" {last - work:>5}")


def _held_before_first_backward(obs: Observation, forward_flops: int) -> int:
    first = min(e["start"] for e in obs.events_of(0, "compute", "backward"))
    done = sum(e["flops"] for e in obs.events_of(0, "compute", "forward") if e["end"] <= first)
    return -(-done // forward_flops)


def zero_bubble() -> None:
    print("## 2. p17: zero bubble (ZB-H1) against 1F1B, p = 4 ranks of 2 blocks")
    (f, b, w), bw = split_costs(False), block_costs(MB, D, H, COST, input_grad=True, accumulate=True)[1] * 2
    zb = (P - 1) * max(f.ticks, b.ticks, f.ticks + b.ticks - w.ticks)
    print(f"  F = {f.ticks:,}, B = {b.ticks:,}, W = {w.ticks:,}, BW = {bw.ticks:,} ticks; "
          f"(p-1)·max(F, B, F + B - W) = {zb:,}; (p-1)·(F + BW) = {(P - 1) * (f + bw).ticks:,}")
    print(f"  {'m':>3} {'answer':<24} {'makespan':>9} {'last busy':>10} {'last idle':>10} {'formula':>8} "
          f"{'idle share':>11}")
    for m in (4, 8, 16):
        for name, step, formula in (("1F1B (p6)", ONE_F_ONE_B, (P - 1) * (f + bw).ticks),
                                    ("ZB-H1 (p17)", ZERO_BUBBLE, zb), ("ZB-H1, WeightGradStore", STORE, None)):
            obs = run(step, lambda layers, r: layers[2 * r:2 * r + 2], m, 2 * P)
            busy = obs.busy_ticks(P - 1)
            idle = obs.makespan - busy
            print(f"  {m:>3} {name:<24} {obs.makespan:>9,} {busy:>10,} {idle:>10,} "
                  f"{formula if formula is not None else '':>8} {idle / obs.makespan:>11.1%}")


if __name__ == "__main__":
    interleaved()
    print()
    zero_bubble()
