"""What a prediction says: the report a person reads, the same as JSON, and the prediction as a PuzzleResult whose
figures the trace and the plots read (the front ends' timeline.py and plots/ draw them).

    describe_config(cfg)     the run in three lines: the model, the GPUs and their split, what is simulated
    report(prediction)       step time, MFU, idle time, memory per GPU by kind, time by class of op, against the
                             published figures and the papers' formulas where they have one
    to_dict(prediction)      the same figures for --json
    as_result(prediction)    the events merged per unit and the ledgers thinned, for a trace or a chart
"""

from __future__ import annotations

from ..core.result import PuzzleResult
from . import formulas
from .cluster import CLUSTERS
from .config import Config
from .published import korthikanti_figure1, published_run
from .runner import Prediction

GIB = 2**30


def published(cfg: Config):
    """(the published run cfg is, or None; Figure 1's activation GiB when cfg is one of Korthikanti et al.'s
    runs that Figure 1 shows, else None)."""
    return published_run(cfg), korthikanti_figure1(cfg)


def describe_config(cfg: Config) -> str:
    m, par = cfg.model, cfg.parallel
    if cfg.data_parallel == "fsdp":
        return (f"{m.name}: {m.layers} layers, hidden {m.hidden:,}, {m.heads} heads ({m.kv} for keys and values), "
                f"MLP {m.ffn_width:,}, sequence {m.seq:,}, vocabulary {m.vocab:,}\n"
                f"on {par.gpus} GPUs of {CLUSTERS[cfg.cluster].name}: FSDP over all {par.data}; local batch "
                f"{par.microbatch}; recomputation: {cfg.recompute}; {cfg.dtype}\n"
                f"{describe_physics(cfg)}\none simulated rank stands for the {par.data} of the FSDP group")
    schedule = "1F1B" if par.virtual == 1 else f"interleaved 1F1B, {par.virtual} chunks per rank"
    sp = "sequence parallel" if par.sequence_parallel else "no sequence parallelism"
    ranks = (f"{cfg.simulated_ranks} simulated rank(s), one per stage, each standing for its {par.tensor} "
             f"tensor-parallel GPUs" if cfg.stand_in else f"{cfg.simulated_ranks} simulated rank(s), one per GPU "
                                                            f"of a replica")
    return (f"{m.name}: {m.layers} layers, hidden {m.hidden:,}, {m.heads} heads, sequence {m.seq:,}, vocabulary "
            f"{m.vocab:,}\n"
            f"on {par.gpus} GPUs of {CLUSTERS[cfg.cluster].name}: tensor {par.tensor} x pipeline {par.pipeline} "
            f"({schedule}) x data {par.data}; {par.microbatches} microbatches of {par.microbatch} per replica; "
            f"{sp}; recomputation: {cfg.recompute}\n{describe_physics(cfg)}\n{ranks}")


def describe_physics(cfg: Config) -> str:
    """The overlap, gradient and dropout choices (config.py) in one line."""
    if cfg.data_parallel == "fsdp":
        return (f"FSDP: all-gathers prefetched and reduce-scatters under the next backward: "
                f"{'yes' if cfg.fsdp_overlap else 'no'}; dropout {cfg.dropout:g}")
    parts = [f"tensor-parallel collectives under the backward's products: {'yes' if cfg.tp_overlap else 'no'}"]
    if cfg.parallel.data > 1:
        parts.append("data-parallel all-reduce " + ("bucketed under the last backward" if cfg.dp_overlap
                                                    else "after the pipeline"))
    parts.append(f"gradients {'float32' if cfg.grad_dtype == 'float32' else cfg.dtype}")
    parts.append(f"dropout {cfg.dropout:g}")
    return "; ".join(parts)


def describe_runs(p: Prediction) -> str:
    """What was simulated, when the step was read off lines through smaller runs (lines.py)."""
    cfg, par = p.config, p.config.parallel
    runs = ", ".join(f"{s} stage{'s' * (s > 1)} x {m}" for s, m in p.line_through)
    stages = {s for s, _ in p.line_through}
    if len(stages) > 1:
        s, m = p.checked_against
        return (f"(runs of {runs} microbatches: the step of {par.pipeline} stages and {par.microbatches} "
                f"microbatches is read off the lines through them, each further stage and microbatch adding the "
                f"same time, checked to the tick against a run of {s} stages x {m}; memory shown for the first, "
                f"second and last stage; the trace and plots show the run of {max(p.line_through)[0]} stages; "
                f"--every-microbatch simulates all)")
    note = " (the lines through shorter pipelines missed their check run: read at the real p)" if p.off_the_lines \
        else ""
    return (f"(runs of {runs} microbatches: the step of {par.microbatches} is read off the line through them, "
            f"each further microbatch adding the same period; the trace and plots show the run of "
            f"{max(p.line_through)[1]}; --every-microbatch simulates all){note}")


