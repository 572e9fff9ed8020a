"""Run a training step at scale on the simulator and read a prediction off it.

    prediction = predict(config)        # config.py

One replica of the configuration is simulated (its t·p GPUs, or p ranks that each stand for their tensor-parallel
group), on meta tensors, with the cluster's cost model (cluster.py) placing each rank on its
GPU the way Megatron-LM numbers them (gpu = tp + t·dp + t·D·stage). The data-parallel replicas' all-reduce of
the gradients, after the pipeline has drained (Megatron-LM of 2022 did not overlap it), is added by its ring
formula over the network between nodes.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from puzzles import sim

from . import formulas
from .cluster import CLUSTERS, ClusterCostModel, Placement
from .config import Config
from .fast_meta import remembered_meta_kernels
from .llama import llama_step
from .step import gpt_step

# The model's and the step's own files: an allocation made in them is charged to the line that called them.
SCALE_FILES = tuple(str(Path(__file__).resolve().parent / f"{name}.py") for name in (
    "config", "formulas", "gpt", "llama", "presets", "recompute", "schedule", "step", "tensor_parallel"))


def placement(cfg: Config) -> Placement:
    """Each simulated rank's GPU in Megatron-LM's numbering (replica 0)."""
    par = cfg.parallel
    t, D = par.tensor, par.data
    if cfg.data_parallel == "fsdp":  # one rank stands for the FSDP group's D GPUs
        return Placement((0,), stand_in=D)
    if cfg.stand_in:
        return Placement(tuple(stage * t * D for stage in range(par.pipeline)), stand_in=t)
    return Placement(tuple(r % t + t * D * (r // t) for r in range(cfg.simulated_ranks)))


def cost_model(cfg: Config, cluster=None) -> ClusterCostModel:
    """The cost model of cfg's cluster (or of `cluster`, a cluster.Cluster)."""
    return ClusterCostModel(cluster=cluster or CLUSTERS[cfg.cluster], placement=placement(cfg))


@dataclass
class Prediction:
    """What a simulated step says about the configuration, per GPU where it is per GPU.

    step_ticks:        the step's time: the simulated makespan, plus the data-parallel all-reduce (formula)
    memory:            per simulated rank: {"weights", "gradients", "optimizer", "activations",
                       "layer_activations", "peak"} in bytes (activations: the most the rank held after a forward,
                       beyond its weights and states; layer_activations: of those, what the transformer layers
                       keep, the papers' formulas' count, without the embedding's and the loss's tensors)
    bubble:            per rank, the share of the makespan its compute stream sat idle
    time_by_class:     compute ticks by op class on the rank that counted them (`tally_rank`), and
                       communication ticks by kind on that rank
    """

    config: Config
    makespan: int
    dp_allreduce_ticks: int
    memory: list
    bubble: list
    time_by_class: dict
    tally_rank: int
    flops: list
    ops: int
    events: int
    wall_seconds: float
    cpu_seconds: float
    result: object = field(repr=False, default=None)  # the SimResult
    answer_notes: list = field(default_factory=list)  # which parts of the step were the learner's
    # (m1, m2) when the step at m microbatches is read off the line through runs of m1 and m2 (predict_by_line);
    # then ops, events, wall and CPU are the two runs' together, and `result` is the run of m2
    line_through: tuple = ()

    @property
    def step_ticks(self) -> int:
        return self.makespan + self.dp_allreduce_ticks

    @property
    def step_seconds(self) -> float:
        return self.step_ticks / 1e9

    @property
    def mfu(self) -> float:
        device = self.result.cost.device
        peak = device.flops_per_tick * device.half_precision_speedup  # FLOPs per tick (per ns)
        return float(formulas.model_flops(self.config) / (self.step_ticks * peak * self.config.parallel.gpus))


def dp_allreduce_ticks(cfg: Config, gradient_bytes: int, cost: ClusterCostModel) -> int:
    """The data-parallel all-reduce of one GPU's float32 gradients: a ring over the D replicas' GPUs, which sit
    in different nodes when t·p fills them (Megatron's numbering). FSDP's communication is simulated instead."""
    par = cfg.parallel
    if par.data == 1 or cfg.data_parallel == "fsdp":
        return 0
    gpus = tuple(par.tensor * d for d in range(par.data))
    network = cost.cluster.link(gpus).network(cost.device)
    return network.comm_ticks("all_reduce", gradient_bytes, par.data)


