"""p15's checks beyond the values and memory (memory.py), and what each failure says: the compute
(the tiles the mask leaves, no more), the balance between ranks, the bytes per phase and to whom (round the ring),
and why messages were left exposed on the clock. Wrong values are named by replaying the common mistakes on the
serial attention."""

from __future__ import annotations

import torch

from ...core.compare import safe_diagnosis, tensor_mismatch
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, describe_sent, flops, product_flops, products_short, sent
from ...core.spec import Observation
from .costs import PRODUCT, PROJECTIONS, TILES, block_transfer_ticks
from .serial import DIAGNOSES, KV, N, expected_on, serial

def tiles_seen(chunks) -> int:
    """The tiles a rank's queries see: chunk i sees key chunks 0..i."""
    return sum(c + 1 for c in chunks)


def split_of(obs: Observation) -> list[tuple]:
    return [tuple(r.get("chunks", ())) if isinstance(r, dict) else () for r in obs.results]


def contiguous(split) -> bool:
    return all(sorted(pair) == [2 * r, 2 * r + 1] for r, pair in enumerate(split))


def describe_split(split) -> str:
    tiles = [tiles_seen(pair) for pair in split]
    return (f"the split gives the ranks chunks {', '.join(str(tuple(p)) for p in split)}, whose queries see "
            f"{', '.join(map(str, tiles))} tiles")


def unbalanced_split(split) -> str:
    """Why a split leaves the ranks unequal work, or '' if it does not."""
    tiles = [tiles_seen(pair) for pair in split]
    if len(set(tiles)) <= 1:
        return ""
    if contiguous(split):
        return (f"{describe_split(split)}: a contiguous split. Under the causal mask the first rank's queries see "
                f"almost no keys and the last rank's see them all, so it computes {max(tiles) / min(tiles):.0f}x "
                f"the first's and every rank waits for it. Take chunk i and chunk 2N-1-i: every rank then sees "
                f"2N+1 = {TILES} tiles")
    return (f"{describe_split(split)}: chunk i's queries see i+1 key chunks, so a rank's work is the sum of its two "
            f"chunks' numbers plus 2. Pair the chunks so that the sums are equal: chunk i with chunk 2N-1-i")


# ---- compute and balance


def compute_check(obs: Observation, budget: Budget, least: int) -> Check:
    per_rank = [flops(obs, r) for r in range(obs.world_size)]
    products = [product_flops(obs, r) for r in range(obs.world_size)]
    off = [r for r in range(obs.world_size) if per_rank[r] > budget.value or products[r] < least]
    r = off[0] if off else max(range(obs.world_size), key=per_rank.__getitem__)
    shown = ", ".join(f"{f:,}" for f in per_rank)
    if not off:
        return Check("compute", True, f"rank {r} computed {per_rank[r]:,} FLOPs ({products[r]:,} in products), "
                                      f"within the budget {budget.describe()} FLOPs. Per rank: {shown}",
                     measured=per_rank[r], budget=budget)
    short = products[r] < least
    verdict = (f"with {products[r]:,} in products, below the {least:,} its share needs" if short else
               f"over the budget {budget.describe()}")
    message = f"rank {r} computed {per_rank[r]:,} FLOPs, {verdict}. Per rank: {shown} FLOPs"
    return Check("compute", False, message, measured=per_rank[r], budget=budget,
                 diagnosis=safe_diagnosis(diagnose_compute, obs, r, per_rank[r], products[r], least))


def diagnose_compute(obs: Observation, rank: int, total: int, products: int, least: int) -> str:
    split = split_of(obs)
    unequal = unbalanced_split(split)
    if unequal:
        return unequal
    if products < least:
        if total - products >= least - products:
            return products_short(obs, rank, least)
        return ""
    tiles = (products - PROJECTIONS) / (7 * PRODUCT)
    if tiles >= TILES + 2:
        return (f"rank {rank} computed about {tiles:.0f} tiles' products (7 products of 2·b·c²·d each, forward and "
                f"backward), where the causal mask leaves it {TILES}: it computed tiles the mask empties (a key "
                f"chunk after the query chunk: their chunk > mine), masked, instead of skipping them")
    return ""


