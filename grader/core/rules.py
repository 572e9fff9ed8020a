"""Rules that several puzzles state, each measured once, the same way for every puzzle and every backend.

    compute        the FLOPs each rank computed (every op: matmuls by torch's own formulas, elementwise ops per
                   element, ...; the simulator's op_costs.py), at most its share, and at least the products its share
                   needs, counted on product ops alone (a product written as elementwise multiplies and sums costs
                   its full FLOPs against the ceiling, and none against the floor)
    communication  the bytes each rank sent (the ring algorithm's wire bytes, over every collective and send),
                   at most a budget, or, where the rule is a volume, within [least, budget]
    groups         which group each collective ran on and whom each send went to (the events' peers), and the
                   bytes each rank sent on one of its groups
    overlap        the communication left exposed: the makespan less the busiest rank's work, its compute stream
                   less what ran while its messages were in flight with no arithmetic to explain it (copies and
                   clones placed under a message hide nothing), counted up to 1.25·C
    work sequence  a pipeline stage's compute as whole microbatch forwards and backwards, read off its FLOPs,
                   and how many microbatches it held at once
    excess         a memory excess named by its size, only when the size singles one thing out

A rule measures what the puzzle's text states, whatever style the answer is written in: FLOPs (not which
function ran them), bytes sent (not which collective sent them), microbatches held (not how the loop is written).
The budgets that would otherwise be exact admit BOOKKEEPING_BYTES beyond their formula (the others have room for
it already), so that a step counter or a logged loss never fails an answer, while a vector of the model's size
still does.
"""

from __future__ import annotations

from math import ceil

from puzzles.simulator.op_costs import COPY_OP_NAMES

from .compare import safe_diagnosis
from .result import Budget, Check, fmt
from .spec import Observation

BOOKKEEPING_BYTES = 1024


# ---- compute


def flops(obs: Observation, rank: int, kind: str | None = None) -> int:
    """The FLOPs `rank` computed; kind "backward" counts what ran inside autograd's backward, "forward" the rest."""
    return sum(e["flops"] for e in obs.events_of(rank, "compute", kind))


def product_flops(obs: Observation, rank: int) -> int:
    """The FLOPs `rank` computed in products (matmuls, attention): the part a product floor counts."""
    return sum(e.get("product_flops", 0) for e in obs.events_of(rank, "compute"))


def products_short(obs: Observation, rank: int, least: int) -> str:
    """What a rank whose products fall short of `least` did instead, read off its compute: elementwise multiplies
    and sums of as many FLOPs (products written out of elements), or nothing (work skipped)."""
    got = product_flops(obs, rank)
    other = flops(obs, rank) - got
    who = f"rank {rank}" if obs.world_size > 1 else "your code"
    if other >= least - got:
        return (f"{who} computed only {got:,} FLOPs in matrix products (mm, bmm, matmul), {least - got:,} short of "
                f"the products its share needs, and {other:,} FLOPs in elementwise ops and reductions: products "
                f"written as elementwise multiplies and sums (a broadcast multiply, then sum). They cost as many "
                f"FLOPs and far more time (every partial product goes to memory and back): use matmuls (@)")
    return (f"{who} computed only {got:,} FLOPs in matrix products, {least - got:,} short of the products its share "
            f"needs: some of its work was skipped (see the values)")


def compute_check(obs: Observation, budget: Budget, diagnose=None, name: str = "compute", least: int = 0) -> Check:
    """Every rank computed at most budget.value FLOPs (every op counted), and at least `least` in products: the
    matmuls its share of the work cannot do without (fewer means work skipped, or products written as elementwise
    multiplies and sums). `diagnose(rank, forward_flops, backward_flops)` may say what an excess is, from its size."""
    per_rank = [flops(obs, r) for r in range(obs.world_size)]
    products = [product_flops(obs, r) for r in range(obs.world_size)]
    off = [r for r, f in enumerate(per_rank) if f > budget.value or products[r] < least]
    r = off[0] if off else max(range(obs.world_size), key=per_rank.__getitem__)
    fwd, bwd = flops(obs, r, "forward"), flops(obs, r, "backward")
    ok = not off
    who = f"rank {r}" if obs.world_size > 1 else "your code"
    short = products[r] < least
    if short:
        verdict = (f"with {products[r]:,} of them in matrix products, below the {least:,} that its share of the step "
                   f"cannot do without (budget {budget.describe()})")
    else:
        verdict = f"{'within' if ok else 'over'} the budget {budget.describe()} FLOPs"
    message = (f"{who} computed {per_rank[r]:,} FLOPs ({fwd:,} outside backward, {bwd:,} inside it; "
               f"{per_rank[r] / budget.value:.2f}x the budget), {verdict}")
    if obs.world_size > 1:
        message += f". Per rank: {', '.join(f'{f:,}' for f in per_rank)} FLOPs"
    if ok:
        diagnosis = ""
    elif short:
        diagnosis = products_short(obs, r, least)
    else:
        diagnosis = (elementwise_products(who, per_rank[r], products[r], budget.value, least)
                     or (safe_diagnosis(diagnose, r, fwd, bwd) if diagnose else ""))
    return Check(name, ok, message, measured=per_rank[r], budget=budget, diagnosis=diagnosis)


