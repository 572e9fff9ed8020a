"""Validation of `python -m grader predict` against published runs: writes bench/SCALE.md.

    python bench/bench_scale.py --no-calculon   # every run with the fitted A100 and the H100 (about 25 minutes)
    python bench/bench_scale.py --merge --calculon-only --no-h100   # add the runs with Calculon's curves as published
    python bench/bench_scale.py --merge --check-line --no-h100 --only 22B  # 175B simulated with all 64 microbatches
    python bench/bench_scale.py --only 22B 175B # some of Korthikanti et al.'s models
    python bench/bench_scale.py --fit           # find the one fitted constant again (22B, SP + selective)
    python bench/bench_scale.py --report        # SCALE.md again from bench/scale_results.json

For each of Korthikanti et al.'s runs (22B, 175B, 530B, 1T; full recomputation, and sequence parallelism with
selective recomputation) it simulates the step on meta tensors and compares the iteration time with Table 5, and
the first stage's activation memory with the paper's formulas and its Figure 1. A pipeline of many microbatches
is simulated with m1 and m2 of them (runner.line_points) and the step read off the line through the two runs.
Figure 1's baseline (no recomputation, no sequence parallelism) was not timed; its memory is predicted from the run
of m1 microbatches (the first stage holds as many in flight as with all of them), which says so. Then
torchtitan's Llama 3.1 8B on 8 H100s (tokens per second per GPU, memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from grader.predictor.runner import line_points, predict, predict_by_line  # noqa: E402
from grader.predictor import formulas  # noqa: E402
from grader.predictor.presets import MEGATRON, megatron  # noqa: E402

GIB = 2**30
OUT = ROOT / "bench" / "SCALE.md"
RESULTS = ROOT / "bench" / "scale_results.json"


def run_megatron(name: str, mode: str, cluster: str = "a100") -> dict:
    cfg = megatron(name, mode).but(cluster=cluster)
    if mode == "none":  # memory only: the first stage holds as many microbatches in flight with m1 as with all
        par = cfg.parallel
        m1 = (line_points(cfg) or (par.microbatches,))[0]
        cfg = cfg.but(global_batch=m1 * par.microbatch)
        p = predict(cfg)
    else:
        p = predict_by_line(cfg)
    pub = MEGATRON[name][-1]
    first = p.memory[0]
    return {"model": name, "mode": mode, "cluster": cluster, "step_seconds": p.step_seconds,
            "published_seconds": {"full": pub.full_seconds, "seqsel": pub.seqsel_seconds}.get(mode),
            "activations": first["layer_activations"], "all_activations": first["activations"],
            "formula": float(formulas.activation_bytes(cfg)),
            "figure1_gib": {"none": pub.activations_none_gib, "seqsel": pub.activations_seqsel_gib}.get(mode),
            "weights_and_optimizer": first["weights"] + first["gradients"] + first["optimizer"],
            "middle_weights_and_optimizer": sum(p.memory[len(p.memory) // 2][k]
                                                for k in ("weights", "gradients", "optimizer")),
            "figure1_weights_gib": pub.weights_and_optimizer_gib,
            "formula_weights": 18 * formulas.layer_weights_per_gpu(cfg),
            "peak": max(m["peak"] for m in p.memory), "mfu": p.mfu, "bubble": sum(p.bubble) / len(p.bubble),
            "ranks": cfg.simulated_ranks, "ops": p.ops, "events": p.events, "wall": p.wall_seconds,
            "cpu": p.cpu_seconds, "microbatches": cfg.parallel.microbatches,
            "simulated_microbatches": list(p.line_through) or [cfg.parallel.microbatches]}


def run_torchtitan() -> dict:
    """torchtitan's Llama 3.1 8B on 8 H100s: tokens per second per GPU (the local batch's tokens over the step)
    and the rank's peak memory, against docs/performance.md's Table 1."""
    from grader.predictor.presets import TORCHTITAN_MEMORY_GIB, TORCHTITAN_TOKENS_PER_SECOND, torchtitan_llama8b

    cfg = torchtitan_llama8b()
    p = predict(cfg)
    tokens = cfg.parallel.microbatch * cfg.model.seq  # one GPU's local batch
    m = p.memory[0]
    return {"model": "Llama 3.1 8B", "mode": "FSDP, selective (op)", "cluster": cfg.cluster,
            "published_tokens": TORCHTITAN_TOKENS_PER_SECOND, "published_gib": TORCHTITAN_MEMORY_GIB,
            "tokens_per_second": tokens / p.step_seconds, "step_seconds": p.step_seconds, "mfu": p.mfu,
            "memory_gib": m["peak"] / GIB, "weights_gib": m["weights"] / GIB, "gradients_gib": m["gradients"] / GIB,
            "optimizer_gib": m["optimizer"] / GIB, "activations_gib": m["activations"] / GIB,
            "ranks": cfg.simulated_ranks, "ops": p.ops, "events": p.events, "wall": p.wall_seconds,
            "cpu": p.cpu_seconds, "microbatches": cfg.parallel.microbatches}


def fit() -> Fraction:
    """The fraction of Calculon's matrix efficiency that makes 22B (SP + selective) take its published 1.10 s."""
    import grader.predictor.cluster as cluster

    base = cluster.CLUSTERS["a100-calculon"]
    lo, hi = Fraction("0.5"), Fraction(1)
    for _ in range(14):
        mid = (lo + hi) / 2
        device = dataclasses.replace(base.device, efficiency=base.device.efficiency.scaled(mid))
        cluster.CLUSTERS["fit"] = dataclasses.replace(base, device=device)
        seconds = predict(megatron("22B", "seqsel").but(cluster="fit")).step_seconds
        print(f"  {float(mid):.5f}: {seconds:.4f} s", file=sys.stderr)
        lo, hi = (mid, hi) if seconds > 1.10 else (lo, mid)
    return (lo + hi) / 2