def balance_check(obs: Observation, budget: Budget) -> Check:
    per_rank = [flops(obs, r) for r in range(obs.world_size)]
    busiest = max(range(obs.world_size), key=per_rank.__getitem__)
    least = min(range(obs.world_size), key=per_rank.__getitem__)
    spread = per_rank[busiest] / max(per_rank[least], 1) - 1
    ok = spread <= budget.value
    ticks = [obs.busy_ticks(r) for r in range(obs.world_size)]
    if per_rank[busiest] == per_rank[least]:
        message = f"every rank computed {per_rank[0]:,} FLOPs, within the budget {budget.describe()}"
    else:
        message = (f"rank {busiest} computed {per_rank[busiest]:,} FLOPs, {fmt(spread, 'fraction')} more than rank "
                   f"{least}'s {per_rank[least]:,}, {'within' if ok else 'over'} the budget {budget.describe()}. "
                   f"Per rank: {', '.join(f'{f:,}' for f in per_rank)} FLOPs")
    if obs.makespan:
        message += f"; compute on the clock {', '.join(f'{t:,}' for t in ticks)} ticks"
    diagnosis = "" if ok else unbalanced_split(split_of(obs))
    return Check("balance", ok, message, measured=spread, budget=budget, diagnosis=diagnosis)


# ---- communication


def off_ring(obs: Observation, rank: int, phase: str) -> dict[str, int]:
    """What `rank` sent in `phase` other than to its two ring neighbours by send: {"to rank s" or the collective's
    kind: wire bytes}. The K/V blocks travel round the ring, each rank passing on the block it received."""
    neighbours = {(rank + 1) % N, (rank - 1) % N}
    off: dict[str, int] = {}
    for e in obs.events_of(rank, "comm", phase=phase):
        if e["kind"] in ("recv", "new_group", "barrier"):
            continue
        if e["kind"] == "send":
            if int(e["peers"][-1]) in neighbours:
                continue
            key = f"to rank {int(e['peers'][-1])}"
        else:
            key = e["kind"]
        off[key] = off.get(key, 0) + e["wire_bytes"]
    return off


def phase_communication_check(obs: Observation, budget: Budget, phase: str, gradients_right: bool) -> Check:
    """Every rank sent exactly its blocks in `phase` (wire bytes of every send and collective issued then): at
    least the formula, at most the formula + 1 KiB; and round the ring, to its neighbours: in forward every block
    (what is sent elsewhere, by a send or a collective, at most 1 KiB of scalars), in backward the K/V blocks again
    (off the ring at most the N-1 dK/dV blocks, which may go straight home). `gradients_right`: the keys' and
    values' gradients are, which tells blocks kept from the forward (the K/V did not travel again) from dK/dV that
    never travelled."""
    least = budget.value - BOOKKEEPING_BYTES
    by_rank = [sent(obs, r, phase) for r in range(obs.world_size)]
    totals = [sum(b for _, b in k.values()) for k in by_rank]
    strays = [off_ring(obs, r, phase) for r in range(obs.world_size)]
    allowed = BOOKKEEPING_BYTES + (0 if phase == "forward" else (N - 1) * KV)
    wrong = [r for r, t in enumerate(totals) if not least <= t <= budget.value]
    away = [r for r in range(obs.world_size) if sum(strays[r].values()) > allowed]
    off = wrong or away
    r = off[0] if off else max(range(obs.world_size), key=totals.__getitem__)
    where = "outside backward" if phase == "forward" else "inside backward"
    relation = "within" if not wrong else ("below" if totals[r] < least else "over")
    ring = ("every block to a ring neighbour" if phase == "forward" else
            "the K/V blocks to a ring neighbour, the dK/dV there or straight home")
    message = (f"rank {r} sent {fmt(totals[r], 'bytes')} {where} ({describe_sent(by_rank[r])}), {relation} the "
               f"budget {budget.describe()}, at least {least:,}; {ring}: ")
    message += (f"{fmt(sum(strays[r].values()), 'bytes')} went elsewhere ({describe_strays(strays[r])}), "
                f"{'over' if r in away else 'within'} the {allowed:,} allowed" if strays[r] else "all of it did")
    message += f". Per rank: {', '.join(f'{t:,}' for t in totals)} bytes"
    halved = all(2 * sum(b for _, b in sent(obs, q, p).values()) == blocks * KV
                 for q in range(obs.world_size) for p, blocks in (("forward", N - 1), ("backward", 2 * (N - 1))))
    if r in wrong:
        diagnosis = safe_diagnosis(diagnose_bytes, phase, r, by_rank[r], totals[r] - least, gradients_right, halved)
    elif off:
        diagnosis = safe_diagnosis(diagnose_ring, phase, r, strays[r])
    else:
        diagnosis = ""
    return Check(f"{phase} communication", not off, message, measured=totals[r], budget=budget, diagnosis=diagnosis)


