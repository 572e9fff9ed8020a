"""p23's likely causes, named only when the evidence singles one out: who waited for whom (the seed's slow rank
known), which rows nobody read or two ranks read, and a mean of means replayed with the rows each rank read. With
them, what they and the checks read off the run: how long a rank's device sat idle waiting for a partner, and the
rows each rank read at a step."""

from __future__ import annotations

import torch

from puzzles.model import forward, loss_fn

from ...core.compare import tensor_mismatch
from ...core.spec import Observation, pair_at
from . import layout as lay


def idle_waiting(obs: Observation, rank: int) -> int:
    """Ticks the rank's device sat idle waiting for a partner: its compute stream ran nothing while a collective of
    its own could have started (issued, and the rank's previous message done: its own queue is no partner's
    lateness) but had not, because the last rank had not arrived. A profiler shows it as a long all-reduce kernel
    on every rank but the late one. An async collective that waits while the rank computes costs nothing."""
    spans, free = [], 0
    for e in sorted(obs.events_of(rank, "comm"), key=lambda e: (e["start"], e["end"])):
        ready = max(e["issued"], free)
        if e["start"] > ready:
            spans.append([ready, e["start"]])
        free = max(free, e["end"])
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    busy = [(e["start"], e["end"]) for e in obs.events_of(rank, "compute")]
    return sum((b - a) - sum(max(0, min(b, d) - max(a, c)) for c, d in busy) for a, b in merged)


def timings(obs: Observation, waited: dict[int, int]) -> str:
    """The per-rank table a check prints: each rank's compute, and its idle waiting."""
    return "Per rank, compute and idle waiting: " + "; ".join(
        f"rank {r} {obs.busy_ticks(r):,} and {waited[r]:,}" for r in range(obs.world_size)) + " ticks."


def balance_diagnosis(obs: Observation, waited: dict[int, int], slow: int) -> str:
    """Who waited for whom. `slow`: the rank whose device is slow at this seed (the cost model's)."""
    busy = {r: obs.busy_ticks(r) for r in range(obs.world_size)}
    if max(waited, key=waited.get) == slow:
        return (f"rank {slow}, whose device is the slow one at this seed, waited longest ({waited[slow]:,} ticks) "
                f"while computing least ({busy[slow]:,} ticks): it has less work than its speed allows (left out, "
                f"or given too few rows). Its device is slower, not stopped: give it rows in proportion to its "
                f"speed, and the others fewer.")
    late = max(busy, key=busy.get)  # the rank the others waited for
    if late == slow:
        return (f"the others waited for rank {slow} at each all-reduce: it computed longest ({busy[slow]:,} ticks). "
                f"At this seed its device is the slow one; at another seed another rank's is, so find it in the "
                f"program (time each rank's device with cuda.Event, all-gather the times) and give each rank rows "
                f"in proportion to its speed.")
    return (f"the others waited for rank {late} at each all-reduce: it computed longest ({busy[late]:,} ticks), with "
            f"more rows than its speed allows (its device is not the slow one at this seed: rank {slow}'s is). Time "
            f"each rank's device and give each rows in proportion to its speed.")


def makespan_diagnosis(obs: Observation, slow: int) -> str:
    waited = {r: idle_waiting(obs, r) for r in range(obs.world_size)}
    if max(waited.values()) > lay.WAIT_BUDGET:
        return balance_diagnosis(obs, waited, slow)
    return (f"no rank waited long for another, but the run is long all the same: {timings(obs, waited)} A step "
            f"balanced by speed takes the slow rank C = {lay.C:,} ticks (its {lay.BALANCED[1]} rows); a probe costs "
            f"at most P = {lay.P:,}: time a few rows, once, and compute each row once.")


# ---- the rows each rank read


def rows_at(r: dict, s: int) -> list[int]:
    """The rows of step s's batch that a rank read (the harness's record)."""
    rows = r.get("rows") or []
    return rows[s] if s < len(rows) else []


def describe_rows(rows: list[int]) -> str:
    """Row numbers as ranges: '22, 44..47'."""
    parts, start = [], None
    for i, row in enumerate(rows):
        if start is None:
            start = row
        if i + 1 == len(rows) or rows[i + 1] != row + 1:
            parts.append(f"{start}" if start == row else f"{start}..{row}")
            start = None
    return ", ".join(parts)


def overlap_diagnosis(twice: dict[int, list[int]]) -> str:
    if len(twice) <= lay.N - 1 and all(len(rs) == 2 and rs[1] == rs[0] + 1 for rs in twice.values()):
        return ("each boundary row is read by both neighbours: rank r's rows are bounds[r]..bounds[r+1]-1, so "
                "slice batch[bounds[r]:bounds[r + 1]] (the end excluded), with bounds the running sum of the counts.")
    if all(len(rs) == lay.N for rs in twice.values()):
        whole = len(twice) == lay.B
        return (("every rank read the whole batch: each rank computes its own share of the rows, and the "
                 "all-reduce adds the shares. " if whole else "every rank read the same few rows (a probe?). ")
                + "A probe that times the device runs on rows of its own (torch.zeros), not on the batch's, whose "
                  "rows are each one rank's.")
    return ""


def missing_diagnosis(res, s: int, missing: list[int], slow: int) -> str:
    empty = [rank for rank, r in enumerate(res) if not rows_at(r, s)]
    if empty == [slow] and len(missing) < lay.B:
        return (f"rank {slow}, the slow one at this seed, read no row at step {s}, and its rows were left to "
                f"nobody: a slow rank is slower, not absent. Give it fewer rows (in proportion to its speed), and "
                f"give every row to some rank.")
    if len(missing) < lay.N and missing == list(range(lay.B - len(missing), lay.B)):
        return ("the batch's last rows are nobody's: counts rounded down add up to less than B. Round "
                "so that they add up to B (give the rows left over, one each, to the ranks whose shares were rounded "
                "down most).")
    if len(missing) == lay.B:
        return ("no rank read the batch through it (batch[lo:hi] reads rows lo..hi-1; its tensors are not to be "
                "taken directly).")
    return ""


def weights_diagnosis(res, rank: int, inputs) -> str:
    """A mean of means: each rank's own mean loss, the ranks' gradients averaged. Replayed with the rows each rank
    read; named only when it gives the rank's weights."""
    rows = [r.get("rows") or [] for r in res]
    if any(len(x) != lay.STEPS for x in rows):
        return ""
    layers = inputs["layers"]
    for s in range(lay.STEPS):
        x, target = lay.step_batch(inputs, s)
        shares = [rows[r][s] for r in range(lay.N) if rows[r][s]]
        ws = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()) for w1, w2 in layers]
        loss = sum(loss_fn(forward(x[idx], ws), target[idx]) for idx in shares) / lay.N
        grads = torch.autograd.grad(loss, [w for pair in ws for w in pair])
        with torch.no_grad():
            layers = [(w1 - lay.LR * g1, w2 - lay.LR * g2) for (w1, w2), g1, g2 in zip(ws, grads[0::2], grads[1::2])]
    got = res[rank].get("weights") or []
    if all(tensor_mismatch(g, e) is None for i, want in enumerate(layers) for g, e in zip(pair_at(got, i), want)):
        return ("each rank averaged its loss over its own rows and the ranks' gradients were averaged (a mean of "
                "means): with shares of different sizes, that weighs a row of the slow rank's 1/(N·n_slow), more "
                "than a fast rank's. Weigh each rank's loss by its share, n_r/B, and add the gradients (SUM).")
    return ""