def pct(a, b) -> str:
    return f"{100 * (a / b - 1):+.1f}%"


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def check_line() -> dict:
    """175B with SP + selective recomputation, every microbatch simulated, against the line through two runs."""
    cfg = megatron("175B", "seqsel")
    every, line = predict(cfg), predict_by_line(cfg)
    return {"model": "175B", "mode": "seqsel", "every_ticks": every.step_ticks, "line_ticks": line.step_ticks,
            "every_memory": every.memory, "line_memory": line.memory, "every_ops": every.ops, "line_ops": line.ops,
            "every_wall": every.wall_seconds, "line_wall": line.wall_seconds, "every_cpu": every.cpu_seconds,
            "line_cpu": line.cpu_seconds, "line_through": list(line.line_through)}


def markdown(rows: list[dict], h100: list[dict], line_check: dict | None = None) -> str:
    timed = [r for r in rows if r["mode"] in ("full", "seqsel") and r["cluster"] == "a100"]
    errors = [abs(r["step_seconds"] / r["published_seconds"] - 1) for r in timed]
    out = [HEADER.format(commit=commit(), torch=torch.__version__, python=platform.python_version())]
    out.append("## Iteration time (Table 5), DGX A100\n")
    out.append("| model | recomputation | published (s) | predicted (s) | error | Calculon's curves as published (s) "
               "| error | MFU | bubble |")
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    unfitted = {(r["model"], r["mode"]): r for r in rows if r["cluster"] == "a100-calculon"}
    for r in timed:
        u = unfitted.get((r["model"], r["mode"]))
        raw = f"{u['step_seconds']:.2f} | {pct(u['step_seconds'], r['published_seconds'])}" if u else "- | -"
        fitted = " (fitted here)" if (r["model"], r["mode"]) == ("22B", "seqsel") else ""
        out.append(f"| {r['model']} | {MODES[r['mode']]} | {r['published_seconds']} | {r['step_seconds']:.2f} | "
                   f"{pct(r['step_seconds'], r['published_seconds'])}{fitted} | {raw} | {100 * r['mfu']:.1f}% | "
                   f"{100 * r['bubble']:.1f}% |")
    if errors:
        others = [abs(r["step_seconds"] / r["published_seconds"] - 1) for r in timed
                  if (r["model"], r["mode"]) != ("22B", "seqsel")]
        out.append(f"\nAverage error {100 * sum(errors) / len(errors):.1f}% (target at most 10%), largest "
                   f"{100 * max(errors):.1f}% (target at most 20%), over the {len(errors)} runs; over the "
                   f"{len(others)} runs the constant was not fitted on: average {100 * sum(others) / max(len(others), 1):.1f}%, "
                   f"largest {100 * max(others, default=0):.1f}%.")
        worst = max(timed, key=lambda r: abs(r["step_seconds"] / r["published_seconds"] - 1))
        out.append(f"The largest error: {worst['model']}, {MODES[worst['mode']]} "
                   f"({pct(worst['step_seconds'], worst['published_seconds'])}).")
    raws = [abs(u["step_seconds"] / u["published_seconds"] - 1) for u in unfitted.values() if u["published_seconds"]]
    if raws:
        out.append(f"With Calculon's curves as published (nothing fitted): average {100 * sum(raws) / len(raws):.1f}%,"
                   f" largest {100 * max(raws):.1f}%, over {len(raws)} runs.")
    out.append("\n## Activation memory on the first pipeline stage (GiB per GPU)\n")
    out.append("| model | recomputation | predicted | Korthikanti et al.'s formula | error | Figure 1 | "
               "weights + gradients + optimizer (first stage; a middle stage) | Figure 1 (layers only) | peak |")
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if r["cluster"] != "a100":
            continue
        fig = f"{r['figure1_gib']:.2f}" if r["figure1_gib"] else "-"
        note = f" (m = {r['microbatches']})" if r["mode"] == "none" else ""
        out.append(f"| {r['model']} | {MODES[r['mode']]}{note} | {r['activations'] / GIB:.2f} | "
                   f"{r['formula'] / GIB:.2f} | {pct(r['activations'], r['formula'])} | {fig} | "
                   f"{r['weights_and_optimizer'] / GIB:.2f}; {r['middle_weights_and_optimizer'] / GIB:.2f} | "
                   f"{r['figure1_weights_gib']:.2f} | {r['peak'] / GIB:.1f} |")
    out.append("\n## What the largest runs cost to simulate\n")
    out.append("| model | recomputation | microbatches | simulated (microbatches) | simulated ranks | ops | events "
               "| wall (s) | CPU (s) |")
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows + h100:
        if r["cluster"] == "a100-calculon":
            continue
        simulated = " + ".join(str(m) for m in r.get("simulated_microbatches", [r["microbatches"]]))
        out.append(f"| {r['model']} | {MODES.get(r['mode'], r['mode'])} | {r['microbatches']} | {simulated} | "
                   f"{r['ranks']} | {r['ops']:,} | {r['events']:,} | {r['wall']:.0f} | {r['cpu']:.0f} |")
    measured = [r for r in rows + h100 if r["cluster"] != "a100-calculon"]
    if measured:
        big = max(measured, key=lambda r: r["ops"])
        out.append(f"\nThe largest, {big['model']} with {MODES.get(big['mode'], big['mode'])}: {big['ops']:,} ops on "
                   f"{big['ranks']} simulated ranks in {big['wall']:.0f} s of wall time ({big['cpu']:.0f} s of CPU; the "
                   f"issue's target is 5 minutes). Simulating all {big['microbatches']} of its microbatches would take "
                   f"about {big['microbatches'] / sum(big['simulated_microbatches']):.1f} times as many ops (not run).")
    if line_check:
        c = line_check
        agree = (c["every_ticks"], c["every_memory"]) == (c["line_ticks"], c["line_memory"])
        same = "the same" if agree else "NOT the same"
        out.append(f"\nThe line checked at full size: 175B with SP + selective, all 64 microbatches simulated, "
                   f"{c['every_ticks']:,} ticks ({c['every_ops']:,} ops, {c['every_wall']:.0f} s wall, "
                   f"{c['every_cpu']:.0f} s CPU); read off the line through {c['line_through'][0]} and "
                   f"{c['line_through'][1]}: {c['line_ticks']:,} ticks ({c['line_ops']:,} ops, {c['line_wall']:.0f} s "
                   f"wall, {c['line_cpu']:.0f} s CPU): {same} step and memory, to the tick and the byte.")
    if h100:
        out.append(H100_SECTION)
        out.append("| run | published | predicted | error |")
        out.append("| --- | ---: | ---: | ---: |")
        for r in h100:
            out.append(f"| {r['model']}, {r['cluster']} | {r['published_tokens']:,} tokens/s/GPU, "
                       f"{r['published_gib']} GiB | {r['tokens_per_second']:,.0f} tokens/s/GPU, {r['memory_gib']:.1f} "
                       f"GiB | {pct(r['tokens_per_second'], r['published_tokens'])}, "
                       f"{pct(r['memory_gib'], r['published_gib'])} |")
        for r in h100:
            step = r["published_step"] = 2 * 8192 / r["published_tokens"]  # one GPU's local batch of tokens
            out.append(f"\nAs a step time: {step:.3f} s measured, {r['step_seconds']:.3f} s predicted "
                       f"({pct(r['step_seconds'], step)}); MFU predicted {100 * r['mfu']:.1f}%.")
    out.append(FOOTER)
    return "\n".join(out) + "\n"