def predict(cfg: Config, tally_rank: int | None = None, timeout: float = 3600.0, ops=None,
            answer_notes=(), cluster=None) -> Prediction:
    """Simulate one step of `cfg`. `ops`: the learner's tensor- or sequence-parallel operators to use in the
    layers (answers.py), None for the reference's; `answer_notes` say which were used;
    `cluster`: another cluster than cfg's (a Cluster)."""
    cost = cost_model(cfg, cluster)
    ranks = cfg.simulated_ranks
    if tally_rank is None:  # a middle stage: layers only, neither the embedding nor the head
        tally_rank = (cfg.parallel.pipeline // 2) * (1 if cfg.stand_in else cfg.parallel.tensor)
    if cfg.data_parallel == "fsdp":
        program, args = llama_step, (cfg, cost, 0)
    else:
        program, args = gpt_step, (cfg, cost, tally_rank, ops)
    wall, cpu = time.perf_counter(), time.process_time()
    with remembered_meta_kernels():
        result = sim.run(program, ranks, args=args, cost=cost, timeout=timeout,
                         library_files=SCALE_FILES)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    figures = result.results
    memory = []
    for r, f in enumerate(figures):
        memory.append({"weights": f.weights, "gradients": f.gradients, "optimizer": f.optimizer,
                       "activations": max(f.held, default=0), "layer_activations": max(f.layers_held, default=0),
                       "peak": result.ledgers[r].peak})
    bubble = [1 - result.busy_ticks(r) / result.makespan for r in range(ranks)]
    comm = Counter()
    for e in result.events_of(tally_rank, "comm"):
        comm[e.kind] += e.ticks
    tally = figures[tally_rank].tally
    time_by_class = {"compute": dict(tally.get("ticks", {})), "communication": dict(comm)}
    compute_events = result.events_of(stream="compute")
    return Prediction(cfg, result.makespan, dp_allreduce_ticks(cfg, figures[0].gradients, cost), memory, bubble,
                      time_by_class, tally_rank, list(result.flops), sum(e.ops for e in compute_events),
                      len(result.events), wall, cpu, result, list(answer_notes))


def line_points(cfg: Config) -> tuple[int, int] | None:
    """The two microbatch counts whose simulated steps give the step of cfg's m microbatches by a straight line,
    or None when simulating m itself costs no more. Once the pipeline has filled, the 1F1B schedule repeats the
    same forward-backward period on every stage for each further microbatch (the interleaved schedule for each
    further group of p), so the makespan, each rank's busy time, its FLOPs and its time by class grow by the
    same amount per microbatch, and the first stage holds as many microbatches in flight (its activations are
    the same). From m = p on for 1F1B; from m = 2p for the interleaved schedule, whose m = p runs every forward
    first (tests/test_scale.py holds the line to the full run, tick for tick)."""
    par = cfg.parallel
    p = par.pipeline
    points = (p, 2 * p) if par.virtual == 1 else (2 * p, 3 * p)
    if p == 1 or cfg.data_parallel == "fsdp" or par.microbatches <= sum(points):  # no cheaper
        return None
    return points


def predict_by_line(cfg: Config, **kwargs) -> Prediction:
    """predict(cfg), simulating m1 and m2 microbatches (line_points) instead of all m of them when that is
    cheaper: the step and the figures that grow with m are read off the line through the two runs."""
    points = line_points(cfg)
    if points is None:
        return predict(cfg, **kwargs)
    par = cfg.parallel
    m1, m2 = points
    a, b = (predict(cfg.but(global_batch=m * par.microbatch * par.data), **kwargs) for m in points)
    m = par.microbatches

    def line(x, y):  # exact: the runs differ by (m2 - m1) equal periods
        return x + (y - x) * (m - m1) // (m2 - m1)

    makespan = line(a.makespan, b.makespan)
    busy = [line(a.result.busy_ticks(r), b.result.busy_ticks(r)) for r in range(cfg.simulated_ranks)]
    by_class = {kind: {k: line(a.time_by_class[kind].get(k, 0), v) for k, v in b.time_by_class[kind].items()}
                for kind in b.time_by_class}
    return Prediction(cfg, makespan, b.dp_allreduce_ticks, b.memory, [1 - t / makespan for t in busy], by_class,
                      b.tally_rank, [line(x, y) for x, y in zip(a.flops, b.flops)], a.ops + b.ops,
                      a.events + b.events, a.wall_seconds + b.wall_seconds, a.cpu_seconds + b.cpu_seconds,
                      b.result, b.answer_notes, line_through=points)
