"""The flight recorder: each rank's last communication calls, kept for the moment a job hangs.

A mirror of PyTorch's Flight Recorder (TORCH_FR_BUFFER_SIZE, formerly TORCH_NCCL_TRACE_BUFFER_SIZE; dumped when
the watchdog times out a collective, TORCH_NCCL_DUMP_ON_TIMEOUT=1; read by `python -m
torch.distributed.flight_recorder.fr_trace`). Each rank keeps a ring buffer of its last N calls, one record each,
with the fields torch's records have:

    record_id          this rank's count of records (0, 1, 2, ...)
    process_group      (name, description): ("0", "default_pg") for the world, ("1", "undefined") for a new_group
    collective_seq_id  the call's number among this rank's collectives on that group, from 1 (a send or a recv
                       keeps the count it found); ranks that agree call collective #7 together
    p2p_seq_id         the same for sends and receives
    profiling_name     "sim:all_reduce", "sim:send 0->1", "sim:recv 1<-0" (torch's: "nccl:all_reduce", ...)
    input_sizes, output_sizes, input_dtypes, output_dtypes   [[16640]], ["Double"] (torch's dtype names)
    state              scheduled (issued), started (first in the rank's communication queue: it runs as soon as
                       its partners arrive), completed
    time_created, time_started, time_completed   ticks of the rank's clock (torch's: nanoseconds)
    frames             the learner's line that made the call, and the lines that called it (torch's: the stack)
    label              the innermost record_function name ("step 3"): the simulator's addition

`sim.run(..., trace_buffer_size=N)` turns it on (a collective timeout turns it on with 2,000 records, torch's
usual size); the run's result, and the error of a run that hangs, carry the dump (`.flight_recorder`, a
FlightRecorderDump). fr_analysis.py reads a dump as torch's analyzer does: it names the first collective at which
the ranks part, and the ranks that never arrived. On gloo, torch 2.13 records collectives only (no sends or
receives), and always in state "scheduled" (tests/test_sim_flight_recorder.py compares the two).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

import torch

from .fr_analysis import Analysis, analyze, describe_entry

DEFAULT_BUFFER = 2000  # torch's usual TORCH_FR_BUFFER_SIZE when the flight recorder is turned on

# torch's names for dtypes in a flight recorder record (c10's ScalarType names)
_DTYPE_NAMES = {torch.float64: "Double", torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16",
                torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
                torch.uint8: "Byte", torch.bool: "Bool", torch.complex64: "ComplexFloat",
                torch.complex128: "ComplexDouble"}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


@dataclass
class _Record:
    """One call as the rank made it; `work` says how far it got (read when the dump is taken)."""

    fields: dict
    work: object  # the call's Work: done, its start and end, its place in the rank's queue


class FlightRecorder:
    """The ring buffers of one run, one per rank. The world calls `collective` and `p2p` as each call is issued."""

    def __init__(self, world, buffer_size: int):
        self.world, self.buffer_size = world, buffer_size
        self.buffers = [deque(maxlen=buffer_size) for _ in range(world.size)]
        self.counts = [0] * world.size  # records made per rank (record_id)
        self.seq: dict[tuple[int, int], list[int]] = {}  # (rank, group id) -> [collectives, p2p calls]

    def _counters(self, rank: int, gid: int) -> list[int]:
        return self.seq.setdefault((rank, gid), [0, 0])

    def _add(self, me, work, fields: dict) -> None:
        fields.update(record_id=self.counts[me.rank], time_created=work._issued, label=me.labels[-1] if me.labels
                      else "", timeout_ticks=work._timeout)
        self.counts[me.rank] += 1
        self.buffers[me.rank].append(_Record(fields, work))

    def collective(self, me, call, group, work) -> None:
        counters = self._counters(me.rank, group.id)
        counters[0] += 1
        ins = call.reads or call.writes  # a broadcast's receiving ranks read nothing: torch records the tensor
        outs = call.writes or call.reads
        out_sizes = [list(t.shape) for t in outs]
        if call.name in ("all_gather", "all_gather_into_tensor"):  # as torch records a gather: [ranks, *input]
            out_sizes = [[len(group.ranks), *ins[0].shape]]
        self._add(me, work, dict(process_group=group_names(group), collective_seq_id=counters[0],
                                 p2p_seq_id=counters[1], profiling_name=f"sim:{call.name}", is_p2p=False,
                                 input_sizes=[list(t.shape) for t in ins], output_sizes=out_sizes,
                                 input_dtypes=[dtype_name(t.dtype) for t in ins],
                                 output_dtypes=[dtype_name(t.dtype) for t in outs],
                                 frames=[call.site, *call.callers]))

    def p2p(self, me, p, work) -> None:
        counters = self._counters(me.rank, p.group.id)
        counters[1] += 1
        peer = "?" if p.peer is None else p.peer
        name = f"sim:send {me.rank}->{peer}" if p.kind == "send" else f"sim:recv {me.rank}<-{peer}"
        size, dtype = [list(p.tensor.shape)], [dtype_name(p.tensor.dtype)]
        self._add(me, work, dict(process_group=group_names(p.group), collective_seq_id=counters[0],
                                 p2p_seq_id=counters[1], profiling_name=name, is_p2p=True, input_sizes=size,
                                 output_sizes=size, input_dtypes=dtype, output_dtypes=dtype,
                                 frames=[p.site, *p.callers]))

    def snapshot(self) -> FlightRecorderDump:
        """The dump: every rank's records as plain data, each with the state its call has reached now."""
        ranks = []
        for r, buffer in enumerate(self.buffers):
            clock = self.world.ranks[r].clock
            entries = []
            for rec in buffer:
                work = rec.work
                queued = getattr(work, "_queued", None)
                if work._done:
                    state, started, completed = "completed", getattr(work, "_start", work._end), work._end
                elif queued is not None and clock.at_head(queued):
                    state, started, completed = "started", None, None
                else:
                    state, started, completed = "scheduled", None, None
                entries.append({**rec.fields, "state": state, "time_started": started, "time_completed": completed})
            ranks.append(entries)
        groups = {group_names(g)[0]: {"name": group_names(g)[0], "desc": group_names(g)[1], "ranks": list(g.ranks)}
                  for g in self.world.groups}
        return FlightRecorderDump(ranks, groups, self.buffer_size)


