"""What p13's evidence says about a wrong all-reduce: which ranks' parts each chunk of a wrong t holds, what the
messages of a run were, whether a rank's sends ever ran while it received, how much it held.

Values: every rank's tensor is random, so a wrong chunk that is a sum of some ranks' chunks is that sum exactly
(a least-squares fit over the world's chunks, integer coefficients, a residual at rounding level): the diagnosis
says which parts are missing or counted twice, and names a cause only for the patterns that single one out.
"""

from __future__ import annotations

from collections import Counter

import torch

from ...core.spec import Observation
from .runs import ALPHA, RUNS, Run, comm_by_run, run_makespan, windows

def _times(k: int) -> str:
    return {1: "once", 2: "twice"}.get(k, f"{k} times")


def _words(run: Run) -> str:
    return "the ring" if run.algorithm == "ring" else "recursive doubling"


# ---- messages


def sent_in(events: list[dict]) -> int:
    """Wire bytes sent: every send and every collective's share (receives are counted by their sender)."""
    return sum(e["wire_bytes"] for e in events if e["kind"] not in ("recv", "new_group"))


def _sends(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] == "send"]


def misdirected(obs: Observation, i: int, run: Run) -> list[tuple[int, list[int]]]:
    """(rank, the ranks it sent to besides its two ring neighbours) for every rank whose sends in run i went
    further than the next or the previous rank of its world (either way round: a ring may run in either direction,
    its two phases too)."""
    strays = []
    for first in range(0, len(obs.results), run.n):
        world = list(range(first, first + run.n))
        for r in world:
            at = world.index(r)
            targets = {int(e["peers"][-1]) for e in _sends(comm_by_run(obs, r)[i])}
            beyond = targets - {world[(at + 1) % run.n], world[(at - 1) % run.n]}
            if beyond:
                strays.append((r, sorted(beyond)))
    return strays


def diagnose_bytes(obs: Observation, i: int, run: Run, rank: int) -> str:
    events = comm_by_run(obs, rank)[i]
    sends, total = _sends(events), sent_in(events)
    sizes = Counter(e["nbytes"] for e in sends)
    s, n = run.nbytes, run.n
    ring, doubling = Run("ring", n, run.shape), Run("doubling", n, run.shape)
    collectives = sorted({e["kind"] for e in events if e["kind"] not in ("send", "recv")})
    if collectives:
        return f"rank {rank} sent part of it with {', '.join(collectives)} (see 'no collective')"
    if len({int(e["peers"][-1]) for e in sends}) == n - 1 and sizes == Counter({s: n - 1}):
        return (f"rank {rank} sent its whole tensor to each of the {n - 1} others, (N-1)·S = {total:,} bytes: "
                f"gather everything, then sum. The ring sends {ring.sent_bytes:,}, recursive doubling "
                f"{doubling.sent_bytes:,}")
    if run.algorithm == "ring":
        if total == doubling.sent_bytes and sizes == Counter({s: doubling.steps}):
            return (f"rank {rank} sent recursive doubling's bytes, log2(N)·S = {total:,}: ring_all_reduce "
                    f"exchanged the whole tensor {_times(doubling.steps)} instead of passing chunks round the ring")
        if sends and set(sizes) == {s}:
            return (f"each of rank {rank}'s {len(sends)} messages carried the whole tensor ({s:,} bytes): a ring step "
                    f"sends one chunk, S/N = {run.message_bytes:,} bytes")
        strays = [x for x in misdirected(obs, i, run) if x[0] == rank]
        if strays:
            return (f"rank {rank} sent to rank(s) {strays[0][1]}, which are not its ring neighbours: on a ring every "
                    f"rank sends only to the next rank or the previous one")
        if set(sizes) == {run.message_bytes}:
            phases = (" (one of the two phases, reduce-scatter or all-gather, is missing)"
                      if len(sends) == n - 1 else "")
            return (f"rank {rank} sent {len(sends)} chunks of {run.message_bytes:,} bytes; the ring sends "
                    f"2(N-1) = {2 * (n - 1)}: N-1 in the reduce-scatter and N-1 in the all-gather{phases}")
    else:
        if total == ring.sent_bytes and set(sizes) == {ring.message_bytes}:
            return (f"rank {rank} sent the ring's bytes, 2(N-1)/N·S = {total:,}, in chunks of "
                    f"{ring.message_bytes:,}: recursive doubling exchanges the whole running sum, log2(N) = "
                    f"{run.steps} times")
        if set(sizes) == {s}:
            return (f"rank {rank} sent the whole tensor {_times(len(sends))}; recursive doubling needs log2(N) = "
                    f"{run.steps} exchanges (partners r ^ 1, r ^ 2, ...)")
        if sends and max(sizes) < s:
            return (f"rank {rank}'s messages were {', '.join(f'{b:,}' for b in sorted(sizes))} bytes: recursive "
                    f"doubling sends the whole running sum ({s:,} bytes) each round")
    return ""


