"""p11's process-group rules: the groups build_3d_groups returned, which group each collective ran on, whom each
send went to (the events' peers: a collective's group as global ranks, a send's (source, destination)), and the
bytes each rank sent on its tensor-parallel and its data-parallel group.

Which group a collective belongs on is read off its peers, never off its size or the line that issued it: an
all-reduce on the data-parallel group is a data-parallel all-reduce, whatever it carries. Carrying the wrong thing
there shows in the values and in that group's bytes, which is where a likely cause is named."""

from __future__ import annotations

from ...core.compare import safe_diagnosis
from ...core.result import Check, fmt
from ...core.rules import off_group, sent_on_group, sized_like
from ...core.spec import Observation
from .layout import (DP_BYTES, EXPECTED_GROUPS, GROUP_NAMES, TP_BYTES, W_RANK, WORLD, M, P, T, coords, dp_ranks,
                     other_layouts, pp_ranks, rank_of, tp_ranks)


def allowed_groups(rank: int) -> list[list[int]]:
    return [tp_ranks(rank), dp_ranks(rank)]


def neighbours(rank: int) -> list[int]:
    """The ranks `rank` may send to: the neighbouring stages of its own replica and columns."""
    pp, dp, tp = coords(rank)
    return [rank_of(s, dp, tp) for s in (pp - 1, pp + 1) if 0 <= s < P]


def named_group(rank: int, peers) -> str:
    """What a group of global ranks is, to `rank`: 'its pipeline group [0, 4]', 'the default group (all 8 ranks)'."""
    peers = [int(r) for r in peers]
    if peers == list(range(WORLD)):
        return f"the default group (all {WORLD} ranks)"
    for kind, of in EXPECTED_GROUPS.items():
        if peers == of(rank):
            return f"its {GROUP_NAMES[kind]} group {peers}"
    return f"the group {peers}"


def returned_problems(obs: Observation) -> list[str]:
    problems = []
    for r, res in enumerate(obs.results):
        groups = res.get("groups") if isinstance(res, dict) else None
        if not isinstance(groups, dict):
            problems.append(f"rank {r}: build_3d_groups returned nothing the grader could read")
            continue
        if "problem" in groups:
            problems.append(f"rank {r}: {groups['problem']}")
            continue
        for kind, of in EXPECTED_GROUPS.items():
            if groups.get(kind) != of(r):
                problems.append(f"rank {r}: build_3d_groups returned {groups.get(kind)} as its {GROUP_NAMES[kind]} "
                                f"group; the layout's is {of(r)}")
    return problems


def event_problem(e: dict) -> str:
    r = e["rank"]
    if e["kind"] == "send":
        dst = e["peers"][-1]
        return (f"rank {r} {coords_text(r)} sent {fmt(e['nbytes'], 'bytes')} to rank {dst} {coords_text(dst)} at "
                f"{e['site']}: it may send only to the neighbouring stage of its own replica and columns, "
                f"{' or '.join(f'rank {n}' for n in neighbours(r))}")
    return (f"rank {r} ran {e['kind']} on {named_group(r, e['peers'])} at {e['site']}: collectives belong on its "
            f"tensor-parallel group {tp_ranks(r)} or its data-parallel group {dp_ranks(r)}")


def coords_text(rank: int) -> str:
    pp, dp, tp = coords(rank)
    return f"(pp {pp}, dp {dp}, tp {tp})"


def groups_check(obs: Observation) -> Check:
    returned = returned_problems(obs)
    events = off_group(obs, allowed_groups, neighbours)
    problems = returned + [event_problem(e) for e in events]
    if not problems:
        calls = len([e for e in obs.events_of(stream="comm") if e["kind"] not in ("recv", "barrier")])
        return Check("process groups", True, f"every rank's groups are the layout's (tensor-parallel {tp_ranks(0)}, "
                                             f"data-parallel {dp_ranks(0)}, pipeline {pp_ranks(0)} on rank 0, ...); "
                                             f"all {calls} collectives and sends ran on the right group or peer")
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    message = (f"{len(returned)} group(s) returned by build_3d_groups differ from the layout and {len(events)} "
               f"collective(s) or send(s) ran on the wrong group or peer. {shown}")
    return Check("process groups", False, message, diagnosis=safe_diagnosis(diagnose_groups, obs, events, returned))