def group_names(group) -> tuple[str, str]:
    """torch's (name, description) of a process group: ("0", "default_pg") for the world."""
    if group.id == 0:
        return ("0", "default_pg")
    return (str(group.id), getattr(group, "desc", None) or "undefined")


@dataclass
class FlightRecorderDump:
    """What every rank's flight recorder held when the run ended (or hung): `ranks[r]` is rank r's records, oldest
    first, each a dict with torch's fields (see the top of this file); `groups` maps a group's name to its ranks."""

    ranks: list[list[dict]]
    groups: dict = field(default_factory=dict)
    buffer_size: int = DEFAULT_BUFFER

    def analyze(self) -> Analysis:
        """What torch's fr_trace would say: the first collective at which the ranks part (fr_analysis.py)."""
        return analyze(self)

    def table(self, rank: int, last: int = 8) -> str:
        """Rank `rank`'s last `last` records, one line each, newest last."""
        rows = self.ranks[rank][-last:]
        if not rows:
            return f"rank {rank}: no records"
        lines = [f"rank {rank}: its last {len(rows)} of {len(self.ranks[rank])} records"]
        for e in rows:
            lines.append("  " + describe_entry(e))
        return "\n".join(lines)

    def to_json(self) -> str:
        """The dump as JSON, one object: {"version", "groups", "ranks": [[record, ...], ...]}."""
        return json.dumps({"version": "sim-1", "buffer_size": self.buffer_size, "groups": self.groups,
                           "ranks": self.ranks})

    @classmethod
    def from_json(cls, text: str) -> FlightRecorderDump:
        data = json.loads(text)
        return cls(data["ranks"], data["groups"], data.get("buffer_size", DEFAULT_BUFFER))
