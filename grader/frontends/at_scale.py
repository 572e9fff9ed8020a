"""The notebook's section after Part III: the learner's own puzzle-11 and puzzle-14 answers inside GPT-3 175B's
training step, on meta tensors (grader/predictor/), in about 20 seconds (17 s of CPU on the development machine),
which it says before it starts.

    at_scale(globals())     # in the notebook: the answers are the cells' functions
    at_scale(folder=path)   # a folder of puzzle files

Two runs, each cut to what a notebook cell can wait for:

    3-D   GPT-3 175B whole (96 layers, hidden 12288, 96 heads, 2048 tokens, vocabulary 51200) on 64 A100s of 8
          DGX nodes: 8-way tensor parallelism inside a node, 8 pipeline stages (1F1B), 8 microbatches, no
          recomputation. Your puzzle 11's f and g wrap every product; one simulated rank per stage stands for its
          8 tensor-parallel ranks. The published run (bench/SCALE.md) has 64 microbatches and the interleaved
          schedule: its first stage holds as many microbatches in flight (8), so the memory is the same.
    SP    one pipeline stage of the same model (12 of its 96 layers) with all 8 tensor-parallel ranks simulated,
          sequence parallelism and selective recomputation, microbatch 1: your puzzle 14's operators work on the
          default group, so the run must be one stage and every rank simulated.

Where an answer is not written or fails its check on two ranks, the reference's operators run and the note says
so (grader/predictor/answers.py).
"""

from __future__ import annotations

from pathlib import Path

from ..predictor.answers import learner_ops
from ..predictor.presets import megatron
from ..predictor.runner import Prediction, predict


def three_d_config():
    return megatron("175B", "none").but(virtual=1, global_batch=8)


def sequence_parallel_config():
    return megatron("175B", "seqsel").but(layers=12, pipeline=1, virtual=1, global_batch=1,
                                          simulate_tensor_ranks="all")


def run_at_scale(namespace: dict | None = None, folder: Path | None = None) -> list[tuple[str, Prediction]]:
    """[(title, prediction)] for the 3-D and the sequence-parallel runs, with the learner's operators where they
    run (each prediction's answer_notes say whose operators ran)."""
    out = []
    for title, cfg in (("3-D parallelism (your puzzle 11)", three_d_config()),
                       ("sequence parallelism (your puzzle 14)", sequence_parallel_config())):
        ops, notes = learner_ops(cfg, folder=folder, namespace=namespace)
        out.append((title, predict(cfg, ops=ops, answer_notes=notes)))
    return out


def at_scale(namespace: dict | None = None, folder: Path | None = None, plots: bool = True) -> None:
    """Print each run's report (predict.py's: step time, MFU, memory by kind, time by class) and, in a notebook,
    show the 3-D run's memory and schedule."""
    import torch

    from ..predictor.report import as_result, report

    print("Simulating GPT-3 175B's step twice on meta tensors (3-D, then sequence parallelism): about 20 seconds "
          "...", flush=True)
    try:
        runs = run_at_scale(namespace, folder)
    except Exception as exc:  # torch's meta kernels differ between releases: say so rather than fail the notebook
        print(f"The prediction could not run on this torch ({torch.__version__}): {type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}\nIt is developed on torch 2.13 "
              f"(docs/development.md, 'Which torch').")
        return
    for title, p in runs:
        print(f"==== {title}\n{report(p)}\n")
    if not plots:
        return
    try:
        from IPython.display import Image, display
    except ImportError:
        return
    from . import plots as plots_mod
    from .notebook import compact_png

    result = as_result(runs[0][1])
    for fig in (plots_mod.memory_figure(result), plots_mod.schedule_figure(result)):
        display(Image(data=compact_png(fig), format="png"))
        fig.clear()
