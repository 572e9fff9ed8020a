"""`python -m grader predict`: a training step at a published size, simulated on meta tensors, and what it says.

    python -m grader predict --preset megatron-175b-seqsel
    python -m grader predict --layers 96 --hidden 12288 --heads 96 --seq 2048 --vocab 51200 \\
        --tensor 8 --pipeline 8 --virtual 3 --microbatch 1 --global-batch 64 --sequence-parallel \\
        --recompute selective --cluster a100 --trace step.json --plots plots/
    python -m grader predict --preset megatron-175b-full --answer puzzles    # your p11's f and g in it

It prints the step time, the MFU, the memory per GPU by kind (weights, gradients, optimizer state,
activations), the bubble and the time by class of op, against the papers' formulas where they have one; writes
the trace (Chrome trace-event JSON, for Perfetto) and the plots (memory and schedule) when asked.

The predictor itself is grader/predictor/ (its map tells the story: the model, the step on meta tensors, the
devices and links, the report); this module is its command line. With `--answer FOLDER` (or a notebook's globals,
`at_scale`) the learner's puzzle answers take the place of the reference's where they can run at that size
(predictor/answers.py says which, and the report says which ran).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from typing import TYPE_CHECKING

from ..predictor.cluster import CLUSTERS
from ..predictor.config import GRAD_DTYPES, RECOMPUTE, Config, Model, Parallel
from ..predictor.presets import presets

if TYPE_CHECKING:  # the simulation and the report (runner, lines, report) are imported when a prediction runs:
    # they bring torch._dynamo (fast_meta.py), seconds of start-up that `python -m grader --help` and every
    # batch child would otherwise pay
    from ..predictor.runner import Prediction


COST = ("What a prediction costs to compute (bench/SCALE.md measures each preset): a pipeline is simulated as a few "
        "short runs whose step the real one is read off (grader/predictor/lines.py), so every preset takes under a "
        "minute of one CPU core: GPT-3 175B's the most, about 40 s (8 stages of 12 layers, read off its own line "
        "in microbatches); the other pipelines 3-25 s (read off runs of 4 to 9 stages, or their own line); a "
        "single stage a second or two. A run without pipeline parallelism simulates every microbatch; --every-microbatch and "
        "--simulate-tensor-ranks all simulate the whole step (minutes to hours at the presets' sizes).")


def add_predict_parser(sub, command) -> None:
    p = command(sub, "predict", "predict a training step at a published size (Megatron-LM's GPT, or your "
                                "answers' pieces in it) on a cluster of real GPUs: step time, MFU, memory per GPU, "
                                "the bubble, time by op class; the simulator runs it on meta tensors")
    p.description = ("Predict one training step at a published size: Megatron-LM's GPT (tensor, sequence, pipeline "
                     "and data parallelism) or torchtitan's Llama with FSDP, simulated on meta tensors with the "
                     "costs of real GPUs and their network. " + COST)
    p.add_argument("--preset", choices=sorted(presets()), help="a published run (bench/SCALE.md, "
                                                               "grader/predictor/published.py); the options below "
                                                               "change it")
    model = p.add_argument_group("model")
    for name, what in (("layers", "transformer layers"), ("hidden", "hidden size h"), ("heads", "attention heads"),
                       ("seq", "sequence length s"), ("vocab", "vocabulary"), ("ffn", "MLP width (default 4h)")):
        model.add_argument(f"--{name}", type=int, help=what)
    par = p.add_argument_group("parallelism")
    for name, what in (("tensor", "tensor-parallel ranks t"), ("pipeline", "pipeline stages p"),
                       ("data", "data-parallel replicas D (their all-reduce by formula)"),
                       ("virtual", "model chunks per pipeline rank v (> 1: interleaved 1F1B)"),
                       ("microbatch", "microbatch size"), ("global-batch", "global batch (sequences)")):
        par.add_argument(f"--{name}", type=int, help=what)
    par.add_argument("--sequence-parallel", dest="sequence_parallel", action="store_true", default=None,
                     help="sequence parallelism on")
    par.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_false", default=None,
                     help="sequence parallelism off")
    p.add_argument("--recompute", choices=RECOMPUTE, help="activation recomputation (default none)")
    physics = p.add_argument_group("what overlaps, and what the step keeps (defaults: what a user of today's "
                                   "Megatron-LM, PyTorch DDP and FSDP2 gets; the presets set what their runs used)")
    physics.add_argument("--tp-overlap", dest="tp_overlap", action="store_true", default=None,
                         help="a column-parallel product's backward collectives run under its products, as "
                              "Megatron-LM issues them since 2021-09 (default)")
    physics.add_argument("--no-tp-overlap", dest="tp_overlap", action="store_false", default=None,
                         help="each tensor-parallel collective waited for where issued (Megatron-LM before 2021-09)")
    physics.add_argument("--dp-overlap", dest="dp_overlap", action="store_true", default=None,
                         help="the data-parallel all-reduce in 25 MB buckets under the last backward, as PyTorch's "
                              "DDP runs it (default)")
    physics.add_argument("--no-dp-overlap", dest="dp_overlap", action="store_false", default=None,
                         help="one all-reduce of every gradient after the pipeline has drained (Megatron-LM's "
                              "local DDP)")
    physics.add_argument("--grad-dtype", choices=GRAD_DTYPES,
                         help="the gradients kept and all-reduced: float32 (Megatron-LM's main_grad, default) or "
                              "half (the weights' dtype, as Megatron-LM of 2021 kept them)")
    physics.add_argument("--fsdp-overlap", dest="fsdp_overlap", action="store_true", default=None,
                         help="FSDP: the next all-gather prefetched and each reduce-scatter left under the next "
                              "backward, as FSDP2 runs them (default)")
    physics.add_argument("--no-fsdp-overlap", dest="fsdp_overlap", action="store_false", default=None,
                         help="FSDP: each all-gather and reduce-scatter waited for where issued")
    physics.add_argument("--dropout", type=float, metavar="P",
                         help="dropout probability (default 0.1 for the GPT, Megatron-LM's; 0 for the Llama): 0 "
                              "runs no dropout kernels and keeps no masks")
    p.add_argument("--cluster", choices=sorted(CLUSTERS),
                   help="the GPUs and their network (default a100: DGX A100; a100-roofline charges each op the "
                        "larger of its arithmetic and memory time instead of their sum)")
    p.add_argument("--simulate-tensor-ranks", choices=("one", "all"),
                   help="one (default): one rank per stage stands for its tensor-parallel group; all: every GPU "
                        "of a replica is a simulated rank (t times the work)")
    p.add_argument("--answer", metavar="FOLDER", help="a folder of your puzzle files (puzzles/): your p11's f and "
                                                       "g, your p14's sequence-parallel pair, where they can run")
    p.add_argument("--every-microbatch", dest="every_microbatch", action="store_true",
                   help="simulate every stage and all m microbatches; by default a pipeline is simulated as a few "
                        "shorter runs (fewer stages, fewer microbatches) and the step read off the lines through "
                        "them: the same figures, tick for tick (tests/test_scale.py), in a fraction of the time")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("--trace", metavar="FILE.json", help="write the step's timeline as Chrome trace-event JSON")
    p.add_argument("--plots", metavar="DIR", help="write the memory and schedule plots here (PNG)")
    p.set_defaults(func=cmd_predict)


MODEL_FLAGS = ("layers", "hidden", "heads", "seq", "vocab", "ffn")
OWN_FLAGS = ("recompute", "cluster", "simulate_tensor_ranks", "tp_overlap", "dp_overlap", "grad_dtype",
             "fsdp_overlap", "dropout")
PARALLEL_FLAGS = {"tensor": "tensor", "pipeline": "pipeline", "data": "data", "virtual": "virtual",
                  "microbatch": "microbatch", "global_batch": "global_batch"}


def config_from_args(args) -> Config:
    """The configuration the options describe: a preset changed by the options given, or the options alone."""
    base = presets()[args.preset] if args.preset else None
    given = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k, None) is not None}
    if base is None:
        missing = [k for k in ("layers", "hidden", "heads", "seq", "vocab") if k not in given]
        if missing:
            raise ValueError(f"give --preset, or the model: --{', --'.join(missing)}")
        model = Model("a GPT", **given)
        parallel = Parallel(global_batch=1)
        base = Config(model, parallel)
    model = replace(base.model, **given)
    if given:
        model = replace(model, name=f"{base.model.name} (changed)" if args.preset else model.name)
    par = {v: getattr(args, k) for k, v in PARALLEL_FLAGS.items() if getattr(args, k, None) is not None}
    if getattr(args, "sequence_parallel", None) is not None:
        par["sequence_parallel"] = args.sequence_parallel
    parallel = replace(base.parallel, **par)
    own = {k: getattr(args, k) for k in OWN_FLAGS if getattr(args, k, None) is not None}
    return replace(base, model=model, parallel=parallel, **own)


def cmd_predict(args) -> int:
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ops, notes = (None, [])
    if args.answer:
        folder = Path(args.answer)
        if not folder.is_dir():
            print(f"error: --answer {folder}: not a folder", file=sys.stderr)
            return 2
        from ..predictor.answers import learner_ops

        ops, notes = learner_ops(cfg, folder=folder)
    print(f"simulating the step on meta tensors ({cfg.simulated_ranks} rank(s) at its full size; a pipeline as "
          f"the shorter runs listed) ...", file=sys.stderr)
    from ..predictor.lines import predict_by_line
    from ..predictor.report import report, to_dict
    from ..predictor.runner import predict

    what = f"{cfg.model.name} on {cfg.parallel.gpus:,} GPUs"
    with RunProgress(what, enabled=False if args.json else None) as progress:
        prediction = (predict if args.every_microbatch else predict_by_line)(cfg, ops=ops, answer_notes=notes,
                                                                               progress=progress)
    if args.json:
        print(json.dumps(to_dict(prediction, notes), indent=1))
    else:
        print(report(prediction, notes))
    if args.trace:
        from ..predictor.report import as_result
        from .timeline import chrome_trace

        Path(args.trace).parent.mkdir(parents=True, exist_ok=True)
        Path(args.trace).write_text(json.dumps(chrome_trace(as_result(prediction))))
        print(f"wrote {args.trace}: open it at https://ui.perfetto.dev", file=sys.stderr)
    if args.plots:
        for path in write_plots(prediction, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0


class RunProgress:
    """The predictor's progress callback (runner.py's docstring): a line on stderr as each simulated run starts,
    and, for a person at a terminal, a progress line under them (progress.py) with what is being simulated, the
    work done in stages x microbatches (what a run's ops grow with), a bar and the time left; erased when the
    prediction is done. Off a terminal, or with --json, the run lines alone."""

    def __init__(self, what: str, stream=None, enabled: bool | None = None, clock=None):
        from .progress import Progress

        extra = {"clock": clock} if clock is not None else {}
        self.bar = Progress(0, "stage-microbatches simulated", stream if stream is not None else sys.stderr,
                            label=what, enabled=enabled, **extra)

    def __call__(self, run: int, runs: int, what: str, done: int = 0, total: int = 0) -> None:
        if run == 1:  # a new set of runs (a pipeline off its lines in stages starts again in microbatches)
            self.bar.restart(total)
        self.bar.write(f"  run {run} of {runs}: {what}", advance=max(0, done - self.bar.done))

    def close(self) -> None:
        self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_plots(p: Prediction, directory) -> list[Path]:
    from ..predictor.report import as_result
    from . import plots

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    result = as_result(p)
    written = []
    for name, figure in (("memory", plots.memory_figure(result)), ("schedule", plots.schedule_figure(result))):
        path = out / f"predict_{name}.png"
        plots.save(figure, path)
        written.append(path)
    return written
