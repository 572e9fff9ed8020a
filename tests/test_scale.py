"""`python -m grader predict`: the step at scale held to hand-derived formulas on small configurations.

A device that charges products their FLOPs (one a tick) and every other op nothing makes the step's time a sum
one can write down: per layer and microbatch, forward 24·s·b·h² + 4·b·s²·h FLOPs (the four products, the
scores and the weighted values), backward twice that, the head 2·s·b·h·V forward. The memory ledger's
activations are the paper's formulas plus what the norms keep besides (mean and 1/rms in float32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from grader.predictor.fast_meta import MEMOIZED, remembered_meta_kernels
from grader.predictor.runner import line_points, placement, predict, predict_by_line
from grader.predictor import formulas
from grader.predictor.config import Config, Model, Parallel
from grader.predictor.presets import megatron, presets
from grader.predictor.schedule import order
from grader.predictor.cluster import DGX_A100, Cluster, ClusterCostModel, Link, Placement
from puzzles.simulator.cost import PUZZLE_GPU, DeviceProfile, Efficiency
from grader.predictor.devices import A100_80GB, A100_80GB_CALCULON, A100_MATRIX_FRACTION
from puzzles.simulator.op_costs import PRODUCTS, OpCost


@dataclass(frozen=True)
class ProductsOnly(DeviceProfile):
    """A test double: a product costs its FLOPs in ticks, anything else nothing."""

    def compute_ticks(self, cost, dtype=None):
        return cost.flops if cost.kind in PRODUCTS else 0


DEVICE = ProductsOnly("products only", 1, 1, 0)
FREE = Link("free", None, Fraction(1), 0)
NVLINK = Link("nvlink", 300, Fraction("0.6"), 1000)
S, B, H, A, V = 64, 2, 32, 4, 128  # sequence, microbatch, hidden, heads, vocabulary


def tiny(layers=2, **parallel) -> Config:
    extra = {k: parallel.pop(k) for k in ("recompute", "dropout", "simulate_tensor_ranks") if k in parallel}
    return Config(Model("tiny", layers=layers, hidden=H, heads=A, seq=S, vocab=V), Parallel(**parallel),
                  **{"dropout": 0.0, **extra})


def layer_flops(t: int = 1) -> int:
    return (24 * S * B * H * H + 4 * B * S * S * H) // t


def head_flops(t: int = 1) -> int:
    return 2 * S * B * H * V // t


def test_one_f_one_b_on_two_stages_takes_its_formula():
    """p = 2, m = 3, free messages: stage 1 (a layer and the head) is the slower, so it runs without a gap once
    its first input arrives: f0 + m·(f1 + b1) + b0."""
    m = 3
    cfg = tiny(layers=2, pipeline=2, microbatch=B, global_batch=B * m)
    p = predict(cfg, cluster=Cluster("free", DEVICE, 1 << 40, 8, FREE, FREE))
    f0, f1 = layer_flops(), layer_flops() + head_flops()
    assert p.makespan == f0 + m * (f1 + 2 * f1) + 2 * f0


def test_tensor_parallel_step_takes_its_formula():
    """p = 1, t = 4 (one rank stands for the group), no overlap: the step is its compute plus every all-reduce,
    each 2(t-1)·alpha + 2(t-1)/t·n/beta: per microbatch, forward the embedding's and two per layer of [s, b, h]
    and the loss's three of [s·b] float32; backward the head's and two per layer; then the optimizer's two
    scalars."""
    t, m, layers = 4, 3, 2
    cfg = tiny(layers=layers, tensor=t, microbatch=B, global_batch=B * m)
    p = predict(cfg, cluster=Cluster("nvlink", DEVICE, 1 << 40, 8, NVLINK, NVLINK))

    def all_reduce(nbytes):
        return 2 * (t - 1) * 1000 + math.ceil(Fraction(2 * (t - 1) * nbytes, t) / (300 * Fraction("0.6")))

    activation = 2 * S * B * H  # [s, b, h] in float16
    compute = m * 3 * (layers * layer_flops(t) + head_flops(t))
    comm = m * (2 * (1 + 2 * layers) * all_reduce(activation) + 3 * all_reduce(4 * S * B)) + 2 * all_reduce(4)
    assert p.makespan == compute + comm


@pytest.mark.parametrize("t, sp, recompute, p, v", [
    (1, False, "none", 1, 1), (4, False, "none", 2, 1), (4, True, "none", 2, 2), (4, True, "selective", 2, 1),
    (4, False, "selective", 2, 2), (4, False, "full", 2, 2), (4, True, "full", 1, 1)])
def test_activations_are_the_papers_formulas(t, sp, recompute, p, v):
    """What the first stage's layers keep is Korthikanti et al.'s count (formulas.py) for the microbatches it
    holds, plus 16·s·b bytes a layer (/t under SP) for the norms' mean and 1/rms, which the paper leaves out;
    full recomputation keeps the layers' inputs alone."""
    cfg = tiny(layers=4, tensor=t, pipeline=p, virtual=v, microbatch=B, global_batch=B * 4, sequence_parallel=sp,
               recompute=recompute, dropout=0.1)
    pred = predict(cfg, cluster=Cluster("free", DEVICE, 1 << 40, 8, FREE, FREE))
    norms = 0 if recompute == "full" else 16 * S * B // (t if sp else 1)
    expected = formulas.activation_bytes(cfg) + norms * formulas.layers_in_flight(cfg)
    assert pred.memory[0]["layer_activations"] == expected


