"""p14 (sequence parallelism, Megatron TP + SP, 4 ranks): its figures against their formulas, and against plain
tensor parallelism's.

    python bench/bench_sequence_parallel.py

1. Activation memory per rank (what the forward leaves alive for backward, read by the ledger between the forward
   and the backward): the reference against L·(2·E + 8·E/N + ...); plain tensor parallelism (puzzle 4's f and g on
   the whole sequence) against L·(6·E + 4·E/N + ...); the naive answer (plain tensor parallelism in this puzzle's
   setting, gathering the sequence first); Megatron's re-gather (tests/wrong/p14_gathered_again_in_backward.py)
   against L·(10·E/N + ...). The same formulas at N = 2, 4, 8.
2. Bytes each rank sends, forward and backward, against tensor parallelism's all-reduces, measured and by formula.
3. Compute per rank against the serial blocks' work / N (every op counted, measured with sim.tally), the products'
   floor, and what plain tensor parallelism repeats.
4. The makespan on the puzzle's clock (not graded), and the wall time of grading p14.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.backends.learner_code import load_module  # noqa: E402
from grader.backends.simulator import observe  # noqa: E402
from grader.core.grading import one_thread  # noqa: E402
from grader.core.rules import flops, product_flops, sent  # noqa: E402
from grader.frontends.targets import REPO, grade_target  # noqa: E402
from grader.specs import SPECS  # noqa: E402
from grader.specs.p14_sequence_parallel import costs as c  # noqa: E402
from grader.specs.p14_sequence_parallel.layout import B, D, E, F64, H, HEADS, L, N, S  # noqa: E402

SPEC = SPECS["p14"]


def run(path: Path):
    inputs = SPEC.make_inputs(0)
    return observe(SPEC, load_module(path), inputs, 0)


def volume(obs, rank, phase) -> int:
    return sum(b for _, b in sent(obs, rank, phase).values())


def per_block(n: int) -> tuple[int, int, int]:
    """(sequence parallel, plain tensor parallel, Megatron's re-gather) bytes per block and rank at N = n."""
    e_n, hidden, scores = E // n, 2 * B * S * (H // n) * F64, B * (HEADS // n) * S * S * F64
    sp = 2 * E + 8 * e_n + hidden + scores + 2 * B * (S // n) * F64 + S * S
    tp = 6 * E + 4 * e_n + hidden + scores + 2 * B * S * F64 + S * S
    return sp, tp, sp - 2 * E + 2 * e_n


def main() -> None:
    with one_thread():
        ref = run(REPO / "solutions" / SPEC.filename)
        naive = run(REPO / "tests" / "naive" / SPEC.filename)
        regather = run(REPO / "tests" / "wrong" / "p14_gathered_again_in_backward.py")
        tp = c.measured_tensor_parallel(seed=0)
    print(f"# p14 figures (N = {N}, b = {B}, s = {S}, d = {D}, a = {HEADS}, h = {H}, L = {L}; E = b·s·d·8 = {E:,})\n")

    print("## 1. activation memory per rank (bytes the forward leaves alive, the output included)\n")
    print("| answer | measured (rank 0..3) | formula | vs plain TP |")
    print("| --- | --- | --- | --- |")
    sp_f, tp_f, mg_f = per_block(N)
    rows = [("sequence parallel (reference)", [r["held"] for r in ref.results], L * sp_f),
            ("plain tensor parallel (p4's f, g; whole x given)", tp.results, L * tp_f),
            ("naive: plain TP, gathering x first", [r["held"] for r in naive.results], L * tp_f + E // N),
            ("Megatron's re-gather (one all-gather more)", [r["held"] for r in regather.results], L * mg_f)]
    for name, got, formula in rows:
        same = "=" if set(got) == {formula} else "≠"
        print(f"| {name} | {', '.join(f'{g:,}' for g in got)} | {same} {formula:,} | {got[0] / (L * tp_f):.1%} |")
    print(f"\nbudget: {SPEC.budgets(SPEC.make_inputs(0))['activation memory'].value:,} bytes "
          f"(L·{sp_f:,} + E/N + 1 KiB)\n")
    print("by formula, per block and rank, at other N (same b, s, d, a, h):\n")
    print("| N | sequence parallel | plain TP | SP / TP | Megatron's re-gather | / TP |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in (2, 4, 8):
        sp, tpn, mg = per_block(n)
        print(f"| {n} | {sp:,} | {tpn:,} | {sp / tpn:.1%} | {mg:,} | {mg / tpn:.1%} |")

    print("\n## 2. bytes each rank sends\n")
    tp_events = [e.to_dict() for e in tp.events]
    print("| answer | forward | backward | formula |")
    print("| --- | --- | --- | --- |")
    tp_by = {p: sum(e["wire_bytes"] for e in tp_events if e["rank"] == 0 and e["stream"] == "comm"
                    and e["phase"] == p and e["kind"] != "recv") for p in ("forward", "backward")}
    print(f"| plain tensor parallel (2 all-reduces of [b, s, d] a block each way) | {tp_by['forward']:,} | "
          f"{tp_by['backward']:,} | L·2·2(N-1)/N·E = {c.TP_BYTES:,} |")
    print(f"| sequence parallel (reference) | {volume(ref, 0, 'forward'):,} | {volume(ref, 0, 'backward'):,} | "
          f"{c.TP_BYTES:,}; backward + the norms' gradients L·2·2(N-1)/N·d·8 = {c.NORM_GRAD_BYTES:,} |")
    print(f"| Megatron's re-gather | {volume(regather, 0, 'forward'):,} | {volume(regather, 0, 'backward'):,} | "
          f"backward + L·2·(N-1)/N·E = {2 * L * (N - 1) * E // N:,} |")
    print(f"| naive (plain TP gathering x, and dL/dy at the end) | {volume(naive, 0, 'forward'):,} | "
          f"{volume(naive, 0, 'backward'):,} | + (N-1)/N·E = {(N - 1) * E // N:,} each way |")
    print(f"\nreference by kind, rank 0: forward {sent(ref, 0, 'forward')}, backward {sent(ref, 0, 'backward')}")

    print("\n## 3. compute per rank (FLOPs, every op counted)\n")
    serial = c.measured_serial_step().flops
    print(f"serial blocks' step W: measured {serial:,}, closed form {c.SERIAL_FLOPS:,}; W/N + 1 = {c.RANK_WORK:,}\n")
    print("| answer | FLOPs (rank 0) | in products | formula |")
    print("| --- | --- | --- | --- |")
    print(f"| sequence parallel (reference) | {flops(ref, 0):,} | {product_flops(ref, 0):,} | W/N + 1 = "
          f"{c.RANK_WORK:,}; products {c.PRODUCT_FLOPS:,} |")
    print(f"| naive (plain TP) | {flops(naive, 0):,} | {product_flops(naive, 0):,} | + (N-1)/N·L·(34·T·d + 10·T) = "
          f"{c.RANK_WORK + c.REPEATED_TOKEN_WORK:,} |")
    print(f"\nbudget {c.SHARE:,} (W/N + 1 + 4·L·b·s·d), floor {c.PRODUCT_FLOPS:,}")

    print("\n## 4. time (not graded)\n")
    print(f"makespan on the puzzle's clock ({SPEC.cost.describe()}):")
    print(f"  sequence parallel {ref.makespan:,} ticks; plain TP on the whole sequence {tp.makespan:,}; naive "
          f"{naive.makespan:,}; Megatron's re-gather {regather.makespan:,}")
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        [result] = grade_target("solutions", ["p14"], seed=0)
        walls.append(time.perf_counter() - start)
        assert result.status == "pass"
    print(f"  grading p14's reference: median {statistics.median(walls):.2f} s of 3 (in-process)")


if __name__ == "__main__":
    main()
