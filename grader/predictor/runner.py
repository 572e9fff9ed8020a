"""Run a training step at scale on the simulator and read a prediction off it.

    prediction = predict(config)            # one simulated step of config.py's configuration
    prediction = predict_by_line(config)    # the same, read off a few cheaper runs (lines.py, which has it)

One replica of the configuration is simulated (its t·p GPUs, or p ranks that each stand for their tensor-parallel
group), on meta tensors, with the cluster's cost model (cluster.py) placing each rank on its GPU the way
Megatron-LM numbers them (gpu = tp + t·dp + t·D·stage). The data-parallel replicas' gradient all-reduce is read
off the simulated timeline by data_parallel.py's formula; FSDP's communication is simulated.

Both take `progress`, a callable given (run, runs, what, done, total) before each simulated run (what: "3
stages, 6 microbatches"; done and total: the work of the runs before this one and of all of them, in stages x
microbatches, which a run's ops grow with), for a front end that shows how far a prediction has got and how long
the rest will take. A prediction whose pipeline is not yet on its lines in stages calls it again from run 1 for
the runs that replace them.
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
from .data_parallel import Reduction, reduction
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

    step_ticks:        the step's time: the simulated makespan, plus what the step waits for the data-parallel
                       gradient all-reduce (data_parallel.py)
    memory:            per pipeline stage in `memory_stages` (every simulated rank's, unless the step was read
                       off lines through smaller pipelines: then the first, second and last stage's):
                       {"weights", "gradients", "optimizer", "activations", "layer_activations", "peak"} in bytes
                       (activations: the most the rank held after a forward, beyond its weights and states;
                       layer_activations: of those, what the transformer layers keep, the papers' formulas'
                       count, without the embedding's and the loss's tensors)
    busy:              per rank (per stage when read off lines), the ticks its compute stream worked
    time_by_class:     compute ticks by op class on the rank that counted them (`tally_rank`), and
                       communication ticks by kind on that rank
    """

    config: Config
    makespan: int
    dp: Reduction
    memory: list
    busy: list
    time_by_class: dict
    tally_rank: int
    flops: list
    ops: int
    events: int
    wall_seconds: float
    cpu_seconds: float
    result: object = field(repr=False, default=None)  # the SimResult
    answer_notes: list = field(default_factory=list)  # which parts of the step were the learner's
    # the smaller runs the step was read off ((stages, microbatches), ...; lines.py), and the run that checked
    # the lines in stages; then ops, events, wall and CPU are all of theirs together, `result` the last line run's
    line_through: tuple = ()
    memory_stages: tuple = ()
    checked_against: tuple = ()
    off_the_lines: bool = False  # the check run missed the lines in stages: read at the real p instead

    @property
    def step_ticks(self) -> int:
        return self.makespan + self.dp.exposed

    @property
    def step_seconds(self) -> float:
        return self.step_ticks / 1e9

    @property
    def bubble(self) -> list:
        """Per rank, the share of the makespan its compute stream sat idle."""
        return [1 - b / self.makespan for b in self.busy]

    @property
    def mfu(self) -> float:
        device = CLUSTERS[self.config.cluster].device if self.result is None else self.result.cost.device
        peak = device.flops_per_tick * device.half_precision_speedup  # FLOPs per tick (per ns)
        return float(formulas.model_flops(self.config) / (self.step_ticks * peak * self.config.parallel.gpus))


def predict(cfg: Config, tally_rank: int | None = None, timeout: float = 3600.0, ops=None,
            answer_notes=(), cluster=None, progress=None) -> Prediction:
    """Simulate one step of `cfg`. `ops`: the learner's tensor- or sequence-parallel operators to use in the
    layers (answers.py), None for the reference's; `answer_notes` say which were used;
    `cluster`: another cluster than cfg's (a Cluster); `progress`: module docstring."""
    cost = cost_model(cfg, cluster)
    ranks = cfg.simulated_ranks
    per_stage = 1 if cfg.stand_in or cfg.data_parallel == "fsdp" else cfg.parallel.tensor
    if tally_rank is None:  # a middle stage: layers only, neither the embedding nor the head
        tally_rank = (cfg.parallel.pipeline // 2) * per_stage
    if cfg.data_parallel == "fsdp":
        program, args = llama_step, (cfg, cost, 0)
    else:
        program, args = gpt_step, (cfg, cost, tally_rank, ops)
    if progress is not None:
        par = cfg.parallel
        progress(1, 1, describe_run(cfg), 0, par.pipeline * par.microbatches)
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
    comm = Counter()
    for e in result.events_of(tally_rank, "comm"):
        comm[e.kind] += e.ticks
    tally = figures[tally_rank].tally
    time_by_class = {"compute": dict(tally.get("ticks", {})), "communication": dict(comm)}
    compute_events = result.events_of(stream="compute")
    dp = reduction(cfg, cost, result, figures, stage_of=lambda rank: rank // per_stage)
    return Prediction(cfg, result.makespan, dp, memory, [result.busy_ticks(r) for r in range(ranks)],
                      time_by_class, tally_rank, list(result.flops), sum(e.ops for e in compute_events),
                      len(result.events), wall, cpu, result, list(answer_notes),
                      memory_stages=tuple(r // per_stage for r in range(ranks)))


def describe_run(cfg: Config) -> str:
    par = cfg.parallel
    stages = f"{par.pipeline} stage{'s' * (par.pipeline > 1)}, " if par.pipeline > 1 else ""
    return f"{stages}{par.microbatches} microbatch{'es' * (par.microbatches > 1)}"


def small_config(cfg: Config, stages: int, microbatches: int) -> Config:
    """cfg with `stages` pipeline stages of the same layers each and `microbatches` microbatches a replica."""
    par = cfg.parallel
    layers = cfg.model.layers // par.pipeline * stages
    return cfg.but(pipeline=stages, layers=layers, global_batch=microbatches * par.microbatch * par.data)