def describe_strays(strays: dict[str, int]) -> str:
    return ", ".join(f"{key}: {nbytes:,} bytes" for key, nbytes in sorted(strays.items()))


def diagnose_ring(phase: str, rank: int, strays: dict[str, int]) -> str:
    """Where the blocks went instead of round the ring: straight to far ranks, or by collectives."""
    far = sorted(int(k.split()[-1]) for k in strays if k.startswith("to rank"))
    kinds = sorted(k for k in strays if not k.startswith("to rank"))
    if kinds and not far:
        return (f"rank {rank} moved its blocks with {', '.join(kinds)} instead of passing them round the ring: ring "
                f"attention sends the block it holds to the next rank with isend (and receives the next one from "
                f"the previous rank), one block per step")
    return (f"rank {rank} sent blocks straight to rank(s) {far}, which are not its ring neighbours "
            f"({(rank - 1) % N} and {(rank + 1) % N}): each rank passes on the block it received at the step "
            f"before, so every message crosses one link of the ring. A block sent straight from its owner to rank "
            f"r+s crosses s links of a ring (the same bytes, but on links the ring does not have to spare)"
            + ("" if phase == "forward" else "; in backward the K/V blocks travel the ring again, as in forward"))


def diagnose_bytes(phase: str, rank: int, by_kind, extra: int, gradients_right: bool, halved: bool) -> str:
    """Named from what was sent beyond (or short of) the exact blocks, when a whole block or a whole ring of blocks
    says what; `halved`: the rank sent exactly half its blocks' bytes in both phases."""
    if halved:
        return (f"rank {rank} sent exactly half the bytes of its blocks, in forward and in backward: were they sent "
                f"in float32 (or half precision)? The blocks are float64, as the model is")
    gathered = [k for k in by_kind if k.startswith(("all_gather", "reduce_scatter", "all_reduce", "broadcast"))]
    if phase == "backward" and abs(extra + (N - 1) * KV) <= BOOKKEEPING_BYTES and not gradients_right:
        return (f"rank {rank} sent N-1 blocks in backward, not 2·(N-1), and the keys' and values' gradients are "
                f"wrong: the dK/dV never travelled (see the q/k/v gradients)")
    if phase == "backward" and abs(extra + (N - 1) * KV) <= BOOKKEEPING_BYTES:
        how = (f"K and V were gathered ({', '.join(sorted(gathered))})" if gathered else
               "the forward's blocks were kept for it")
        return (f"rank {rank} sent only the dK/dV blocks in backward, not the K/V blocks again: {how}, so every rank "
                f"held all N K/V blocks through the step. Pass K and V around the ring again in backward, beside "
                f"the dK/dV")
    if abs(extra - KV) <= BOOKKEEPING_BYTES:
        if phase == "forward":
            return (f"rank {rank} sent one K/V block more than N-1: the last step needs no exchange (the block "
                    f"that would arrive is your own)")
        return (f"rank {rank} sent one block more than 2·(N-1) in backward: the dK/dV made N hops. Your own "
                f"queries' part of your own block's gradient need not travel: keep it home, start the travelling "
                f"sum at the next rank, and add what comes back after N-1 hops")
    return ""


