"""A step at scale read off straight lines through a few small runs, instead of simulating every stage and every
microbatch (predict_by_line, below): what keeps every preset to seconds.

In microbatches. Once the pipeline has filled, the 1F1B schedule repeats the same forward-backward period on
every stage for each further microbatch, and the interleaved schedule for each further group of p: the
makespan, each rank's busy time, its FLOPs and its time by class grow by the same amount per step, and the
first stage holds as many microbatches in flight. From m = p on for 1F1B; from m = 2p for the interleaved
schedule, whose m = p runs every forward first.

In stages. When every stage has nodes of its own (t·D a multiple of the GPUs in a node: every message between
stages crosses the network, as at t = 8), a further stage is one more identical middle stage: it adds the same
time to the pipeline's fill and drain, one more microbatch in flight to the first stage, and (interleaved) one
more exchange to each group. So each figure f of a run of p stages and m microbatches is

    f(p, m) = a(p) + g(p) · (m - m_a(p)) / (m_b(p) - m_a(p))

with a(p) (the run at m_a) and g(p) (what the next m_b - m_a microbatches add) each a straight line in p:
m_a, m_b = p, 2p for 1F1B and 2p, 3p interleaved. For 1F1B, runs at p = 4 and 5 give both lines. The
interleaved schedule's lines hold for pipelines of one parity at a time (measured: going from p to p + 1 stages
alternately adds two amounts that differ by a few hundred ticks, at v = 2 and v = 3 alike), so its runs are at
p0 and p0 + 2, p0 = 4 or 5 as p is even or odd. A further run, two stages past the last of them (6 for 1F1B;
p0 + 4), must lie on the lines to the tick: only then is the step of the real p and m read off them. Where it
misses, the step is read off the line in microbatches at the real p instead, and the prediction says so.
tests/test_scale.py holds the lines to full runs, tick for tick and byte for byte, on pipelines of both
schedules; bench/bench_scale.py --check-line does at GPT-3 175B's size.

What is read off: the makespan; the busy time and FLOPs of the first stage, of every middle stage (all alike)
and of the last; the time by class of a middle stage; the memory of the first, second and last stage (the
first holds the most). The data-parallel all-reduce's exposed time is the largest line run's: it is set by the
stages' last backwards, the same at any p. Where the stages share nodes, or the pipeline is too short to gain,
only the line in microbatches is drawn (at the real p), or the step is simulated whole.
"""

from __future__ import annotations

from fractions import Fraction

from .config import Config
from .runner import Prediction, describe_run, predict, small_config

def stages(p: int, virtual: int) -> tuple[int, int, int]:
    """The small pipelines' lengths for a target of p stages: two for the lines, and the check."""
    if virtual == 1:
        return 4, 5, 6
    first = 4 if p % 2 == 0 else 5
    return first, first + 2, first + 4


def microbatch_points(p: int, virtual: int) -> tuple[int, int]:
    """(m_a, m_b): where the line in microbatches starts, and the next point on it."""
    return (p, 2 * p) if virtual == 1 else (2 * p, 3 * p)


def samples(cfg: Config) -> tuple | None:
    """The (stages, microbatches) of the runs whose lines give cfg's step, or None when simulating cfg itself
    costs no more. With lines in stages, the last is the check (stages())."""
    par = cfg.parallel
    p, m = par.pipeline, par.microbatches
    if cfg.data_parallel == "fsdp":
        return None
    if p == 1:  # no pipeline: each microbatch adds the same forward and backward
        return ((1, 1), (1, 2)) if m > 3 else None
    a, b = microbatch_points(p, par.virtual)
    if m < a:
        return None  # before the line begins
    from .cluster import CLUSTERS

    per_node = CLUSTERS[cfg.cluster].gpus_per_node
    stand_in = cfg.stand_in or par.tensor == 1
    first, second, check = stages(p, par.virtual)
    if stand_in and p > check and (par.tensor * par.data) % per_node == 0:
        return (*((s, x) for s in (first, second) for x in microbatch_points(s, par.virtual)),
                (check, microbatch_points(check, par.virtual)[1]))
    return line_in_microbatches(cfg)


def line_in_microbatches(cfg: Config) -> tuple | None:
    """The two runs at the real p whose line gives cfg's step, or None when that is no cheaper."""
    par = cfg.parallel
    p, m = par.pipeline, par.microbatches
    a, b = microbatch_points(p, par.virtual)
    if m < a or m <= a + b:
        return None
    return ((p, a), (p, b))


def on_the_lines(cfg: Config, runs: dict) -> bool:
    """Whether the check run (the last of samples(cfg)) lies on the lines through the others, to the tick."""
    (check_p, check_m), check = max(runs.items())
    lines = {k: r for k, r in runs.items() if k[0] != check_p}
    target = cfg.but(pipeline=check_p, layers=cfg.model.layers // cfg.parallel.pipeline * check_p,
                     global_batch=check_m * cfg.parallel.microbatch * cfg.parallel.data)
    return all(_read({k: get(r) for k, r in lines.items()}, target) == get(check)
               for get in (lambda r: r.makespan, lambda r: r.busy[0], lambda r: r.busy[1], lambda r: r.busy[-1],
                           lambda r: r.memory[0]["peak"]))


