"""p15's memory rules, and what each failure says: the other ranks' K/V blocks alive at each message (at most two,
received_blocks.py notes them), what the forward keeps for the backward (its activations: no scores, no other
rank's block), and the peak (O(S/N) and one step's scores)."""

from __future__ import annotations

from ...core.compare import safe_diagnosis
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES
from ...core.spec import Observation
from .received_blocks import most_held
from .serial import CHUNKS, KV, LSE, N, TILE, Q

KEPT_BY_REFERENCE = 6 * Q + LSE  # q, k, v, out, the merged heads, y; and lse


def blocks_check(obs: Observation, forward: Budget, backward: Budget) -> Check:
    """At every message, the received data still alive: at most 2 K/V blocks outside backward, 2 K/V and 2 dK/dV
    blocks in it."""
    held = [r.get("held", []) if isinstance(r, dict) else [] for r in obs.results]
    worst = [(most_held(h, "forward")[0], most_held(h, "backward")[0]) for h in held]
    over = [r for r, (f, b) in enumerate(worst) if f > forward.value or b > backward.value]
    r = over[0] if over else max(range(obs.world_size), key=lambda q: worst[q])
    f, b = worst[r]
    message = (f"rank {r} held at most {fmt(f, 'bytes')} of other ranks' data at a message outside backward "
               f"({f / KV:.2f} K/V blocks; budget {forward.describe()}) and {fmt(b, 'bytes')} in backward "
               f"({b / KV:.2f} blocks; budget {backward.describe()})")
    if not over:
        return Check("K/V blocks", True, message, measured=f, budget=forward)
    return Check("K/V blocks", False, message, measured=f if f > forward.value else b,
                 budget=forward if f > forward.value else backward,
                 diagnosis=safe_diagnosis(diagnose_blocks, obs, r, f > forward.value))


def diagnose_blocks(obs: Observation, rank: int, in_forward: bool) -> str:
    kinds = {e["kind"] for e in obs.events_of(rank, "comm")}
    gathered = sorted(k for k in kinds if k.startswith("all_gather") or k in ("broadcast", "all_to_all",
                                                                             "all_to_all_single"))
    if gathered:
        return (f"rank {rank} gathered every rank's keys and values ({', '.join(gathered)}): all N blocks at once, "
                f"N·KV = {fmt(N * KV, 'bytes')}, and a memory that grows with the sequence. Pass the blocks around "
                f"the ring instead, holding only the one you compute with and the one arriving")
    if in_forward:
        records = obs.results[rank]["held"]
        held = max(h["held"] for h in records if h["phase"] == "forward")
        # What was received in forward and is still alive at backward's first message: blocks kept for backward.
        carried = next((h["held"] for h in records if h["phase"] == "backward"), 0)
        if abs(held - 3 * KV) <= BOOKKEEPING_BYTES and carried < 2 * KV:
            return (f"rank {rank} held three received K/V blocks at a message: when the next exchange started, the "
                    f"block before the one it computes with was still referenced, by a name that outlived its step "
                    f"(a view or chunk of it, a list of finished handles, a tuple that holds it). Let go of what "
                    f"you are done with before the next exchange (rebind or del it, or compute a step in a helper "
                    f"function whose names die when it returns)")
        return (f"rank {rank} kept the K/V blocks it received (for the backward?): each is needed for one step, "
                f"then only passed on. Let it go once sent, and pass the blocks around the ring again in backward")
    return (f"rank {rank} kept received blocks alive in backward beyond the K/V block it computes with, the one "
            f"arriving, and the dK/dV that travel: were dK/dV gathered, or kept after being sent on?")


def memory_check(obs: Observation, budget: Budget) -> Check:
    over = [(r, p) for r, p in enumerate(obs.peak_bytes) if p > budget.value]
    if not over:
        worst = max(obs.peak_bytes)
        return Check("peak memory", True, f"largest peak {fmt(worst, 'bytes')}, within the budget "
                                          f"{budget.describe()}", measured=worst, budget=budget)
    r, peak = max(over, key=lambda x: x[1])
    top = obs.ledgers[r].get("peak_by_line", [])[:3]
    lines = "; ".join(f"{e['site']} ({fmt(e['bytes'], 'bytes')})" for e in top)
    diagnosis = ""
    if any(e["kind"].startswith("all_gather") for e in obs.events_of(r, "comm")):
        diagnosis = diagnose_blocks(obs, r, True)
    elif peak - budget.value >= 2 * TILE:
        diagnosis = (f"rank {r} held {fmt(peak - budget.value, 'bytes')} more than the budget, "
                     f"{(peak - budget.value) / TILE:.1f} tiles of scores (T = {fmt(TILE, 'bytes')}): scores or "
                     f"softmaxes of many tiles alive at once (kept for backward, or the rank's queries against every "
                     f"key, [S/N, S]: {2 * CHUNKS} tiles per tensor). Compute one tile at a time, keep only out and "
                     f"lse, and let backward compute the scores again (attention_tile_backward)")
    return Check("peak memory", False, f"rank {r} peaked at {fmt(peak, 'bytes')}, over the budget "
                                       f"{budget.describe()}. Largest at the peak: {lines}",
                 measured=peak, budget=budget, diagnosis=diagnosis)


def kept_check(obs: Observation, budget: Budget) -> Check:
    """What the forward left alive for the backward: the rank's activations, not its scores, not other ranks'
    blocks."""
    kept = [r.get("kept", 0) if isinstance(r, dict) else 0 for r in obs.results]
    r = max(range(obs.world_size), key=kept.__getitem__)
    ok = kept[r] <= budget.value
    message = (f"rank {r} held {fmt(kept[r], 'bytes')} more after its forward than before it ({kept[r] / Q:.2f}·Q), "
               f"{'within' if ok else 'over'} the budget {budget.describe()}")
    diagnosis = "" if ok else safe_diagnosis(diagnose_kept, r, kept[r] - KEPT_BY_REFERENCE)
    return Check("forward memory", ok, message, measured=kept[r], budget=budget, diagnosis=diagnosis)


def diagnose_kept(rank: int, extra: int) -> str:
    """Named by the size of what the forward kept beyond q, k, v, out, lse, the merged heads and y."""
    blocks, tiles = extra / KV, extra / TILE
    if round(blocks) >= 1 and abs(extra - round(blocks) * KV) <= BOOKKEEPING_BYTES:
        return (f"rank {rank}'s forward left {round(blocks)} more K/V blocks alive ({fmt(extra, 'bytes')}): other "
                f"ranks' blocks kept for the backward. Let each go once passed on, and pass them around the ring "
                f"again in backward")
    if round(tiles) >= 1 and abs(extra - round(tiles) * TILE) <= BOOKKEEPING_BYTES:
        return (f"rank {rank}'s forward left {round(tiles)} tiles of scores alive ({fmt(extra, 'bytes')}, T = "
                f"{fmt(TILE, 'bytes')} each): scores or softmaxes kept for the backward. Keep out and lse only; "
                f"attention_tile_backward computes a tile's scores again from them")
    return (f"rank {rank}'s forward left {fmt(extra, 'bytes')} alive beyond q, k, v, out, lse, the merged heads and "
            f"y (6·Q + the lse): what else does it keep?")