def elementwise_products(who: str, total: int, products: int, budget: int, least: int) -> str:
    """Over the ceiling with at least half its products' worth of FLOPs again in elementwise ops and reductions,
    beyond what the budget leaves them: products written as elementwise multiplies and sums, the only work that
    size (a budget's elementwise share is a few percent of its products). Matmuls on top that meet the floor are
    padding."""
    other, allowed = total - products, budget - least
    if least <= 0 or other - allowed < least // 2:
        return ""
    padding = (f", and {products:,} FLOPs of matmuls besides, all the floor asks for: the work done twice, once "
               f"out of elements and once in matmuls (padding to meet the floor?)" if products >= least else "")
    return (f"{who} computed {other:,} FLOPs in elementwise ops and reductions where its share needs about "
            f"{allowed:,}: {(other - allowed) / least:.1f}x its products' worth again, the size of products written "
            f"as elementwise multiplies and sums (a broadcast multiply, then sum){padding}. Every op counts: use "
            f"matmuls (@), once")


# ---- overlap: communication hidden behind compute

COMPUTE_CAP = (5, 4)  # compute beyond 1.25·C hides no communication: filler work cannot buy an overlap
ELEMENTWISE_BYTES_PER_FLOP = 3 * 8  # an elementwise op on float64 reads two operands and writes one per FLOP


def in_flight(obs: Observation, rank: int) -> list[tuple[int, int]]:
    """The intervals during which one of `rank`'s messages was in flight: from the tick the rank issued it (a
    collective may start later, when its last participant arrives) to its end, merged."""
    spans = sorted((e.get("issued", e["start"]), e["end"]) for e in obs.events_of(rank, "comm")
                   if e["kind"] != "new_group")
    merged: list[list[int]] = []
    for start, end in spans:
        start = min(start, end)
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        elif end > start:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def explained_ticks(event: dict, device) -> int:
    """The ticks of a compute event that its arithmetic explains: its FLOPs at the peak rate, and the memory
    traffic of elementwise ops with as many FLOPs (ELEMENTWISE_BYTES_PER_FLOP), at most its ticks. A copy or a
    clone (no FLOPs) explains none of its ticks, a launch of a one-FLOP op almost none."""
    flops = event["flops"]
    return min(event["end"] - event["start"],
               ceil(flops / device.flops_per_tick + flops * ELEMENTWISE_BYTES_PER_FLOP / device.memory_bytes_per_tick))


def idle_work(obs: Observation, rank: int, device) -> tuple[int, dict[str, int]]:
    """(the ticks of `rank`'s compute stream that ran while one of its messages was in flight and that no arithmetic
    explains, those ticks by the learner's line). Such ticks moved memory (copies, clones, fresh buffers) or
    launched kernels: they hide no communication, or filler would."""
    flying = in_flight(obs, rank)
    total, by_site = 0, {}
    for e in obs.events_of(rank, "compute"):
        ticks = e["end"] - e["start"]
        if ticks <= 0 or not flying:
            continue
        overlap = sum(max(0, min(e["end"], b) - max(e["start"], a)) for a, b in flying)
        idle = overlap - overlap * explained_ticks(e, device) // ticks
        if idle > 0:
            total += idle
            by_site[e.get("site", "?")] = by_site.get(e.get("site", "?"), 0) + idle
    return total, by_site