def _line(x1, y1, x2, y2, x) -> Fraction:
    return Fraction(y1) + Fraction(y2 - y1) * (x - x1) / (x2 - x1)


def _read(values: dict, cfg: Config) -> Fraction:
    """One figure at cfg's (p, m) from its values at the sampled (stages, microbatches)."""
    par = cfg.parallel
    p, m = par.pipeline, par.microbatches
    stages = sorted({s for s, _ in values})
    a_p, b_p = microbatch_points(p, par.virtual) if p > 1 else (1, 2)

    def at(s):  # (value at m_a(s), what m_b(s) - m_a(s) more microbatches add)
        a, b = microbatch_points(s, par.virtual) if s > 1 else (1, 2)
        return values[(s, a)], values[(s, b)] - values[(s, a)]

    if len(stages) == 1:
        start, rise = at(stages[0])
    else:
        (s1, (v1, r1)), (s2, (v2, r2)) = [(s, at(s)) for s in stages]
        start, rise = _line(s1, v1, s2, v2, p), _line(s1, r1, s2, r2, p)
    return start + rise * Fraction(m - a_p, b_p - a_p)


def _whole(x: Fraction) -> int:
    return int(x) if x.denominator == 1 else round(x)


def read_off(cfg: Config, runs: dict) -> Prediction:
    """The Prediction of cfg from the runs {(stages, microbatches): Prediction} of samples(cfg). A check run among
    them (on the lines) is no point of them; its cost is counted, and it is named in `checked_against`."""
    par = cfg.parallel
    every = list(runs.values())
    check = ()
    if len({s for s, _ in runs}) > 2:
        check = max(runs)
        runs = {k: r for k, r in runs.items() if k[0] != check[0]}
    last = runs[max(runs)]
    extrapolated = len({s for s, _ in runs}) > 1

    def read(get) -> int:
        return _whole(_read({k: get(r) for k, r in runs.items()}, cfg))

    def rank_roles(r: Prediction):  # (first, middle, last) rank of a run
        n = len(r.busy)
        return 0, min(1, n - 1), n - 1

    makespan = read(lambda r: r.makespan)
    by_class = {kind: {k: read(lambda r: r.time_by_class[kind].get(k, 0)) for k in last.time_by_class[kind]}
                for kind in last.time_by_class}
    if extrapolated:
        roles = [read(lambda r, i=i: r.busy[rank_roles(r)[i]]) for i in range(3)]
        busy = [roles[0]] + [roles[1]] * (par.pipeline - 2) + [roles[2]]
        flop_roles = [read(lambda r, i=i: r.flops[rank_roles(r)[i]]) for i in range(3)]
        flops = [flop_roles[0]] + [flop_roles[1]] * (par.pipeline - 2) + [flop_roles[2]]
        memory = [{k: read(lambda r, i=i, k=k: r.memory[rank_roles(r)[i]][k]) for k in last.memory[0]}
                  for i in range(3)]
        stages = (0, 1, par.pipeline - 1)
        tally_rank = par.pipeline // 2
    else:
        busy = [read(lambda r, i=i: r.busy[i]) for i in range(len(last.busy))]
        flops = [read(lambda r, i=i: r.flops[i]) for i in range(len(last.flops))]
        memory = [{k: read(lambda r, i=i, k=k: r.memory[i][k]) for k in last.memory[0]}
                  for i in range(len(last.memory))]
        stages, tally_rank = last.memory_stages, last.tally_rank
    return Prediction(cfg, makespan, last.dp, memory, busy, by_class, tally_rank, flops,
                      sum(r.ops for r in every), sum(r.events for r in every),
                      sum(r.wall_seconds for r in every), sum(r.cpu_seconds for r in every), last.result,
                      last.answer_notes, line_through=tuple(runs), memory_stages=stages, checked_against=check)


def predict_by_line(cfg: Config, progress=None, **kwargs) -> Prediction:
    """predict(cfg), reading the step off lines through a few smaller runs when that is cheaper (lines.py)."""
    points = samples(cfg)
    if points is None:
        return predict(cfg, progress=progress, **kwargs)
    runs = _simulate(cfg, points, progress, **kwargs)
    if len({s for s, _ in points}) > 2 and not on_the_lines(cfg, runs):  # the pipeline is not yet on its lines
        points = line_in_microbatches(cfg)
        if points is None:
            return predict(cfg, progress=progress, **kwargs)
        prediction = read_off(cfg, _simulate(cfg, points, progress, **kwargs))
        prediction.off_the_lines = True
        return prediction
    return read_off(cfg, runs)


def _simulate(cfg: Config, points, progress, **kwargs) -> dict:
    runs = {}
    sizes = [stages * micro for stages, micro in points]  # a run's work grows as its stages x its microbatches
    for n, (stages, micro) in enumerate(points, 1):
        small = small_config(cfg, stages, micro)
        if progress is not None:
            progress(n, len(points), describe_run(small), sum(sizes[:n - 1]), sum(sizes))
        runs[(stages, micro)] = predict(small, **kwargs)
    return runs