# ---- time


def _overlapped(sends: list[dict], recvs: list[dict]) -> bool:
    return any(a["start"] < b["end"] and b["start"] < a["end"] for a in sends for b in recvs)


def diagnose_schedule(obs: Observation, i: int, run: Run) -> str:
    worlds = [tuple(range(w, w + run.n)) for w in range(0, len(obs.results), run.n)]
    world = max(worlds, key=lambda w: run_makespan(obs, i, w))
    start, end = windows(obs)[i]
    for r in world:
        total = sent_in(comm_by_run(obs, r)[i])
        if total > run.sent_bytes:
            return (f"rank {r} sent {total:,} bytes in this run where {_words(run)} sends {run.sent_bytes:,} "
                    f"(see '{run.algorithm} bytes'): the extra messages took the extra time")
        if total < run.sent_bytes:
            return (f"rank {r} sent {total:,} bytes in this run where {_words(run)} sends {run.sent_bytes:,} "
                    f"(see '{run.algorithm} bytes'): its messages were not {_words(run)}'s, and neither was their "
                    f"time")
    for r in world:
        events = comm_by_run(obs, r)[i]
        sends, recvs = _sends(events), [e for e in events if e["kind"] == "recv"]
        if sends and recvs and not _overlapped(sends, recvs):
            return (f"rank {r}'s sends and receives never overlapped in this run: it sent, then received (blocking "
                    f"send and recv in turn), so every step took two messages' time. Post both at once: isend and "
                    f"irecv, then wait for both (or batch_isend_irecv); links carry both directions together")
    r = world[0]
    sends = _sends(comm_by_run(obs, r)[i])
    if len(sends) > run.steps:
        return (f"rank {r} sent {len(sends)} messages where the formula has {run.steps} steps: each message pays the "
                f"latency α = {ALPHA} ticks, whatever its size")
    compute = sum(e["end"] - e["start"] for e in obs.events_of(r, "compute") if start <= e["start"] and e["end"] <= end)
    if compute > run.reduction_ticks + run.tolerance_ticks:
        return (f"rank {r} computed {compute:,} ticks in this run where the reductions need {run.reduction_ticks:,}: "
                f"copies (clone, cat, contiguous) and extra passes cost their memory traffic on the clock; add what "
                f"arrives into views of t in place")
    return ""


# ---- memory


def diagnose_held(run: Run, held: int) -> str:
    if run.algorithm == "ring":
        chunks = held / run.message_bytes
        if held >= run.nbytes:
            return (f"the rank held {held:,} bytes beyond t, {held / run.nbytes:.2f}x the tensor itself: buffers the "
                    f"size of t, where a ring needs one chunk-sized receive buffer, S/N = {run.message_bytes:,} bytes")
        return (f"the rank held {chunks:.2f} chunks of S/N = {run.message_bytes:,} bytes at once beyond t: one "
                f"receive buffer, reused at every step, is all the ring needs")
    copies = held / run.nbytes
    return (f"the rank held {copies:.2f} tensors' worth beyond t at once: one receive buffer of S = "
            f"{run.nbytes:,} bytes, reused every round, is all recursive doubling needs (each t + buf makes "
            f"another tensor; t += buf does not)")


