"""The data-parallel replicas' gradient reduction (DDP), by formula over the simulated replica's timeline.

One replica is simulated; the D replicas do the same work on other data, and their gradients are all-reduced
among the D GPUs that hold the same piece of the model (Megatron's numbering puts them t GPUs apart: in
different nodes once t·D passes a node, so the all-reduce crosses InfiniBand). What that costs is cluster.py's
formula for an all-reduce of those bytes among D GPUs on that link. When it runs:

    after the pipeline (dp_overlap False: Megatron-LM's local DDP of 2021-2022)
        every stage all-reduces its whole gradient buffer once its last backward has ended
    bucketed (dp_overlap True: PyTorch's DDP, Megatron-LM's --overlap-grad-reduce)
        each model chunk's gradients are final during its last backward (the last microbatch's); they are made
        at an even rate over that backward's time, cut into buckets of 25 MB (PyTorch's bucket_cap_mb) in the
        order they are made, and each bucket all-reduced once it is full and the one before it is done:

            finish(k) = max(finish(k-1), ready(k)) + all_reduce(bucket k)

The all-reduces run on a communicator and a link of their own, beside the simulated replica's own
communication (tensor parallelism on NVLink, the pipeline's messages), and take nothing from its compute (the
SMs NCCL uses are not charged). The optimizer's first collective (the inf/NaN check over every stage) waits for
the slowest stage, so the step grows by

    max(0, max over stages of (end of last backward + exposed all-reduce) - the latest end of a last backward)

where a stage's exposed time is what runs past its own last backward. FSDP (the Llama step) simulates its
communication instead: nothing is added.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .config import Config
from .schedule import order

BUCKET_BYTES = 25 * 2**20  # PyTorch's DDP bucket_cap_mb


@dataclass(frozen=True)
class Reduction:
    """The data-parallel all-reduce of one step: how long it occupies the network (the slowest stage's), and
    how much of it the step waits for (`exposed`), in ticks."""

    busy: int = 0
    exposed: int = 0


def all_reduce_ticks(cfg: Config, cost, nbytes: int) -> int:
    """One all-reduce of `nbytes` among the D GPUs that hold the same piece of the model."""
    par = cfg.parallel
    gpus = tuple(par.tensor * d for d in range(par.data))
    return cost.cluster.link(gpus).ticks("all_reduce", nbytes, par.data, cost.device)


def unit_spans(events) -> dict[str, tuple[int, int]]:
    """label -> (start, end) of each unit's compute on one rank, the recomputation inside a backward counted as
    the backward's (its events are labelled 'recompute' and come before the layer's own)."""
    spans, pending = {}, None
    for e in sorted(events, key=lambda e: e.start):
        if e.label == "recompute":
            pending = e.start if pending is None else pending
            continue
        start = e.start if pending is None else pending
        pending = None
        s, end = spans.get(e.label, (start, e.end))
        spans[e.label] = (min(s, start), max(end, e.end))
    return spans


def last_backwards(cfg: Config, stage: int) -> list:
    """The unit of each chunk whose backward makes its gradients final on pipeline rank `stage`, in the order
    they run."""
    par = cfg.parallel
    units = [u for u in order(stage, par.pipeline, par.virtual, par.microbatches) if not u.forward]
    last = {}
    for u in units:
        last[u.chunk] = u
    return sorted(last.values(), key=units.index)


def bucketed_finish(spans_and_bytes, cfg: Config, cost) -> int:
    """When the last bucket's all-reduce ends: each (start, end, nbytes) made at an even rate over [start, end)."""
    finish = 0
    for start, end, nbytes in spans_and_bytes:
        made = 0
        while made < nbytes:
            size = min(BUCKET_BYTES, nbytes - made)
            made += size
            ready = start + int((end - start) * Fraction(made, nbytes))
            finish = max(finish, ready) + all_reduce_ticks(cfg, cost, size)
    return finish


def reduction(cfg: Config, cost, result, figures, stage_of=lambda rank: rank) -> Reduction:
    """The data-parallel reduction of the simulated step `result` (a SimResult; `figures`: each rank's
    StepFigures). `stage_of(rank)`: the pipeline stage a simulated rank is."""
    if cfg.parallel.data == 1 or cfg.data_parallel == "fsdp":
        return Reduction()
    ends, finishes, busy = [], [], 0
    for rank, f in enumerate(figures):
        events = [e for e in result.events_of(rank, "compute") if e.kind == "backward"]
        if not events:
            continue
        end = max(e.end for e in events)
        total = sum(f.chunk_gradients)
        whole = all_reduce_ticks(cfg, cost, total)
        if cfg.dp_overlap:
            spans = unit_spans(result.events_of(rank, "compute"))
            work = [(*spans[str(u)], f.chunk_gradients[u.chunk]) for u in last_backwards(cfg, stage_of(rank))]
            finish = bucketed_finish(work, cfg, cost)
            busy = max(busy, sum(all_reduce_ticks(cfg, cost, min(BUCKET_BYTES, n - k))
                                 for *_, n in work for k in range(0, n, BUCKET_BYTES)))
        else:
            finish = end + whole
            busy = max(busy, whole)
        ends.append(end)
        finishes.append(max(end, finish))
    latest = max(ends)
    return Reduction(busy, max(0, max(finishes) - latest))