def exposed_communication(obs: Observation, c_ticks: int, device=None) -> tuple[int, int, int]:
    """(the busiest rank's compute, its work counted up to 1.25·C, the makespan minus that): the ticks of the step
    that were communication and nothing else. A rank's work is its compute stream's ticks, less those that ran
    while its messages were in flight and that no arithmetic explains (idle_work): copies, clones and launches
    placed during a message hide nothing, so filler cannot pay for an exposed message. Measured against the
    answer's own compute otherwise, so that its style (a bucket's copies, autograd's own bookkeeping) does not
    count against its overlap unless it runs in place of the work a message should hide behind."""
    compute = max(obs.busy_ticks(r) for r in range(obs.world_size))
    work = compute if device is None else max(obs.busy_ticks(r) - idle_work(obs, r, device)[0]
                                              for r in range(obs.world_size))
    counted = min(work, c_ticks * COMPUTE_CAP[0] // COMPUTE_CAP[1])
    return compute, counted, obs.makespan - counted


def overlap_check(obs: Observation, budget: Budget, c_ticks: int, device, diagnose=None) -> Check:
    """The communication left exposed, makespan - min(work, 1.25·C), at most budget.value ticks: work is the
    busiest rank's compute, less what ran during its messages without arithmetic (exposed_communication).
    `diagnose(obs)` may say why, from the schedule."""
    compute, counted, exposed = exposed_communication(obs, c_ticks, device)
    comm = max(obs.busy_ticks(r, "comm") for r in range(obs.world_size))
    ok = exposed <= budget.value
    idle = [idle_work(obs, r, device) for r in range(obs.world_size)]
    r = max(range(obs.world_size), key=lambda q: idle[q][0])
    filler = (f", {fmt(idle[r][0], 'ticks')} of it (rank {r}) copies or launches with no arithmetic while messages "
              f"were in flight, which hide nothing" if idle[r][0] else "")
    capped = (f"; counted up to 1.25·C = {fmt(counted, 'ticks')} (compute beyond that hides nothing)"
              if counted == c_ticks * COMPUTE_CAP[0] // COMPUTE_CAP[1] and counted < compute else "")
    message = (f"makespan {fmt(obs.makespan, 'ticks')}; the compute stream was busy {fmt(compute, 'ticks')}{filler}"
               f"{capped}, and the communication stream {fmt(comm, 'ticks')}: {fmt(exposed, 'ticks')} of the step "
               f"were communication left exposed, {'within' if ok else 'over'} the budget {budget.describe()}")
    diagnosis = ""
    if not ok:
        naive = obs.makespan - min(compute, c_ticks * COMPUTE_CAP[0] // COMPUTE_CAP[1])
        if idle[r][0] and naive <= budget.value:  # the idle work alone is what puts the step over
            diagnosis = filler_diagnosis(r, idle[r][1], idle[r][0])
        elif diagnose is not None:
            diagnosis = safe_diagnosis(diagnose, obs)
    return Check("makespan", ok, message, measured=exposed, budget=budget, diagnosis=diagnosis)


def filler_diagnosis(rank: int, by_site: dict[str, int], total: int) -> str:
    top = "; ".join(f"{site}: {ticks:,} ticks" for site, ticks in sorted(by_site.items(), key=lambda kv: -kv[1])[:2])
    return (f"rank {rank}'s compute stream spent {total:,} ticks, while its messages were in flight, on ops that do "
            f"no arithmetic ({top}): copies, clones or fresh buffers. They keep the stream busy but hide nothing: the "
            f"message is as exposed as if the stream had waited. Hide each message behind the work that comes "
            f"after it (the rest of backward), and don't wait for it before that work")


def slow_compute(obs: Observation, c_ticks: int) -> str:
    """A diagnosis for a rank whose compute alone took more than 1.25·C, from what its events did."""
    rank = max(range(obs.world_size), key=lambda r: obs.busy_ticks(r))
    busy = obs.busy_ticks(rank)
    copies = sum(e["end"] - e["start"] for e in obs.events_of(rank, "compute")
                 if e.get("op") and _only_copies(e))
    moved = (f"; {copies:,} ticks of it copied memory and computed nothing ({_copy_lines(obs, rank)})"
             if copies >= (busy - c_ticks) // 2 else "")
    return (f"rank {rank}'s compute alone took {busy:,} ticks, {busy / c_ticks:.2f}x the step's C = {c_ticks:,}{moved}: "
            f"compute beyond 1.25·C hides no communication. Copies (torch.cat, clone, contiguous) and extra "
            f"elementwise passes cost their memory traffic on the clock: compute on views of the buffers you have")


def _only_copies(event: dict) -> bool:
    """Whether a compute event only moved data (its ops are copies: cat, clone, ...)."""
    return bool(event.get("op")) and all(name.split(" x")[0] in COPY_OP_NAMES for name in event["op"].split(", "))


def _copy_lines(obs: Observation, rank: int) -> str:
    by_site: dict[str, int] = {}
    for e in obs.events_of(rank, "compute"):
        if e.get("op") and _only_copies(e):
            by_site[e.get("site", "?")] = by_site.get(e.get("site", "?"), 0) + e["end"] - e["start"]
    top = sorted(by_site.items(), key=lambda kv: -kv[1])[:2]
    return "; ".join(f"{site}: {ticks:,} ticks" for site, ticks in top)


# ---- communication


def sent(obs: Observation, rank: int, phase: str | None = None) -> dict[str, tuple[int, int]]:
    """What `rank` sent, by kind of op: {kind: (calls, wire bytes)}. Receives are counted by their sender."""
    by_kind: dict[str, tuple[int, int]] = {}
    for e in obs.events_of(rank, "comm", phase=phase):
        if e["kind"] in ("recv", "new_group"):
            continue
        calls, nbytes = by_kind.get(e["kind"], (0, 0))
        by_kind[e["kind"]] = (calls + 1, nbytes + e["wire_bytes"])
    return by_kind


def received(event: dict) -> int:
    """The bytes of other ranks' data that a communication event brought its rank: a receive's buffer; a
    collective's share from the other members, (n-1)/n of its buffer (an all-gather's output, an all-reduced
    tensor, an all-to-all's exchange, a broadcast counted over the group's n broadcasts), 1/n of that for a
    reduce-scatter's output; nothing for a send, a barrier or the making of a group."""
    kind, nbytes, n = event["kind"], event["nbytes"], max(len(event.get("peers") or ()), 1)
    if kind == "recv":
        return nbytes
    if kind in ("send", "barrier", "new_group") or n <= 1:
        return 0
    share = nbytes * (n - 1) // n
    return share // n if kind.startswith("reduce_scatter") else share


def describe_sent(by_kind: dict[str, tuple[int, int]]) -> str:
    return ", ".join(f"{kind} x{calls} {fmt(nbytes, 'bytes')}" for kind, (calls, nbytes) in sorted(by_kind.items())) \
        or "nothing"


def communication_check(obs: Observation, budget: Budget, name: str = "communication", phase: str | None = None,
                        diagnose=None) -> Check:
    """Every rank sent at most budget.value bytes (wire bytes, in `phase` if given: "forward" is everything issued
    outside autograd's backward). `diagnose(rank, by_kind)` may name the excess."""
    by_rank = [sent(obs, r, phase) for r in range(obs.world_size)]
    totals = [sum(b for _, b in k.values()) for k in by_rank]
    over = [r for r, t in enumerate(totals) if t > budget.value]
    r = over[0] if over else max(range(obs.world_size), key=totals.__getitem__)
    ok = not over
    where = {"forward": " outside backward", "backward": " inside backward"}.get(phase or "", "")
    message = (f"rank {r} sent {fmt(totals[r], 'bytes')}{where} ({describe_sent(by_rank[r])}), "
               f"{'within' if ok else 'over'} the budget {budget.describe()}")
    diagnosis = "" if ok or diagnose is None else safe_diagnosis(diagnose, r, by_rank[r])
    return Check(name, ok, message, measured=totals[r], budget=budget, diagnosis=diagnosis)


# ---- process groups: who talked to whom


def off_group(obs: Observation, collective_groups, send_peers) -> list[dict]:
    """The communication events that ran where the puzzle's layout says they must not: a collective whose group
    (its peers: the group's global ranks, in order) is not one of `collective_groups(rank)`, or a send whose
    destination is not in `send_peers(rank)`. Receives are judged by their sender; barriers move no data."""
    off = []
    for e in obs.events_of(stream="comm"):
        if e["kind"] in ("recv", "barrier", "new_group"):
            continue
        if e["kind"] == "send":
            if e["peers"][-1] not in send_peers(e["rank"]):
                off.append(e)
        elif [int(r) for r in e["peers"]] not in [list(g) for g in collective_groups(e["rank"])]:
            off.append(e)
    return off


def sent_on_group(obs: Observation, rank: int, peers, phase: str | None = None) -> dict[str, tuple[int, int]]:
    """What `rank` sent in collectives on the group of global ranks `peers` (in `phase` if given, as `sent`):
    {kind: (calls, wire bytes)}."""
    by_kind: dict[str, tuple[int, int]] = {}
    for e in obs.events_of(rank, "comm", phase=phase):
        if e["kind"] in ("send", "recv", "new_group") or [int(r) for r in e["peers"]] != list(peers):
            continue
        calls, nbytes = by_kind.get(e["kind"], (0, 0))
        by_kind[e["kind"]] = (calls + 1, nbytes + e["wire_bytes"])
    return by_kind


def group_communication_check(obs: Observation, budget: Budget, name: str, group_of, what: str,
                              diagnose=None) -> Check:
    """Every rank sent at most budget.value bytes in collectives on its group `group_of(rank)` (`what` names the
    kind of group). `diagnose(rank, by_kind, totals)` may name the excess."""
    by_rank = [sent_on_group(obs, r, group_of(r)) for r in range(obs.world_size)]
    totals = [sum(b for _, b in k.values()) for k in by_rank]
    over = [r for r, t in enumerate(totals) if t > budget.value]
    r = over[0] if over else max(range(obs.world_size), key=totals.__getitem__)
    ok = not over
    message = (f"rank {r} sent {fmt(totals[r], 'bytes')} on its {what} group {list(group_of(r))} "
               f"({describe_sent(by_rank[r])}), {'within' if ok else 'over'} the budget {budget.describe()}. "
               f"Per rank: {', '.join(f'{t:,}' for t in totals)} bytes")
    diagnosis = "" if ok or diagnose is None else safe_diagnosis(diagnose, r, by_rank[r], totals)
    return Check(name, ok, message, measured=totals[r], budget=budget, diagnosis=diagnosis)


def communication_volume_check(obs: Observation, budget: Budget, least: int, name: str = "communication",
                               diagnose=None) -> Check:
    """Every rank sent at least `least` and at most budget.value bytes (wire bytes, over every op): for a rule that
    is a volume, such as ZeRO-3's three passes over the weights, sending less is as wrong as sending more (a
    collective the rule needs was skipped). `diagnose(rank, by_kind)` may name what is missing or extra."""
    by_rank = [sent(obs, r) for r in range(obs.world_size)]
    totals = [sum(b for _, b in k.values()) for k in by_rank]
    off = [r for r, t in enumerate(totals) if not least <= t <= budget.value]
    r = off[0] if off else max(range(obs.world_size), key=totals.__getitem__)
    ok = not off
    relation = "within" if ok else ("below" if totals[r] < least else "over")
    message = (f"rank {r} sent {fmt(totals[r], 'bytes')} ({describe_sent(by_rank[r])}), {relation} the budget "
               f"{budget.describe()}, at least {least:,}")
    if obs.world_size > 1:
        message += f". Per rank: {', '.join(f'{t:,}' for t in totals)} bytes"
    diagnosis = "" if ok or diagnose is None else safe_diagnosis(diagnose, r, by_rank[r])
    return Check(name, ok, message, measured=totals[r], budget=budget, diagnosis=diagnosis)


# ---- a pipeline stage's work, microbatch by microbatch


def work_sequence(obs: Observation, rank: int, forward_flops: int, backward_flops: int) -> str:
    """The rank's compute as a string of whole microbatch units, in the order it ran them: "F" when a microbatch's
    forward begins (every forward_flops outside backward), "B" when a backward completes (every backward_flops
    inside it). Read off FLOPs, so it does not depend on how the code is written or labelled."""
    out, fwd, bwd, n_f, n_b = [], 0, 0, 0, 0
    for e in sorted(obs.events_of(rank, "compute"), key=lambda e: (e["start"], e["end"])):
        if e["kind"] == "backward":
            bwd += e["flops"]
            while (n_b + 1) * backward_flops <= bwd:
                n_b += 1
                out.append("B")
        else:
            fwd += e["flops"]
            while n_f < ceil(fwd / forward_flops):
                n_f += 1
                out.append("F")
    return "".join(out)


def most_held(sequence: str) -> tuple[int, int]:
    """(the most microbatches held at once, forwards begun minus backwards done; the index in `sequence` where
    that was first reached)."""
    held, best, at = 0, 0, -1
    for i, op in enumerate(sequence):
        held += 1 if op == "F" else -1
        if held > best:
            best, at = held, i
    return best, at


# ---- memory


def sized_like(excess: int, sizes: dict[str, int]) -> str | None:
    """The one name in `sizes` whose bytes match the excess (to within BOOKKEEPING_BYTES), or None when none or
    several do: a diagnosis names a thing only when its size singles it out."""
    hits = [name for name, n in sizes.items() if abs(excess - n) <= BOOKKEEPING_BYTES]
    return hits[0] if len(hits) == 1 else None