# ---- values


def _combination(got: torch.Tensor, parts: list[torch.Tensor]) -> list[int] | None:
    """The integer coefficients c with got = sum_s c[s]·parts[s] exactly (to rounding), or None."""
    a = torch.stack([p.reshape(-1) for p in parts], dim=1)  # [m, n]
    g = got.reshape(-1, 1).to(a.dtype)
    if a.shape[0] < a.shape[1]:
        return None
    c = torch.linalg.lstsq(a, g).solution.reshape(-1)
    rounded = c.round()
    scale = max(1.0, a.abs().max().item())
    if (c - rounded).abs().max().item() > 1e-6 or (a @ rounded.reshape(-1, 1) - g).abs().max().item() > 1e-9 * scale:
        return None
    return [int(x) for x in rounded.tolist()]


def _chunks(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    return list(t.reshape(-1).chunk(n))


def _describe(coefficients: list[int], world: list[int]) -> str:
    missing = [world[s] for s, c in enumerate(coefficients) if c == 0]
    extra = [f"rank {world[s]}'s {c} times" for s, c in enumerate(coefficients) if c > 1]
    bits = []
    if missing:
        bits.append(f"lacks rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}")
    if extra:
        bits.append(f"counts {', '.join(extra)}")
    if any(c < 0 for c in coefficients):
        bits.append("subtracts a rank's part")
    return " and ".join(bits) or "is complete"


def diagnose_values(bad, obs: Observation, inputs: dict, result_of) -> str:
    i, rank = bad[0].meta
    run = RUNS[i]
    world = list(run.world_of(rank))
    parts = [inputs["tensors"][i][s] for s in world]
    got = bad[0].got
    if not isinstance(got, torch.Tensor) or got.shape != parts[0].shape or not got.dtype.is_floating_point:
        return ""
    if torch.equal(got, parts[world.index(rank)]):
        returned = result_of(obs, rank, i).get("returned")
        gave = (", and the function returned the sum as a new tensor" if isinstance(returned, torch.Tensor)
                and returned.shape == got.shape and torch.allclose(returned.double(), bad[0].expected) else "")
        return (f"rank {rank}'s t is unchanged{gave}: an all-reduce works in place, as dist.all_reduce does. Add into "
                f"t itself (t += buf, or into views of t such as t.view(-1).chunk(N)), not into a new tensor bound "
                f"to the same name (t = t + buf)")
    per_chunk = [_combination(g, [_chunks(x, run.n)[j] for x in parts]) for j, g in enumerate(_chunks(got, run.n))]
    if any(c is None for c in per_chunk):
        return ""
    whole = [1] * run.n
    facts = "; ".join(f"chunk {j} {_describe(c, world)}" for j, c in enumerate(per_chunk))
    where = f"rank {rank}'s t (its world: ranks {world[0]}-{world[-1]}), chunk by chunk of N = {run.n}: {facts}"
    complete = [j for j, c in enumerate(per_chunk) if c == whole]
    if run.algorithm == "ring" and len(complete) == 1 and all(max(c) == 1 for c in per_chunk):
        return (f"{where}. Only one chunk is complete, the one this rank finished in the reduce-scatter: the "
                f"all-gather did not bring it the others (missing, or too few steps)")
    if run.algorithm == "doubling" and len(set(map(tuple, per_chunk))) == 1:
        c, local = per_chunk[0], world.index(rank)
        stale = [1 if s == local or bin(s ^ local).count("1") == 1 else 0 for s in range(run.n)]
        if c == stale:
            return (f"rank {rank}'s t holds its own tensor and each of its {run.steps} partners' tensors as they were "
                    f"at the start, {sum(c)} of the {run.n}: each round must send the running sum (t after the rounds "
                    f"before), not the original")
    if any(x > 1 for c in per_chunk for x in c):
        return f"{where}: a part was added more than once"
    return where