MODES = {"full": "full", "seqsel": "SP + selective", "none": "none (no SP)"}

HEADER = """# Predictions at scale against published runs

`python -m grader predict` runs Megatron-LM's GPT training step (grader/predictor/) on the simulator with meta
tensors, on a cluster of real GPUs (grader/predictor/devices.py, cluster.py). This file is written by
`python bench/bench_scale.py` (at commit {commit}, torch {torch}, Python {python}, on two shared CPU cores). The runs
were made at commit 1486ac5 (the fitted A100 and the H100) and 45df5a7 (Calculon's curves, the line's check); after
merging main at 2de32f3 the 22B runs and the H100 run gave the same step to the tick and the same memory to the
byte.

Sources. Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198): Table 5 (iteration times), Table 3 (the configurations), Figure 1 (memory); DGX A100 80GB
nodes, sequence length 2048, vocabulary 51200, fp16. The interleaving (3 chunks per rank for 175B and 530B) and
microbatch sizes are Calculon's validation inputs (github.com/calculon-ai/calculon, validation/*.json).
torchtitan's docs/performance.md, Table 1, for the H100 run. Device and network constants: NVIDIA's datasheets;
efficiency curves, link efficiencies and latencies: Calculon's systems/a100_80g.json and h100_80g_nvl8.json
(that project's assumptions, not measurements).

One constant is fitted, as the issue allows, on one configuration: the share of Calculon's matrix (tensor-core)
efficiency the A100s reach, 0.774, so that 22B with SP + selective takes its published 1.10 s
(`python bench/bench_scale.py --fit`). The errors on the seven other runs are not fitted. The column "Calculon's
curves as published" is the same prediction with nothing fitted. Tensor-parallel communication is not
overlapped with compute (Calculon's "no_overlap"; config.py's overlap_communication=False).

How the runs are made cheap enough. One simulated rank per pipeline stage stands for its 8 tensor-parallel GPUs
(they are symmetric): its tensor-parallel collectives are charged by the ring formula for 8 GPUs over NVLink
(cluster.py), not run rank by rank. One data-parallel replica stands for all (here there is one). A pipeline of
many microbatches is simulated with m1 and m2 of them (p and 2p for 1F1B, 2p and 3p for the interleaved
schedule) and the step of m read off the line through the two (runner.predict_by_line): once the pipeline has
filled, each further microbatch adds the same period on every stage. tests/test_scale.py holds the line to the
full run tick for tick on small pipelines of both schedules, and the check below does at 175B.
"""

