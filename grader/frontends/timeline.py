"""A graded run's timeline in two renderings: Chrome trace-event JSON (what PyTorch's profiler exports, and what
Perfetto and chrome://tracing open), and a text grid for a terminal.

    python -m grader check solutions -p p6 --trace p6.json     # then open p6.json at https://ui.perfetto.dev
    python -m grader check solutions -p p6 --schedule

The trace has one process per rank and three tracks in each: its compute stream, its sends and collectives, its
receives (a rank sends and receives at once, so they get a track each: events on one track never overlap). Each
event carries what the clock knows of it: its ops, FLOPs and bytes (compute) or bytes on the wire and peers
(communication), the record_function label, the phase and the learner's line. A counter per rank draws its
memory ledger. Ticks are nanoseconds on the trace's axis.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..core.result import PuzzleResult

COMPUTE, SENDS, RECEIVES = 0, 1, 2
TRACKS = {COMPUTE: "compute", SENDS: "communication: sends and collectives", RECEIVES: "communication: receives"}
P2P_RECEIVE = ("recv",)


def track_of(event: dict) -> int:
    if event["stream"] == "compute":
        return COMPUTE
    return RECEIVES if event["kind"] in P2P_RECEIVE else SENDS


def _name(event: dict) -> str:
    if event["stream"] == "compute":
        label = f" {event['label']}" if event.get("label") else ""
        return f"{event['kind']}{label}"
    peers = event.get("peers") or ()
    if event["kind"] in ("send", "recv") and len(peers) == 2:
        return f"{event['kind']} {peers[0]}->{peers[1]}"
    return event["kind"]


def _args(event: dict) -> dict:
    keys = (("op", "flops", "product_flops", "bytes", "label", "site") if event["stream"] == "compute" else
            ("nbytes", "wire_bytes", "peers", "phase", "issued", "label", "site"))
    return {k: list(event[k]) if isinstance(event.get(k), tuple) else event.get(k) for k in keys if k in event}


def chrome_trace(result: PuzzleResult) -> dict:
    """The run of one puzzle as a Chrome trace-event object ({"traceEvents": [...], ...})."""
    figures = result.figures or {}
    events = figures.get("events", [])
    ranks = sorted({e["rank"] for e in events} | {l["rank"] for l in figures.get("ledgers", [])})
    out = []
    for r in ranks:
        out.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for tid, name in TRACKS.items():
            out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": tid, "args": {"sort_index": tid}})
    for e in sorted(events, key=lambda e: (e["rank"], track_of(e), e["start"], -e["end"])):
        if e["end"] <= e["start"]:
            continue  # a zero-length event (a collective of one rank) has nothing to draw
        out.append({"ph": "X", "name": _name(e), "cat": "compute" if e["stream"] == "compute" else "communication",
                    "pid": e["rank"], "tid": track_of(e), "ts": e["start"] / 1000, "dur": (e["end"] - e["start"]) / 1000,
                    "args": _args(e)})
    for ledger in figures.get("ledgers", []):
        for tick, nbytes in ledger.get("timeline", []):
            out.append({"ph": "C", "name": "memory (bytes)", "pid": ledger["rank"], "tid": 0, "ts": tick / 1000,
                        "args": {"bytes": nbytes}})
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"puzzle": result.id, "title": result.title, "status": result.status,
                          "makespan_ticks": figures.get("makespan"), "tick": "1 ns"}}


def write_traces(results: list[PuzzleResult], path: str) -> list[Path]:
    """One trace file per graded puzzle: `path` itself for one, `path` with the puzzle's id before the suffix
    (trace-p3.json) for several."""
    graded = [r for r in results if r.figures and r.figures.get("events") is not None]
    target = Path(path)
    written = []
    for r in graded:
        out = target if len(graded) == 1 else target.with_name(f"{target.stem}-{r.id}{target.suffix or '.json'}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(chrome_trace(r)))
        written.append(out)
    return written


# ---- the text grid

COMPUTE_CHARS = {"forward": "F", "backward": "B", "recompute": "R", "weight": "W", "io": "D"}
COMM_CHARS = {"send": "s", "recv": "r", "all_reduce": "A", "all_gather": "G", "all_gather_into_tensor": "G",
              "reduce_scatter_tensor": "S", "broadcast": "b", "barrier": "|", "all_to_all_single": "X",
              "all_to_all": "X"}
NAMES = {"F": "forward (all compute outside backward)", "B": "backward", "W": "weight gradient", "R": "recompute",
         "D": "disk", "s": "send", "r": "recv", "A": "all-reduce", "G": "all-gather", "S": "reduce-scatter",
         "X": "all-to-all", "b": "broadcast", "|": "barrier", "?": "other",
         "+": "several kinds"}


def legend(compute: str, comm: str) -> str:
    """What the characters drawn mean, those drawn only: a legend that lists `s send` over empty communication
    rows sends the reader looking for sends that are not there."""
    def named(chars: str) -> list[str]:
        order = list(NAMES)
        return [f"{c} {NAMES[c]}" for c in sorted(set(chars) - {"."}, key=order.index)]

    parts = ["  ".join(named(compute) + [". idle"])]
    if set(comm) - {"."}:
        parts.append("communication, in any part of the column: " + "  ".join(named(comm)))
    return "   |   ".join(parts)


def _compute_char(event: dict) -> str:
    label = (event.get("label") or "").lower()
    if label.startswith("recompute"):
        return "R"
    if event["kind"] == "backward" and re.match(r"w\d", label):
        return "W"
    return COMPUTE_CHARS.get(event["kind"], "?")


def _row(events: list[dict], char_of, start: int, width: int, span: int, least: float = 0.5,
         several: str | None = None) -> str:
    """One character per `span` ticks: the event that covers most of the column, or idle when none covers `least`
    of it (half, for compute; any part, for messages, which often last a tick or two of a column of hundreds);
    `several` (when given) for a column that holds events of more than one kind (a send and a recv at once)."""
    cells = []
    for c in range(width):
        lo, hi = start + c * span, start + (c + 1) * span
        cover: dict[str, int] = {}
        for e in events:
            overlap = min(hi, e["end"]) - max(lo, e["start"])
            if overlap > 0:
                ch = char_of(e)
                cover[ch] = cover.get(ch, 0) + overlap
        best = max(cover.items(), key=lambda kv: kv[1], default=(".", 0))
        if several and len(cover) > 1:
            cells.append(several)
        else:
            cells.append(best[0] if best[1] > 0 and best[1] >= least * span else ".")
    return "".join(cells)


def schedule_text(result: PuzzleResult, width: int = 96) -> str:
    """Each rank's compute and communication as a grid of characters across the makespan."""
    figures = result.figures or {}
    events = figures.get("events") or []
    makespan = figures.get("makespan") or 0
    if not events or not makespan:
        return f"{result.id}: no schedule (nothing ran on the clock)"
    span = -(-makespan // width)
    width = -(-makespan // span)
    ranks = sorted({e["rank"] for e in events})
    lines = [f"{result.id} {result.title}: makespan {makespan:,} ticks, one column = {span:,} ticks"]
    drawn_compute = drawn_comm = ""
    for r in ranks:
        mine = [e for e in events if e["rank"] == r]
        compute = [e for e in mine if e["stream"] == "compute"]
        comm = [e for e in mine if e["stream"] == "comm" and e["end"] > e["start"]]
        busy = sum(e["end"] - e["start"] for e in compute)
        compute_row = _row(compute, _compute_char, 0, width, span)
        comm_row = _row(comm, lambda e: COMM_CHARS.get(e["kind"], "?"), 0, width, span, least=0, several="+")
        drawn_compute, drawn_comm = drawn_compute + compute_row, drawn_comm + comm_row
        lines.append(f"rank {r:<2} compute |{compute_row}| busy {busy / makespan:.0%}")
        lines.append(f"        comm    |{comm_row}|")
    lines.append(legend(drawn_compute, drawn_comm))
    return "\n".join(lines)