# ---- time


def idle_while_messages(obs: Observation) -> str:
    """Where rank 0's compute stream waited for messages: between its forward ops, or its backward ops."""
    compute = sorted(obs.events_of(0, "compute"), key=lambda e: e["start"])
    idle = {"forward": 0, "backward": 0}
    for a, b in zip(compute, compute[1:]):
        idle[b["kind"]] = idle.get(b["kind"], 0) + max(0, b["start"] - a["end"])
    t = block_transfer_ticks()
    phases = [p for p in ("forward", "backward") if idle[p] >= t]
    if not phases:
        return ""
    where = " and ".join(f"{idle[p]:,} ticks in {p}" for p in phases)
    return (f"rank 0's compute sat idle {where}, {sum(idle[p] for p in phases) / t:.1f} blocks' transfers "
            f"(one is {t:,} ticks): its messages did not overlap its tiles. Post the isend of the block you hold and "
            f"the irecv of the next, compute your tiles, and only then wait(); in backward, send each dK/dV on as "
            f"soon as its tiles are done and wait for the sends at the next step")


# ---- values


def diagnose_values(got, expected, inputs, key) -> str:
    """The replayed mistake that every rank's values match, or ''."""
    def same(results, replays, keys) -> bool:
        return all(isinstance(g, dict) and tensor_mismatch(g.get(k), e[k]) is None
                   for g, e in zip(results, replays) for k in keys)

    split = [tuple(g.get("chunks", ())) if isinstance(g, dict) else () for g in got]
    ys = [g.get("y") if isinstance(g, dict) else None for g in got]
    if key == "y" and any(isinstance(y, torch.Tensor) and torch.isnan(y).any() for y in ys):
        return ("y holds NaN: a softmax over keys that are all masked gives 0/0 (exp(-inf - (-inf))), as does "
                "merging two empty results. A tile whose key chunk comes after its query chunk hides every key: "
                "skip it rather than mask it")
    if key != "y" and not same(got, expected, ["y"]):
        return "the output is already wrong (see the output check): fix the forward first"
    # A forward mistake shows in y (its backward may differ from the replay's: what it computed is not what autograd
    # of the replay would); a backward one in the gradients of the inputs and the keys and values.
    variants, keys = ((("diagonal unmasked", "empty tiles attended", "blocks of the wrong rank", "tiles summed"), ["y"])
                      if key == "y" else
                      (("only own queries", "own queries lost"), ["x_grad", "wqkv_grad"]))
    for variant in variants:
        ref = serial(inputs, variant, split)
        replays = [expected_on(ref, inputs, chunks) for chunks in split]
        if same(got, replays, keys):
            return DIAGNOSES[variant]
    if key == "wqkv_grad" and all(isinstance(g, dict) for g in got):
        queries_right = all(tensor_mismatch(_cols(g.get("wqkv_grad"), 0), e["wqkv_grad"][:, :e["wqkv_grad"].shape[0]])
                            is None for g, e in zip(got, expected))
        if queries_right:
            return ("the queries' gradient is right on every rank, the keys' or values' are not: dK and dV go wrong "
                    "on their way home (each block's gradient is the sum of every rank's queries' part)")
    return ""


def _cols(t, i):
    if t is None or not hasattr(t, "shape") or t.dim() != 2 or t.shape[1] != 3 * t.shape[0]:
        return t
    d = t.shape[0]
    return t[:, i * d:(i + 1) * d]
