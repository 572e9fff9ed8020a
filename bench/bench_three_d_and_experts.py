"""Part II's p11 (3-D parallelism, 8 ranks) and p12 (expert parallelism): grading time beside the first eight, and
the simulated figures beside their formulas.

    python bench/bench_three_d_and_experts.py

1. Wall time of grading each reference solution in this process (warm: the median of 5 passes after one pass over
   every puzzle), so that p11's 8 ranks can be compared with the 4-rank puzzles.
2. p11: the pipeline's span and bubble against (m+p-1)·3F and (p-1)/(m+p-1), with free messages (exact) and with
   the graded cost model, for GPipe (the reference) and 1F1B (tests/alternatives); each rank's FLOPs against m·3F,
   its bytes on its tensor-parallel and data-parallel groups against their formulas, its weights against W/(p·t),
   and the peaks of the reference and the naive answer (tensor parallelism by gathering) against the budget.
3. p12: each rank's wire bytes against 2·(S + R)·d·8 plus the counts (the tokens that leave it and the results it
   returns), its FLOPs against the router plus 12·d·h per token it keeps, its compute ticks and the makespan (the
   load imbalance), beside GShard-style dispatch padded to the capacity (tests/wrong/p12_padded_to_capacity.py).
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.backends.learner_code import load_module  # noqa: E402
from grader.backends.simulator import observe  # noqa: E402
from grader.core.rules import sent, sent_on_group  # noqa: E402
from grader.frontends.targets import REPO, grade_target  # noqa: E402
from grader.specs import SPECS  # noqa: E402
from grader.specs.p12_expert_parallel import routing as moe  # noqa: E402
from grader.specs.p11_three_d_parallel import layout  # noqa: E402
from grader.specs.p11_three_d_parallel.spec import PEAK as P11_PEAK  # noqa: E402
from puzzles.sim import CostModel  # noqa: E402


def timed(ids) -> float:
    start = time.perf_counter()
    results = grade_target("solutions", ids, seed=0)
    elapsed = time.perf_counter() - start
    assert all(r.status == "pass" for r in results), [(r.id, r.status) for r in results]
    return elapsed


def grading_times() -> None:
    print("## 1. grading each reference solution (wall seconds, in-process, warm: median of 5)")
    timed(None)
    per = {pid: statistics.median(timed([pid]) for _ in range(5)) for pid in SPECS}
    for pid, t in per.items():
        print(f"  {pid:<4} {SPECS[pid].world_size} ranks  {t:.3f} s")
    first = [t for pid, t in per.items() if pid in {f"p{i}" for i in range(1, 9)}]
    print(f"  the first eight: {min(first):.3f} .. {max(first):.3f} s; all of them together "
          f"{timed(None):.2f} s")


def observe_file(pid: str, path: Path, cost: CostModel | None = None, seed: int = 0):
    spec = copy.copy(SPECS[pid])
    if cost is not None:
        spec.cost = cost
    return observe(spec, load_module(path), spec.make_inputs(seed), seed)


def row(name: str, formula: str, measured: str) -> None:
    print(f"  {name:<62} {formula:>24} {measured:>24}")


def three_d() -> None:
    print("\n## 2. p11: 3-D parallelism, D = 2 replicas x p = 2 stages x t = 2, m = 4 microbatches (seed 0)")
    m, p = layout.M, layout.P
    ideal = (m + p - 1) * (layout.FORWARD + layout.BACKWARD).ticks + m * (layout.LOSS_FORWARD + layout.LOSS_BACKWARD).ticks
    work, formula = layout.STAGE_WORK[p - 1].ticks, Fraction(p - 1, m + p - 1)
    free = CostModel(latency_ticks=0, bytes_per_tick=None)
    row("figure", "formula", "measured")
    for name, path in (("GPipe", REPO / "solutions" / "p11_three_d_parallel.py"),
                       ("1F1B", REPO / "tests" / "alternatives" / "p11_one_f_one_b.py")):
        for cost_name, cost in (("free messages", free), ("graded cost model", None)):
            obs = observe_file("p11", path, cost)
            span = max(e["end"] for e in obs.events_of(stream="compute", kind="backward"))
            row(f"{name} T_pipe (last backward), {cost_name}", f"(m+p-1)(F+BW)+m(LF+LB) = {ideal:,}", f"{span:,} ticks")
            row(f"{name} bubble 1 - W/T_pipe, {cost_name}", f"{formula} = {float(formula):.4f}",
                f"{1 - work / span:.4f}")
    obs = observe_file("p11", REPO / "solutions" / "p11_three_d_parallel.py")
    flops = {sum(e["flops"] for e in obs.events_of(r, "compute")) for r in range(layout.WORLD)}
    tp = {sum(b for _, b in sent_on_group(obs, r, layout.tp_ranks(r)).values()) for r in range(layout.WORLD)}
    dp = {sum(b for _, b in sent_on_group(obs, r, layout.dp_ranks(r)).values()) for r in range(layout.WORLD)}
    inputs = SPECS["p11"].make_inputs(0)
    _, per_rank = SPECS["p11"].launch(inputs)
    weights = {sum(w.numel() * 8 for pair in args[0] for w in pair) for args in per_rank}
    row("FLOPs per rank, at most", f"{layout.SHARE_FLOPS:,}", ", ".join(f"{v:,}" for v in sorted(flops)))
    row("bytes sent on the tensor-parallel group, per rank", f"{layout.TP_BYTES:,}", ", ".join(f"{v:,}" for v in tp))
    row("bytes sent on the data-parallel group, per rank", f"{layout.DP_BYTES:,}", ", ".join(f"{v:,}" for v in dp))
    row("weights held per rank", f"W/(p·t) = {layout.W_RANK:,}", ", ".join(f"{v:,}" for v in weights))
    naive = observe_file("p11", REPO / "tests" / "naive" / "p11_three_d_parallel.py")
    row("peak per rank, reference (largest)", f"budget {P11_PEAK:,}", f"{max(obs.peak_bytes):,} B")
    row("peak per rank, naive: tensor parallelism by gathering", f"budget {P11_PEAK:,}", f"{max(naive.peak_bytes):,} B")
    print(f"  step makespan with the gradients' all-reduce (graded cost model): {obs.makespan:,} ticks")


def experts() -> None:
    print("\n## 3. p12: expert parallelism, 4 ranks, 8 experts, 16 tokens per rank, C = 3 (seed 0)")
    counts = (moe.E - moe.LOCAL) * 8  # the counts' all-to-all: 6 int64 leave each rank
    ref = observe_file("p12", REPO / "solutions" / "p12_expert_parallel.py")
    padded = observe_file("p12", REPO / "tests" / "wrong" / "p12_padded_to_capacity.py")
    print(f"  {'rank':>4} {'S':>3} {'R':>3} {'K':>3} {'2(S+R)·d·8 + counts':>20} {'wire bytes':>11} "
          f"{'router + 12dh·K':>16} {'FLOPs':>10} {'ticks':>6} {'padded: bytes':>14} {'ticks':>6}")
    for r in range(moe.N):
        formula = 2 * (moe.SENT_AWAY[r] + moe.RECEIVED[r]) * moe.ROW + counts
        wire = sum(b for _, b in sent(ref, r).values())
        compute = moe.ROUTER_FLOPS + moe.KEPT_ON[r] * moe.TOKEN_FLOPS  # the products
        flops = sum(e["product_flops"] for e in ref.events_of(r, "compute"))
        print(f"  {r:>4} {moe.SENT_AWAY[r]:>3} {moe.RECEIVED[r]:>3} {moe.KEPT_ON[r]:>3} {formula:>20,} {wire:>11,} "
              f"{compute:>16,} {flops:>10,} {ref.busy_ticks(r):>6,} {sum(b for _, b in sent(padded, r).values()):>14,} "
              f"{padded.busy_ticks(r):>6,}")
    print(f"  makespan: {ref.makespan:,} ticks (the busiest rank computes {ref.busy_ticks(0):,}); padded to the "
          f"capacity: {padded.makespan:,} ticks, every rank computing N·2·C = 24 rows")


if __name__ == "__main__":
    torch.set_num_threads(2)
    print(f"# bench_three_d_and_experts.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch "
          f"{torch.__version__}, {torch.get_num_threads()} intra-op threads")
    started = time.perf_counter()
    grading_times()
    three_d()
    experts()
    print(f"\ntotal bench time: {time.perf_counter() - started:.1f} s")