def report(p: Prediction, notes=()) -> str:
    cfg = p.config
    first = p.memory[0]
    run, figure1 = published(cfg)
    lines = [describe_config(cfg), ""]
    lines.append(f"simulated {p.ops:,} ops in {p.wall_seconds:.0f} s ({p.cpu_seconds:.0f} s of CPU), "
                 f"{p.events:,} events on the clock")
    if p.line_through:
        lines.append(describe_runs(p))
    step = f"step time        {p.step_seconds:9.3f} s"
    if p.dp.busy:
        step += (f"   (the data-parallel all-reduce runs {p.dp.busy / 1e9:.3f} s, of which the step waits "
                 f"{p.dp.exposed / 1e9:.3f} s)")
    lines.append(step)
    if run is not None:
        lines.append(f"published        {run.seconds:9.3f} s   {100 * (p.step_seconds / run.seconds - 1):+.1f}%: "
                     f"{run.source}" + (f" ({run.derived})" if run.derived else ""))
    if cfg.data_parallel == "fsdp":
        tokens = cfg.parallel.microbatch * cfg.model.seq / p.step_seconds
        lines.append(f"throughput       {tokens:9,.0f} tokens/s per GPU")
    lines.append(f"MFU              {100 * p.mfu:9.1f} %   model FLOPs 72·B·s·L·h²(1 + s/6h + V/12hL) = "
                 f"{formulas.model_flops(cfg):.3g} a step" if cfg.model.style == "gpt" else
                 f"MFU              {100 * p.mfu:9.1f} %   of the device's peak (model FLOPs by the GPT formula)")
    mean_idle = sum(p.bubble) / len(p.bubble)
    lines.append(f"compute idle     {100 * mean_idle:9.1f} %   of the step, mean over the pipeline's ranks: the "
                 f"pipeline's bubble, (p-1)/(v·m+p-1) = {100 * float(formulas.bubble(cfg)):.1f}%, and waits for "
                 f"communication")
    lines.append("memory per GPU, first stage (the fullest):")
    for kind in ("weights", "gradients", "optimizer"):
        lines.append(f"  {kind:<15}{first[kind] / GIB:9.2f} GiB")
    if cfg.model.style == "gpt":
        act = (f"  {'activations':<15}{first['layer_activations'] / GIB:9.2f} GiB   the layers'; Korthikanti et "
               f"al.'s formula {float(formulas.activation_bytes(cfg)) / GIB:.2f} GiB")
        if figure1:
            act += f" (their Figure 1, the same formula evaluated: {figure1} GiB)"
        lines.append(act)
    lines.append(f"  {'':<15}{first['activations'] / GIB:9.2f} GiB   activations with the embedding's and the "
                 f"loss's" if cfg.model.style == "gpt" else f"  {'activations':<15}{first['activations'] / GIB:9.2f} "
                 f"GiB   what the step held after its forward, beyond weights and states")
    peak = f"  {'peak':<15}{max(m['peak'] for m in p.memory) / GIB:9.2f} GiB   of " \
           f"{CLUSTERS[cfg.cluster].memory_bytes / GIB:.0f} GiB (the most of any stage)"
    if run is not None and run.memory_gib:
        peak += f"; published {run.memory_gib} GiB"
    lines.append(peak)
    lines.append(f"time by class on rank {p.tally_rank} ({'a middle stage' if cfg.parallel.pipeline > 2 else 'a stage'}"
                 f", {p.makespan / 1e9:.3f} s):")
    compute = p.time_by_class["compute"]
    busy = sum(compute.values())
    for kind, ticks in sorted(compute.items(), key=lambda kv: -kv[1]):
        lines.append(f"  compute {kind:<24}{ticks / 1e9:9.3f} s")
    for kind, ticks in sorted(p.time_by_class["communication"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  comm    {kind:<24}{ticks / 1e9:9.3f} s")
    lines.append(f"  compute idle {'':<19}{(p.makespan - busy) / 1e9:9.3f} s   (communication runs on a stream of "
                 f"its own: it overlaps compute or idle; 'shared SMs': what the collectives under compute took "
                 f"from it)")
    if p.answer_notes:
        lines += [f"answer: {n}" for n in p.answer_notes]
    return "\n".join(lines)


def to_dict(p: Prediction, notes=()) -> dict:
    run, figure1 = published(p.config)
    gpt = p.config.model.style == "gpt"
    return {"config": describe_config(p.config), "step_seconds": p.step_seconds, "mfu": p.mfu,
            "bubble": p.bubble, "memory": p.memory, "memory_stages": list(p.memory_stages),
            "time_by_class": p.time_by_class, "tally_rank": p.tally_rank,
            "data_parallel": {"busy_seconds": p.dp.busy / 1e9, "exposed_seconds": p.dp.exposed / 1e9},
            "published_seconds": None if run is None else run.seconds,
            "published_source": None if run is None else run.source,
            "published_memory_gib": None if run is None else run.memory_gib,
            "figure1_activations_gib": figure1,
            "formula_activation_bytes": float(formulas.activation_bytes(p.config)) if gpt else None,
            "simulated_ranks": p.config.simulated_ranks, "ops": p.ops, "events": p.events,
            "wall_seconds": p.wall_seconds, "cpu_seconds": p.cpu_seconds, "notes": list(notes),
            "line_through": [list(x) for x in p.line_through], "checked_against": list(p.checked_against),
            "off_the_lines": p.off_the_lines,
            "answer": list(p.answer_notes)}


# ---- the trace and the plots


def coarse_events(events, makespan: int, columns: int = 4000) -> list[dict]:
    """The clock's events with each run of one rank's events on one stream under one label (a unit: "F3.1",
    "B3.1", "optimizer") merged into one where they are closer than 1/`columns` of the makespan: a step at scale
    has millions of events, a trace or a chart a few per unit, and an idle gap a chart can show stays a gap."""
    gap = makespan // columns
    out, last = [], {}
    for e in sorted(events, key=lambda e: (e.rank, e.stream, e.start)):
        key = (e.label, e.kind)
        prev = last.get((e.rank, e.stream))
        if prev is not None and prev[0] == key and e.start - prev[1]["end"] <= gap:
            d = prev[1]
            d["end"] = max(d["end"], e.end)
            d["flops"] += e.flops
            d["bytes"] += e.bytes
            d["ops"] += e.ops
            d["nbytes"] += e.nbytes
            d["wire_bytes"] += e.wire_bytes
            continue
        d = e.to_dict()
        d["peers"] = list(d["peers"])
        out.append(d)
        last[(e.rank, e.stream)] = (key, d)
    return out


def thinned(timeline, points: int = 2000) -> list:
    """A ledger's timeline with at most about `points` points, keeping each bucket's highest (the peak stays)."""
    if len(timeline) <= points:
        return [list(x) for x in timeline]
    end = timeline[-1][0] or 1
    buckets = {}
    for tick, nbytes in timeline:
        b = tick * points // (end + 1)
        if b not in buckets or nbytes > buckets[b][1]:
            buckets[b] = (tick, nbytes)
    return [list(buckets[b]) for b in sorted(buckets)] + [list(timeline[-1])]


def as_result(p: Prediction) -> PuzzleResult:
    """The prediction as a PuzzleResult whose figures the trace and the plots read (timeline.py, plots/)."""
    r = p.result
    ledgers = [{"rank": l.rank, "peak": l.peak, "peak_tick": l.peak_tick, "timeline": thinned(l.timeline),
                "peak_by_line": [{"site": s, "bytes": b, "count": c} for s, b, c in l.peak_by_line()[:8]]}
               for l in r.ledgers]
    figures = {"events": coarse_events(r.events, r.makespan), "ledgers": ledgers, "makespan": r.makespan,
               "memory_budget": CLUSTERS[p.config.cluster].memory_bytes}
    return PuzzleResult("", "predict", f"{p.config.model.name}, predicted", "", peak_bytes=r.peak_bytes,
                        makespan_ticks=r.makespan, figures=figures)