H100_SECTION = """
## H100: torchtitan's Llama 3.1 8B

FSDP over 8 H100s of one Grand Teton host, local batch 2 of 8,192 tokens, selective activation checkpointing
(torchtitan's "op" policy), bfloat16 compute with float32 gradient reduction, no torch.compile, no Float8
(grader/predictor/llama.py). Calculon's H100 curves, nothing fitted.
"""

FOOTER = """
## Where it errs most

- On the A100 table the errors grow with the model: 22B and 175B at most 4% off, 530B +2% and +5%, 1T +6% and +7%,
  every one past 175B an over-prediction, and full recomputation always further off than SP + selective. The
  cause is not isolated (no run here measures it); the candidates, from what the model does: the efficiency
  curves stop growing at 128 GFLOP a product, so 1T's products (hidden 25,600, four times 175B's FLOPs each) are
  charged the same share of peak as 175B's, where larger GEMMs run nearer it; the tensor-parallel collectives are
  never overlapped with compute, and full recomputation runs the forward's all-reduces twice; one fitted
  constant, taken at 22B, carries 22B's product sizes to the others.
- Nothing fitted (Calculon's curves as published), every A100 run is predicted too fast: 8% to 17% under,
  14% on average, which misses the 10% target; the curves assume more of an A100 than these runs reached, by
  about the same share on every model (the fitted 0.774 of the matrix efficiency takes it up).
- The H100 run is the worst: torchtitan's Llama 3.1 8B is predicted about 23% faster than measured, with
  Calculon's H100 curves and nothing fitted (fitting on it would leave no H100 run to test on). What the step
  leaves out weighs most there: FSDP2 in eager mode (no torch.compile) pays Python and launch overhead on every
  layer's all-gather and reduce-scatter; the Grand Teton H100s run at a 500 W limit with HBM2e at 2.4 TB/s, whose
  sustained clocks no datasheet number gives; and the A100's fitted share of Calculon's curve is not applied to
  the H100. Its memory is within 8% (the allocator's reserve and fragmentation are not modelled).

## What the prediction leaves out

- Kernels are charged by a roofline at a step function of their size (the efficiency curves); a real GEMM's speed
  depends on its shape and tiling, the cuBLAS version and the clock the GPU holds under its power limit. The one
  fitted constant absorbs the average of that on the A100 runs.
- Communication: ring collectives over the slowest link a group crosses, at a fixed efficiency; no hierarchical
  all-reduce, no contention between groups on shared links, no NCCL protocol or channel choices. Tensor-parallel
  collectives are not overlapped with compute (the A100 runs are predicted best that way; Megatron issues the
  backward's asynchronously).
- Fused kernels (bias + dropout + residual, bias + GELU) run as the separate aten ops of the reference, each
  charged its own memory traffic; a fused optimizer's in-place writes are not charged (the clock counts an op's
  outputs, and `_fused_adam_` returns none).
- The host: no Python or launch overhead, no data loading, no garbage collection, no stragglers, no failures.
- Activations are the ledger's bytes after each forward (what autograd keeps, plus the embedding's and the
  loss's tensors the paper's formulas leave out), and the peak adds whatever the op running then allocates; the
  allocator's fragmentation and the CUDA context are not modelled.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(MEGATRON), help="these models only")
    parser.add_argument("--fit", action="store_true", help="find the fitted constant again and stop")
    parser.add_argument("--no-calculon", action="store_true", help="skip the runs with Calculon's curves")
    parser.add_argument("--calculon-only", action="store_true", help="only the runs with Calculon's curves")
    parser.add_argument("--no-h100", action="store_true", help="skip torchtitan's Llama 3.1 8B")
    parser.add_argument("--merge", action="store_true", help="keep the results of runs not repeated now")
    parser.add_argument("--report", action="store_true", help="write SCALE.md from scale_results.json, run nothing")
    parser.add_argument("--check-line", action="store_true",
                        help="simulate 175B (SP + selective) with all its microbatches against the line")
    args = parser.parse_args()
    if args.fit:
        print(f"fitted: {float(fit()):.4f}")
        return 0
    if args.report:
        saved = json.loads(RESULTS.read_text())
        OUT.write_text(markdown(saved["rows"], saved.get("h100", []), saved.get("line_check")))
        print(f"wrote {OUT}", file=sys.stderr)
        return 0
    done, line_check, h100 = {}, None, []
    if args.merge and RESULTS.exists():  # read once, before the runs below rewrite the file
        saved = json.loads(RESULTS.read_text())
        done = {(r["model"], r["mode"], r["cluster"]): r for r in saved["rows"]}
        line_check, h100 = saved.get("line_check"), saved.get("h100", [])
    if args.check_line:
        line_check = check_line()

    def save():
        RESULTS.write_text(json.dumps({"rows": list(done.values()), "h100": h100, "line_check": line_check},
                                      indent=1))
    rows = []
    for name in args.only or list(MEGATRON):
        for mode in ("seqsel", "full", "none"):
            clusters = (([] if args.calculon_only else ["a100"])
                        + ([] if args.no_calculon or mode == "none" else ["a100-calculon"]))
            for cluster in clusters:
                start = time.time()
                r = run_megatron(name, mode, cluster)
                done[(name, mode, cluster)] = r
                print(f"{name} {mode} {cluster}: {r['step_seconds']:.3f} s (published {r['published_seconds']}), "
                      f"activations {r['activations'] / GIB:.2f} GiB (formula {r['formula'] / GIB:.2f}), "
                      f"{r['ops']:,} ops in {time.time() - start:.0f} s", file=sys.stderr, flush=True)
                save()
    if not args.no_h100:
        h100 = [run_torchtitan()]
    order = {name: i for i, name in enumerate(MEGATRON)}
    rows = sorted(done.values(), key=lambda r: (order[r["model"]], ["seqsel", "full", "none"].index(r["mode"]),
                                                 r["cluster"]))
    RESULTS.write_text(json.dumps({"rows": rows, "h100": h100, "line_check": line_check}, indent=1))
    OUT.write_text(markdown(rows, h100, line_check))
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
