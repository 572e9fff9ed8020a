"""Part II's figures against their formulas, and the evidence behind p9's tolerance.

    python bench/bench_part_two.py [--seeds 300]

1. p9, bytes per parameter: what the ledger measures right after the first step, for the reference and every
   correct alternative, against 2 + 2 + 4 + 4 + 4 = 16 bytes per weight (and the activations, measured apart).
2. p10, ZeRO-3: the gathered weights held at every collective (8Ψ/N + 2·W), the bytes sent (3·(N-1)/N·8Ψ,
   1.5 x data parallel's 2·(N-1)/N·8Ψ), the makespan (C + 2·A) and, beside them, the naive answer (ZeRO-2's
   habit: every layer kept) and the no-prefetch answer (C + 12·A).
3. p9, the tolerance: over --seeds seeds, how far correct answers written differently land from torch's
   GradScaler + Adam (the hand-written replay, and each alternative's class run in plain torch), and how close
   each replayed mistake comes (its smallest largest-error over the seeds), both against the reference run on
   its own and against the teacher-forced reference the grader uses. The tolerance must sit between.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.backends.learner_code import load_module  # noqa: E402
from grader.backends.simulator import observe  # noqa: E402
from grader.core.rules import sent  # noqa: E402
from grader.frontends.targets import REPO  # noqa: E402
from grader.specs import SPECS  # noqa: E402
from grader.specs.p9_mixed_precision import serial  # noqa: E402
from grader.specs.p10_fsdp import spec as p10  # noqa: E402
from puzzles.model import forward, loss_fn  # noqa: E402

P9_ANSWERS = [REPO / "solutions" / "p9_mixed_precision.py", *sorted((REPO / "tests" / "alternatives").glob("p9_*.py"))]


def observed(path: Path, pid: str, seed: int = 0):
    spec = SPECS[pid]
    return observe(spec, load_module(path), spec.make_inputs(seed), seed)


def p9_bytes() -> None:
    print("## 1. p9: parameter bytes right after the first step (seed 0)")
    formula = 16 * serial.PSI
    print(f"  {'answer':<46} {'formula 16·Ψ':>14} {'measured':>10} {'per weight':>11} {'activations':>12}")
    for path in P9_ANSWERS:
        res = observed(path, "p9").results[0]
        print(f"  {path.stem:<46} {formula:>14,} {res['parameter_bytes']:>10,} "
              f"{res['parameter_bytes'] / serial.PSI:>11.3f} {res['activation_bytes']:>12,}")


def plain_run(cls, inputs) -> list:
    """The grader's loop for p9, in plain torch (no simulator): the master weights after each step."""
    layers = [(w1.clone(), w2.clone()) for w1, w2 in inputs["layers"]]
    opt = cls(layers, serial.LR, serial.BETAS, serial.EPS, serial.INIT_SCALE, serial.GROWTH_INTERVAL)
    out = []
    for x, target in zip(inputs["xs"], inputs["targets"]):
        opt.scale(loss_fn(forward(x, opt.half_layers).float(), target)).backward()
        opt.step()
        out.append([(w1.clone(), w2.clone()) for w1, w2 in layers])
        for pair in opt.half_layers:
            for w in pair:
                w.grad = None
    return out


def largest(a_steps, b_steps) -> float:
    return max((x.double() - y.double()).abs().max().item()
               for a, b in zip(a_steps, b_steps) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def p9_tolerance(seeds: int) -> None:
    print(f"\n## 3. p9: distance from torch's GradScaler + Adam over {seeds} seeds (largest |error| of any master "
          f"weight after any step); tolerance {serial.TOLERANCE:g}")
    print("  free: against the reference run on its own (a float16 rounding flip is carried into later gradients);")
    print("  forced: each step's forward on the answer's own masters, as the grader compares (forced_expectation)")
    classes = {p.stem: load_module(p).MixedPrecisionAdam for p in P9_ANSWERS}
    runs = {"replay (mixed_precision_serial.replay)": lambda inputs: serial.replay(inputs),
            **{name: (lambda inputs, cls=cls: plain_run(cls, inputs)) for name, cls in classes.items()}}
    mistakes = {knobs_name(k): (lambda inputs, k=k: serial.replay(inputs, **k)) for k in serial.MISTAKES.values()}
    free = {name: [] for name in [*runs, *mistakes]}
    forced = {name: [] for name in [*runs, *mistakes]}
    started = time.perf_counter()
    for seed in range(seeds):
        inputs = serial.make_inputs(seed)
        ref = serial.torch_reference(inputs)["weights"]
        for name, run in [*runs.items(), *mistakes.items()]:
            got = run(inputs)
            free[name].append(largest(got, ref))
            forced[name].append(largest(got, serial.forced_expectation(inputs, got)))
    print(f"  {'correct answer':<46} {'free: largest':>14} {'forced: largest':>16} {'forced: median':>15}")
    for name in runs:
        a, b = sorted(free[name]), sorted(forced[name])
        print(f"  {name:<46} {a[-1]:>14.3g} {b[-1]:>16.3g} {b[len(b) // 2]:>15.3g}")
    print(f"  {'mistake (replayed)':<46} {'free: smallest':>14} {'forced: smallest':>16} {'forced: median':>15}")
    for name in mistakes:
        a, b = sorted(free[name]), sorted(forced[name])
        print(f"  {name:<46} {a[0]:>14.3g} {b[0]:>16.3g} {b[len(b) // 2]:>15.3g}")
    print(f"  ({time.perf_counter() - started:.0f} s)")


def knobs_name(knobs: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items())


def p10_figures() -> None:
    print("\n## 2. p10: ZeRO-3 against its formulas (seed 0)")
    dp, zero3 = p10.DATA_PARALLEL_BYTES, p10.ZERO3_BYTES
    print(f"  formulas: held 8Ψ/N + 2·W = {p10.SHARDS + 2 * p10.W:,} B; sent 3·(N-1)/N·8Ψ = {zero3:,} B = "
          f"{zero3 / dp:.2f} x data parallel's 2·(N-1)/N·8Ψ = {dp:,} B; exposed communication 2·A = "
          f"{2 * p10.gather_ticks():,} ticks, makespan C + 2·A = {p10.compute_ticks() + 2 * p10.gather_ticks():,} "
          f"(C = {p10.compute_ticks():,}, A = {p10.gather_ticks()})")
    answers = [("reference", REPO / "solutions" / "p10_fsdp.py"),
               *[(p.stem, p) for p in sorted((REPO / "tests" / "alternatives").glob("p10_*.py"))],
               ("naive (ZeRO-2: every layer kept)", REPO / "tests" / "naive" / "p10_fsdp.py"),
               ("no prefetch (tests/wrong)", REPO / "tests" / "wrong" / "p10_no_prefetch.py")]
    print(f"  {'answer':<40} {'held (max)':>11} {'layers':>7} {'sent':>10} {'x DP':>6} {'makespan':>9}")
    for name, path in answers:
        obs = observed(path, "p10")
        held = max(h["gathered"] for h in obs.results[0]["held"])
        total = sum(b for _, b in sent(obs, 0).values())
        print(f"  {name:<40} {held:>11,} {(held - p10.SHARDS) / p10.W:>7.2f} {total:>10,} {total / dp:>6.2f} "
              f"{obs.makespan:>9,}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=300)
    seeds = parser.parse_args().seeds
    torch.set_num_threads(1)
    print(f"# bench_part_two.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}")
    p9_bytes()
    p10_figures()
    p9_tolerance(seeds)