def diagnose_groups(obs: Observation, events: list[dict], returned: list[str]) -> str:
    got = [res.get("groups") if isinstance(res, dict) else None for res in obs.results]
    if returned and all(isinstance(g, dict) and "problem" not in g for g in got):
        for name, layout in other_layouts().items():
            if all(sorted(g.get(kind) or []) == sorted(next((x for x in layout[kind] if r in x), []))
                   for r, g in enumerate(got) for kind in ("tp", "dp", "pp")):
                return (f"your groups follow another layout, {name}: the groups are consistent, but the grader "
                        f"placed the weights and rows by the puzzle's layout, rank = tp + {T}·dp + {T * 2}·pp "
                        f"(tensor-parallel fastest), so your tensor-parallel groups pair ranks that hold other "
                        f"blocks or other rows. Build the groups of that layout")
    if events and all(e["kind"] != "send" and [int(r) for r in e["peers"]] == pp_ranks(e["rank"]) for e in events):
        return ("collectives ran on the pipeline group: its ranks hold different blocks (stage 0's and stage 1's), "
                "so reducing across it adds up gradients of different weights. The gradients' all-reduce belongs on "
                "the data-parallel group (the same weights, the other replica's rows)")
    if events and all(e["kind"] != "send" and [int(r) for r in e["peers"]] == list(range(WORLD)) for e in events):
        return (f"every wrong collective ran on the default group of all {WORLD} ranks: pass the group to each "
                f"collective (`dist.all_reduce(t, group=tp_group)`); without it, a collective spans the whole world")
    sends = [e for e in events if e["kind"] == "send"]
    if sends and len(sends) == len(events):
        e = sends[0]
        return (f"rank {e['rank']} sent to rank {e['peers'][-1]}, a rank of the next stage with other columns or "
                f"another replica: each rank of a tensor-parallel pair sends its own copy of the activation to the "
                f"rank with its own columns, {' or '.join(f'rank {n}' for n in neighbours(e['rank']))}")
    return ""


def tp_bytes_by_phase(obs: Observation, rank: int) -> dict[str, int]:
    """{"forward": bytes, "backward": bytes} the rank sent on its tensor-parallel pair (a phase is where the op was
    issued: inside autograd's backward or not)."""
    return {phase: sum(b for _, b in sent_on_group(obs, rank, tp_ranks(rank), phase).values())
            for phase in ("forward", "backward")}


def diagnose_tp_bytes(obs: Observation, rank: int, by_kind, totals) -> str:
    excess = totals[rank] - TP_BYTES  # beyond what the activations' all-reduces send
    if sized_like(excess, {"gradients": W_RANK}):
        return ("the tensor-parallel group also carried this rank's gradients (one all-reduce of W/(p·t) = "
                f"{W_RANK:,} bytes): the gradients' all-reduce belongs on the data-parallel group, where the other "
                "replica holds the same slice of the same weights")
    if sized_like(excess, {"one phase twice": TP_BYTES // 2}):  # which phase, the events say (they add up to
        phases = tp_bytes_by_phase(obs, rank)                      # totals[rank]: the other phase has the excess)
        if phases["forward"] == TP_BYTES // 2:
            return ("the tensor-parallel group carried twice the backward all-reduces (m·(L/p) more of [4, 64], "
                    "all inside backward) and the forward ones once: g's backward all-reduces too (it is the "
                    "identity: both ranks of the pair already hold the whole dL/dy), or f's backward all-reduces "
                    "twice. One all-reduce per block each way: g's forward and f's backward")
        if phases["backward"] == TP_BYTES // 2:
            return ("the tensor-parallel group carried each microbatch's forward all-reduces twice (m·(L/p) more of "
                    "[4, 64], all outside backward): every stage forward ran again, as recomputation does (see "
                    "compute), or f's forward all-reduces too")
    if any(k.startswith(("all_gather", "broadcast")) for k in by_kind):
        return ("weights (or activations) were gathered within the tensor-parallel group: tensor parallelism keeps "
                "each weight split and moves only the [4, 64] activations, one all-reduce per block each way")
    return ""


def diagnose_dp_bytes(obs: Observation, rank: int, by_kind, totals, tp_sent) -> str:
    excess = totals[rank] - DP_BYTES
    if tp_sent[rank] == 0 and sized_like(excess, {"activations": TP_BYTES}):
        return ("the data-parallel group carried the tensor-parallel all-reduces of the activations (f's and g's, "
                "2·m·(L/p) of [4, 64]) and the tensor-parallel group carried nothing: f and g reduce over the "
                "tensor-parallel group, whose two ranks hold the two halves of each block's hidden columns")
    if sized_like(excess, {"a second all-reduce of the gradients": DP_BYTES}):
        return "the gradients were all-reduced twice on the data-parallel group"
    if sized_like(excess, {"once per microbatch": (M - 1) * DP_BYTES}):
        return (f"the gradients were all-reduced m = {M} times, once per microbatch (in a hook, say): the sum of the "
                f"averaged microbatch gradients is right, but it costs m times the bytes and stalls the pipeline. "
                f"All-reduce once, after the last microbatch's backward")
    return ""
