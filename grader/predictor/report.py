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
from .presets import MEGATRON
from .runner import Prediction

GIB = 2**30


def published(cfg: Config):
    """(published seconds, Figure 1's activation GiB) when cfg is one of the paper's runs, else (None, None)."""
    for name, (model, t, p, v, mb, gb, pub) in MEGATRON.items():
        if cfg.model == model and (cfg.parallel.tensor, cfg.parallel.pipeline, cfg.parallel.virtual,
                                   cfg.parallel.microbatch, cfg.parallel.global_batch, cfg.parallel.data) == \
                (t, p, v, mb, gb, 1) and cfg.cluster == "a100":
            if cfg.recompute == "full" and not cfg.parallel.sequence_parallel:
                return pub.full_seconds, None
            if cfg.recompute == "selective" and cfg.parallel.sequence_parallel:
                return pub.seqsel_seconds, pub.activations_seqsel_gib
            if cfg.recompute == "none" and not cfg.parallel.sequence_parallel:
                return None, pub.activations_none_gib
    return None, None


def describe_config(cfg: Config) -> str:
    m, par = cfg.model, cfg.parallel
    schedule = "1F1B" if par.virtual == 1 else f"interleaved 1F1B, {par.virtual} chunks per rank"
    sp = "sequence parallel" if par.sequence_parallel else "no sequence parallelism"
    ranks = (f"{cfg.simulated_ranks} simulated rank(s), one per stage, each standing for its {par.tensor} "
             f"tensor-parallel GPUs" if cfg.stand_in else f"{cfg.simulated_ranks} simulated rank(s), one per GPU "
                                                            f"of a replica")
    return (f"{m.name}: {m.layers} layers, hidden {m.hidden:,}, {m.heads} heads, sequence {m.seq:,}, vocabulary "
            f"{m.vocab:,}\n"
            f"on {par.gpus} GPUs of {CLUSTERS[cfg.cluster].name}: tensor {par.tensor} x pipeline {par.pipeline} "
            f"({schedule}) x data {par.data}; {par.microbatches} microbatches of {par.microbatch} per replica; "
            f"{sp}; recomputation: {cfg.recompute}\n{ranks}")


def report(p: Prediction, notes=()) -> str:
    cfg = p.config
    first = p.memory[0]
    time_pub, act_pub = published(cfg)
    formula_act = float(formulas.activation_bytes(cfg)) / GIB
    lines = [describe_config(cfg), ""]
    lines.append(f"simulated {p.ops:,} ops in {p.wall_seconds:.0f} s ({p.cpu_seconds:.0f} s of CPU), "
                 f"{p.events:,} events on the clock")
    if p.line_through:
        m1, m2 = p.line_through
        lines.append(f"(runs of {m1} and {m2} microbatches: the step of {cfg.parallel.microbatches} is read off the "
                     f"line through them, each further microbatch adding the same period; the trace and plots "
                     f"show the run of {m2}; --every-microbatch simulates all)")
    step = f"step time        {p.step_seconds:9.3f} s"
    if p.dp_allreduce_ticks:
        step += f"   (of which the data-parallel all-reduce, by formula: {p.dp_allreduce_ticks / 1e9:.3f} s)"
    if time_pub:
        step += f"   published {time_pub} s: {100 * (p.step_seconds / time_pub - 1):+.1f}%"
    lines.append(step)
    lines.append(f"MFU              {100 * p.mfu:9.1f} %   model FLOPs 72·B·s·L·h²(1 + s/6h + V/12hL) = "
                 f"{formulas.model_flops(cfg):.3g} a step")
    mean_idle = sum(p.bubble) / len(p.bubble)
    lines.append(f"compute idle     {100 * mean_idle:9.1f} %   of the step, mean over the simulated ranks: the "
                 f"pipeline's bubble, (p-1)/(v·m+p-1) = {100 * float(formulas.bubble(cfg)):.1f}%, and waits for "
                 f"communication")
    lines.append("memory per GPU, first stage (the fullest):")
    for kind in ("weights", "gradients", "optimizer"):
        lines.append(f"  {kind:<15}{first[kind] / GIB:9.2f} GiB")
    act = f"  {'activations':<15}{first['layer_activations'] / GIB:9.2f} GiB   the layers'; Korthikanti et al.'s " \
          f"formula {formula_act:.2f} GiB"
    if act_pub:
        act += f", Figure 1: {act_pub} GiB"
    lines.append(act)
    lines.append(f"  {'':<15}{first['activations'] / GIB:9.2f} GiB   with the embedding's and the loss's")
    lines.append(f"  {'peak':<15}{max(m['peak'] for m in p.memory) / GIB:9.2f} GiB   of "
                 f"{CLUSTERS[cfg.cluster].memory_bytes / GIB:.0f} GiB (the most of any stage)")
    lines.append(f"time by class on rank {p.tally_rank} ({'a middle stage' if cfg.parallel.pipeline > 2 else 'a stage'}"
                 f", {p.makespan / 1e9:.3f} s):")
    compute = p.time_by_class["compute"]
    busy = sum(compute.values())
    for kind, ticks in sorted(compute.items(), key=lambda kv: -kv[1]):
        lines.append(f"  compute {kind:<24}{ticks / 1e9:9.3f} s")
    for kind, ticks in sorted(p.time_by_class["communication"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  comm    {kind:<24}{ticks / 1e9:9.3f} s")
    lines.append(f"  compute idle {'':<19}{(p.makespan - busy) / 1e9:9.3f} s   (communication runs on a stream of "
                 f"its own: it overlaps compute or idle)")
    if p.answer_notes:
        lines += [f"answer: {n}" for n in p.answer_notes]
    return "\n".join(lines)


def to_dict(p: Prediction, notes=()) -> dict:
    time_pub, act_pub = published(p.config)
    return {"config": describe_config(p.config), "step_seconds": p.step_seconds, "mfu": p.mfu,
            "bubble": p.bubble, "memory": p.memory, "time_by_class": p.time_by_class, "tally_rank": p.tally_rank,
            "published_seconds": time_pub, "published_activations_gib": act_pub,
            "formula_activation_bytes": float(formulas.activation_bytes(p.config)),
            "simulated_ranks": p.config.simulated_ranks, "ops": p.ops, "events": p.events,
            "wall_seconds": p.wall_seconds, "cpu_seconds": p.cpu_seconds, "notes": list(notes),
            "line_through": list(p.line_through),
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
