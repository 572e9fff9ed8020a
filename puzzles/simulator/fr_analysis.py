"""Reading a flight recorder dump the way torch's analyzer does (`python -m torch.distributed.flight_recorder.fr_trace`).

The ranks of a group must make the same collective calls in the same order, so the n-th collective every rank
made on a group must be the same call. The analyzer walks each group's collectives by sequence number, from the
first that every rank still holds in its ring buffer, and stops at the first one where the ranks part:

    not all ranks joining   some ranks made collective #n on the group, others never did: the missing ranks
                            went elsewhere (a skipped step, one loop iteration fewer, an early return)
    COLLECTIVE_TYPE_MISMATCH     the ranks made different calls as their #n (all_reduce against broadcast)
    SIZE_OR_SYNTAX_MISMATCH      the same call with tensors of other shapes (one rank's gradients against another
                                 rank's loss: they are already out of step)
    COLLECTIVE_DTYPE_MISMATCH    the same call and shapes, other dtypes
    COLLECTIVE_STATE_MISMATCH    every rank made it, but it completed on some and not on others

Sends and receives are matched pairwise: one that never completed, and the peer's matching call if it made one.
The names are torch's (MatchState, "Not all ranks joining collective"), so what a learner reads here is what the
tool says on a real job.
"""

from __future__ import annotations

from dataclasses import dataclass, field


NOT_ALL_JOINED = "not all ranks joining collective"
TYPE, SIZE, DTYPE, STATE = ("COLLECTIVE_TYPE_MISMATCH", "SIZE_OR_SYNTAX_MISMATCH", "COLLECTIVE_DTYPE_MISMATCH",
                            "COLLECTIVE_STATE_MISMATCH")
UNMATCHED_P2P = "send or recv never completed"


@dataclass
class Finding:
    """The first place one group's ranks part: which collective (group and sequence number), what is wrong, each
    rank's record of it, and, for the ranks that never made it, their last record on the group."""

    kind: str
    group: str  # "0:default_pg"
    seq: int
    entries: dict  # rank -> its record of collective #seq
    missing: list = field(default_factory=list)  # ranks that never made collective #seq
    last_of_missing: dict = field(default_factory=dict)  # rank -> its last record on the group (None: none)

    @property
    def first_issued(self) -> int:
        return min((e["time_created"] for e in self.entries.values()), default=0)

    def text(self) -> str:
        head = (f"{self.kind}, sequence number {self.seq} on group {self.group}" if self.kind != UNMATCHED_P2P
                else f"{self.kind}, on group {self.group}")
        lines = [head + ":"]
        for rank in sorted(self.entries):
            lines.append(f"    rank {rank}: {describe_entry(self.entries[rank])}")
        if self.missing:
            lines.append(f"    missing ranks: {self.missing} (they had not made collective #{self.seq} on this group)")
            for rank in self.missing:
                last = self.last_of_missing.get(rank)
                lines.append(f"    rank {rank}'s last record on the group: "
                             + (describe_entry(last) if last else "none (it made no collective on it)"))
        return "\n".join(lines)


@dataclass
class Analysis:
    """Every group's first mismatch, earliest first (`first` is the one to read first)."""

    findings: list
    ranks: int

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def missing_ranks(self) -> list[int]:
        return self.first.missing if self.first else []

    def text(self) -> str:
        if not self.findings:
            return (f"flight recorder: the {self.ranks} ranks' records agree on every collective they hold (no "
                    f"errors found; something else made the job wait)")
        return ("flight recorder analysis (what torch's fr_trace reports; sequence numbers count from 1):\n  "
                + "\n  ".join(
            f.text() for f in self.findings))


def analyze(dump) -> Analysis:
    findings = []
    for name, group in dump.groups.items():
        members = list(group["ranks"])
        found = _first_collective_mismatch(dump, name, group, members)
        if found is not None:
            findings.append(found)
        findings += _unmatched_p2p(dump, name, group, members)
    findings.sort(key=lambda f: (f.first_issued, f.group, f.seq))
    return Analysis(findings, len(dump.ranks))