def test_weights_gradients_and_optimizer_state_are_18_bytes_a_weight():
    cfg = tiny(layers=4, tensor=4, pipeline=2, microbatch=B, global_batch=B * 2)
    pred = predict(cfg, cluster=Cluster("free", DEVICE, 1 << 40, 8, FREE, FREE))
    layer = (12 * H * H + 7 * H) // 4 + 6 * H  # the products and their biases (qkv, fc1), split; norms, 2 biases
    first = 2 * layer + (V // 4) * H + S * H  # two layers, the word embedding's share, the positions
    last = 2 * layer + (V // 4) * H + 2 * H  # two layers, the tied word embedding, the final norm
    assert [(m["weights"], m["gradients"], m["optimizer"]) for m in pred.memory] == [
        (2 * n, 4 * n, 12 * n) for n in (first, last)]


def test_remembered_meta_kernels_change_nothing_but_the_time_they_take():
    cfg = tiny(layers=2, tensor=2, pipeline=2, virtual=1, microbatch=B, global_batch=B * 2, sequence_parallel=True,
               recompute="selective", dropout=0.1)
    from puzzles import sim
    from grader.predictor.runner import cost_model
    from grader.predictor.step import gpt_step

    runs = []
    for remember in (False, True):
        if remember:
            with remembered_meta_kernels() as kernels:
                result = sim.run(gpt_step, cfg.simulated_ranks, args=(cfg,), cost=cost_model(cfg), timeout=120)
            assert sum(k.calls for k in kernels.values()) > sum(k.misses for k in kernels.values()) > 0
        else:
            result = sim.run(gpt_step, cfg.simulated_ranks, args=(cfg,), cost=cost_model(cfg), timeout=120)
        runs.append(([(e.rank, e.stream, e.kind, e.start, e.end, e.flops, e.bytes) for e in result.events],
                     [l.timeline for l in result.ledgers]))
    assert runs[0] == runs[1]
    # and torch's own kernels are back afterwards
    x = torch.empty(3, 5, device="meta", dtype=torch.float16)
    assert torch.nn.functional.layer_norm(x, (5,)).shape == (3, 5)
    assert all(not isinstance(op.py_kernels.get(torch._C.DispatchKey.Meta), type(None)) for op in MEMOIZED[:3])


@pytest.mark.parametrize("virtual, tensor, sp", [(1, 2, True), (2, 1, False)])
def test_the_line_through_two_runs_is_the_full_run_tick_for_tick(virtual, tensor, sp):
    """bench/SCALE.md's large runs simulate m1 and m2 microbatches and read m off the line through them: on the
    A100 cluster (messages cost time, the stages differ: the embedding and the head), with 1F1B and the
    interleaved schedule, the line is the full run's step, busy time, FLOPs and memory exactly."""
    m = 9 if virtual == 1 else 14  # past m1 + m2, and not on a multiple of p for 1F1B
    cfg = tiny(layers=4, tensor=tensor, pipeline=2, virtual=virtual, microbatch=B, global_batch=B * m,
               sequence_parallel=sp, recompute="selective", simulate_tensor_ranks="all")
    assert line_points(cfg) == ((2, 4) if virtual == 1 else (4, 6))
    full, line = predict(cfg), predict_by_line(cfg)
    assert line.line_through and not full.line_through
    assert (line.makespan, line.flops, line.memory) == (full.makespan, full.flops, full.memory)
    assert [round(b, 12) for b in line.bubble] == [round(b, 12) for b in full.bubble]
    assert line.time_by_class == full.time_by_class
    assert line.ops < full.ops


def test_the_line_is_not_drawn_where_it_saves_nothing():
    assert line_points(tiny(layers=2, pipeline=2, microbatch=B, global_batch=B * 6)) is None  # m = p + 2p
    assert line_points(megatron("22B", "seqsel")) is None  # one stage
    assert line_points(megatron("1T", "full")) == (64, 128)
    assert line_points(megatron("530B", "full")) == (70, 105)


def test_the_first_run_of_a_process_holds_what_later_runs_hold():
    """A fresh interpreter (this one has imported everything already): torch's lazy imports on a meta kernel's
    first call once left cycles that held tensors, so the first prediction of a process held more memory."""
    import subprocess
    import sys

    code = ("from grader.predictor.runner import predict\n"
            "from grader.predictor.presets import megatron\n"
            "from grader.predictor.presets import torchtitan_llama8b\n"
            "cfgs = [torchtitan_llama8b().but(layers=2, seq=512),\n"
            "        megatron('22B', 'seqsel').but(layers=2, global_batch=4)]\n"
            "print([[predict(cfg).memory for _ in range(2)] for cfg in cfgs])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    for first, second in eval(out.stdout):  # torchtitan's Llama, Megatron's GPT
        assert first == second


def test_the_interleaved_schedule_is_megatrons():
    """Narayanan et al. 2021, Figure 4: p = 4, v = 2, m = 8; rank 0 runs F1-F4 on chunk 1, F1-F4 on chunk 2,
    F5-F6, then one forward and one backward at a time (here 0-based, chunk 2 as '.1')."""
    assert " ".join(map(str, order(0, 4, 2, 8)[:14])) == "F0 F1 F2 F3 F0.1 F1.1 F2.1 F3.1 F4 F5 F6 B0.1 F7 B1.1"
    assert " ".join(map(str, order(3, 4, 1, 6))) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"
    assert " ".join(map(str, order(0, 4, 1, 6))) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"


def test_efficiency_curves_charge_a_product_at_its_size():
    gemm = OpCost(flops=200 * 10**9, bytes=10**6, kind="matmul")  # >= 128 GFLOP: Calculon's 0.95
    assert A100_80GB_CALCULON.compute_ticks(gemm, torch.float16) == math.ceil(
        gemm.flops / (312_000 * Fraction("0.95")))
    assert A100_80GB.compute_ticks(gemm, torch.float16) == math.ceil(
        gemm.flops / (312_000 * Fraction("0.95") * A100_MATRIX_FRACTION))
    copy = OpCost(flops=0, bytes=50 * 10**6, kind="memory")  # 50 MB: 0.75 of 2,039 GB/s
    assert A100_80GB.compute_ticks(copy, torch.float16) == math.ceil(copy.bytes / (2039 * Fraction("0.75")))
    small = OpCost(flops=10**6, bytes=10, kind="elementwise")  # a vector op under 1 GFLOP: 0.1 of 78 TFLOP/s
    assert A100_80GB.compute_ticks(small, torch.float16) == math.ceil(small.flops / (78_000 * Fraction("0.1")))
    with pytest.raises(ValueError):
        Efficiency(((1, "0.5"),), ((0, "1"),), ((0, "1"),))  # a curve must reach down to 0
    # the puzzles' GPU is untouched: the plain roofline
    assert PUZZLE_GPU.efficiency is None
    assert PUZZLE_GPU.compute_ticks(OpCost(2048, 4096, "matmul"), torch.float64) == 2 + 4


def test_a_collective_costs_the_slowest_link_its_group_crosses():
    cost = ClusterCostModel(cluster=DGX_A100, placement=Placement((0, 8, 16)))
    nbytes = 10**8
    inside = NVLINK_A100 = DGX_A100.nvlink.network(DGX_A100.device)
    across = DGX_A100.network.network(DGX_A100.device)
    assert cost.comm_ticks("send", nbytes, 2, ranks=(0, 1)) == across.comm_ticks("send", nbytes, 2)
    one_node = ClusterCostModel(cluster=DGX_A100, placement=Placement(tuple(range(8))))
    assert one_node.comm_ticks("all_reduce", nbytes, 8, ranks=tuple(range(8))) == inside.comm_ticks(
        "all_reduce", nbytes, 8)
    assert NVLINK_A100.bytes_per_tick == 180  # 300 GB/s at 0.6
    # a rank standing for its tensor-parallel group: its group of one is the node's 8 GPUs, its own piece of an
    # all-gather one eighth of what the group moves
    stand_in = ClusterCostModel(cluster=DGX_A100, placement=Placement((0, 8), stand_in=8))
    assert stand_in.comm_ticks("all_gather_into_tensor", nbytes, 1, ranks=(0,)) == inside.comm_ticks(
        "all_gather_into_tensor", 8 * nbytes, 8)
    assert stand_in.comm_ticks("all_reduce", nbytes, 1, ranks=(1,)) == inside.comm_ticks("all_reduce", nbytes, 8)
    assert stand_in.wire_bytes("all_reduce", nbytes, 1, ranks=(1,)) == 2 * 7 * nbytes // 8


def test_ranks_sit_where_megatron_puts_them():
    cfg = megatron("175B", "seqsel")
    assert placement(cfg) == Placement(tuple(8 * s for s in range(8)), stand_in=8)
    assert placement(cfg.but(simulate_tensor_ranks="all", data=2, global_batch=128)).gpus[:10] == (
        0, 1, 2, 3, 4, 5, 6, 7, 16, 17)


def test_presets_are_the_papers_configurations():
    runs = presets()
    assert runs["megatron-530b-seqsel"].parallel.microbatches == 280
    assert runs["megatron-1t-full"].layers_per_chunk == 2
    assert float(formulas.activation_bytes(megatron("175B", "seqsel"))) / 2**30 == 12.3515625  # Figure 1
    assert float(formulas.activation_bytes(megatron("1T", "none"))) / 2**30 == 131.25
    assert 18 * formulas.layer_weights_per_gpu(megatron("530B", "full")) / 2**30 == 31.640625


def test_an_impossible_configuration_says_why():
    with pytest.raises(ValueError, match="split into p·v"):
        tiny(layers=3, pipeline=2, microbatch=B, global_batch=B)
    with pytest.raises(ValueError, match="groups of p"):
        tiny(layers=4, pipeline=2, virtual=2, microbatch=B, global_batch=3 * B)
