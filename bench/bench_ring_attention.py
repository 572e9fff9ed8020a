"""p15 (context parallelism, ring attention): the simulated figures beside the formulas the puzzle states.

    python bench/bench_ring_attention.py

1. Overlap. The makespan against C + one block's transfer (2·(alpha + Q/beta)), for the reference, the all-gather
   naive answer (2(N-1) blocks' transfers exposed) and the answer that waits for each exchange at once.
2. Balance. Each rank's tiles, FLOPs and compute ticks with chunks i and 2N-1-i (the reference), against a
   contiguous split (tests/wrong/p15_contiguous_split.py: rank r sees 4r+3 tiles).
3. Bytes. Each rank's wire bytes in forward and in backward against (N-1)·KV and 2·(N-1)·KV.
4. Memory, O(S/N). The reference and the naive answer at other world sizes and sequence lengths than the graded
   ones (the same files, run by a harness of this script's): the received K/V data held at a message, what the
   forward keeps for backward and the peak, against a K/V block of that size. The ring holds 2 blocks whatever N;
   the all-gather holds N.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.backends.learner_code import load_module  # noqa: E402
from grader.backends.simulator import observe  # noqa: E402
from grader.core.probe import memory_now  # noqa: E402
from grader.core.rules import exposed_communication, flops, sent  # noqa: E402
from grader.frontends.targets import REPO  # noqa: E402
from grader.specs import SPECS  # noqa: E402
from grader.specs.p15_ring_attention import serial  # noqa: E402
from grader.specs.p15_ring_attention.received_blocks import most_held, watched  # noqa: E402
from grader.specs.p15_ring_attention.checks import tiles_seen  # noqa: E402
from grader.specs.p15_ring_attention.costs import block_transfer_ticks, share  # noqa: E402
from puzzles import model, sim  # noqa: E402

SPEC = SPECS["p15"]
REFERENCE = REPO / "solutions" / SPEC.filename
NAIVE = REPO / "tests" / "naive" / SPEC.filename
WRONG = REPO / "tests" / "wrong"


def graded(path: Path, seed: int = 0):
    return observe(SPEC, load_module(path), SPEC.make_inputs(seed), seed)


def overlap() -> None:
    c, t = share().ticks, block_transfer_ticks()
    print(f"## 1. overlap: makespan against C + one block's transfer (C = {c:,} ticks, a block {t:,} ticks)")
    print(f"  {'answer':<28}{'compute':>9}{'makespan':>10}{'exposed':>9}{'in blocks':>11}{'C + block':>11}")
    for name, path in (("reference", REFERENCE), ("naive (all-gather)", NAIVE),
                       ("wait at once", WRONG / "p15_wait_before_compute.py")):
        obs = graded(path)
        compute, _, exposed = exposed_communication(obs, c)
        print(f"  {name:<28}{compute:>9,}{obs.makespan:>10,}{exposed:>9,}{exposed / t:>11.2f}{c + t:>11,}")


def balance() -> None:
    print("\n## 2. balance: each rank's work, chunks i and 2N-1-i against a contiguous split")
    for name, path in (("load balanced", REFERENCE), ("contiguous", WRONG / "p15_contiguous_split.py")):
        obs = graded(path)
        chunks = [tuple(r["chunks"]) for r in obs.results]
        per = [flops(obs, r) for r in range(serial.N)]
        print(f"  {name}: chunks {chunks}")
        print(f"    tiles seen  {[tiles_seen(c) for c in chunks]}  (formula: 2N+1 = {2 * serial.N + 1} each; "
              f"contiguous 4r+3)")
        print(f"    FLOPs       {[f'{f:,}' for f in per]}  spread {max(per) / min(per) - 1:.1%}")
        print(f"    ticks       {[f'{obs.busy_ticks(r):,}' for r in range(serial.N)]}  makespan {obs.makespan:,}")


def volume() -> None:
    obs = graded(REFERENCE)
    kv = serial.KV
    print(f"\n## 3. bytes: exactly N-1 K/V blocks each way (KV = {kv:,} bytes)")
    for r in range(serial.N):
        fwd = sum(b for _, b in sent(obs, r, "forward").values())
        bwd = sum(b for _, b in sent(obs, r, "backward").values())
        print(f"  rank {r}: forward {fwd:,} = {fwd / kv:g}·KV (formula (N-1)·KV = {(serial.N - 1) * kv:,}); "
              f"backward {bwd:,} = {bwd / kv:g}·KV (formula 2·(N-1)·KV = {2 * (serial.N - 1) * kv:,})")


def scaled_run(path: Path, world: int, seq: int):
    """The answer at `world` ranks and a sequence of `seq` tokens (the puzzle's b, d and heads), each rank making
    its own two chunks as the grader's harness does. Returns (received held in forward, in backward, kept, peak)."""
    module = load_module(path)
    chunk = seq // (2 * world)
    g = torch.Generator().manual_seed(0)
    weights = model.init_transformer(1, serial.D, 4 * serial.D, 0, requires_grad=False)[0]
    pieces = [torch.randn(serial.B, chunk, serial.D, generator=g, dtype=model.DTYPE) for _ in range(2 * world)]

    def run(dist, wqkv, wo, x):
        x.requires_grad_()
        watch, records = watched(dist)
        before = memory_now()
        y = module.context_parallel_attention(watch, x, wqkv.requires_grad_(), wo.requires_grad_(), serial.HEADS)
        kept = memory_now() - before
        y.square().sum().backward()
        return most_held(records.held, "forward")[0], most_held(records.held, "backward")[0], kept

    rank_args = [(torch.cat([pieces[c] for c in module.load_balanced_chunks(r, world)], dim=1),)
                 for r in range(world)]
    result = sim.run(run, world, args=(weights.wqkv, weights.wo), rank_args=rank_args, cost=serial.COST,
                     library_files=[model.__file__])
    fwd, bwd, kept = result.results[0]
    return fwd, bwd, kept, max(result.peak_bytes)


def memory() -> None:
    print("\n## 4. memory O(S/N): received K/V data held at a message, what the forward keeps, the peak")
    print(f"  {'answer':<10}{'N':>3}{'S':>6}{'KV block':>10}{'held fwd':>10}{'(blocks)':>9}{'held bwd':>10}"
          f"{'(blocks)':>9}{'kept':>10}{'peak':>11}")
    for world, seq in ((2, 384), (4, 384), (8, 384), (4, 768), (8, 768)):
        kv = 2 * serial.B * (seq // world) * serial.D * 8
        for name, path in (("ring", REFERENCE), ("all-gather", NAIVE)):
            fwd, bwd, kept, peak = scaled_run(path, world, seq)
            print(f"  {name:<10}{world:>3}{seq:>6}{kv:>10,}{fwd:>10,}{fwd / kv:>9.2f}{bwd:>10,}{bwd / kv:>9.2f}"
                  f"{kept:>10,}{peak:>11,}")


if __name__ == "__main__":
    overlap()
    balance()
    volume()
    memory()