def _of_group(entries, name: str, p2p: bool) -> list[dict]:
    return [e for e in entries if e["process_group"][0] == name and e["is_p2p"] == p2p]


def _first_collective_mismatch(dump, name: str, group: dict, members: list[int]) -> Finding | None:
    label = f"{name}:{group['desc']}"
    held = {r: {e["collective_seq_id"]: e for e in _of_group(dump.ranks[r], name, False)} for r in members}
    if not any(held.values()):
        return None
    # A ring buffer forgets the oldest records: compare from the first sequence number every rank still holds
    # (a rank with nothing on the group has made none of them).
    start = max((min(h) for h in held.values() if h), default=1)
    end = max(max(h) for h in held.values() if h)
    for seq in range(start, end + 1):
        present = {r: held[r][seq] for r in members if seq in held[r]}
        missing = [r for r in members if seq not in held[r]]
        last = {r: (held[r][max(s for s in held[r] if s < seq)] if any(s < seq for s in held[r]) else None)
                for r in missing}
        kind = _disagreement(list(present.values()))  # the ranks that made #seq made different calls
        if kind:
            return Finding(kind, label, seq, present, missing, last)
        if missing:
            return Finding(NOT_ALL_JOINED, label, seq, present, missing, last)
        if len({e["state"] for e in present.values()}) > 1:
            return Finding(STATE, label, seq, present)
    return None


def _disagreement(entries: list[dict]) -> str | None:
    """How the records of one collective differ from the first of them (None: they agree)."""
    for e in entries[1:]:
        first = entries[0]
        if op_name(e) != op_name(first):
            return TYPE
        if (e["input_sizes"], e["output_sizes"]) != (first["input_sizes"], first["output_sizes"]):
            return SIZE
        if e["input_dtypes"] != first["input_dtypes"]:
            return DTYPE
    return None


def _peer_of(e: dict) -> int | None:
    """The other rank of a send ("send 0->1": 1) or a recv ("recv 1<-0": 0); None for a recv from any rank."""
    kind, _, ends = op_name(e).partition(" ")
    peer = ends.split("->" if kind == "send" else "<-")[-1]
    return int(peer) if peer.isdigit() else None


def _unmatched_p2p(dump, name: str, group: dict, members: list[int]) -> list[Finding]:
    """Each rank's first send or recv that never completed (the ones after it wait behind it), with the peer's
    unfinished matching call if it made one."""
    label = f"{name}:{group['desc']}"
    out = []
    for r in members:
        e = next((x for x in _of_group(dump.ranks[r], name, True) if x["state"] != "completed"), None)
        if e is None:
            continue
        entries, peer = {r: e}, _peer_of(e)
        if peer is not None and 0 <= peer < len(dump.ranks):
            want = "recv" if op_name(e).startswith("send") else "send"
            partner = next((x for x in _of_group(dump.ranks[peer], name, True) if x["state"] != "completed"
                            and op_name(x).startswith(want) and _peer_of(x) in (r, None)), None)
            if partner is not None:
                entries[peer] = partner
        out.append(Finding(UNMATCHED_P2P, label, 0, entries))
    return out


def op_name(entry: dict) -> str:
    """'all_reduce', 'send 0->1': the profiling name without its backend."""
    return entry["profiling_name"].split(":", 1)[-1]


def describe_entry(e: dict) -> str:
    """'#7 all_reduce Double[16640] on 0:default_pg, completed (ticks 1,200-1,450), at p20.py:44 [step 3]'"""
    seq = f"p2p #{e['p2p_seq_id']}" if e["is_p2p"] else f"#{e['collective_seq_id']}"
    sizes = ", ".join(f"{d}{s}" for d, s in zip(e["input_dtypes"], e["input_sizes"])) or "nothing"
    group = ":".join(e["process_group"])
    when = (f" (ticks {e['time_started']:,}-{e['time_completed']:,})" if e["state"] == "completed"
            else f" (issued at tick {e['time_created']:,})")
    where = f", at {e['frames'][0]}" if e["frames"] and e["frames"][0] else ""
    label = f" [{e['label']}]" if e["label"] else ""
    return f"{seq} {op_name(e)} {sizes} on {group}, {e['state']}{when}{where}{label}"
