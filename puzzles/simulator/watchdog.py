"""Collective timeouts: NCCL's watchdog, on the simulated clock.

`sim.run(..., collective_timeout=T)` is `init_process_group(timeout=T)` (and, in such a run, `dist.new_group(...,
timeout=T)` a group's own): T ticks, or a timedelta (a tick is a nanosecond, so NCCL's default of ten minutes is 600e9 ticks).
A communication call times out when it has not completed T ticks after its rank issued it, and then, as on a job
whose NCCL watchdog fires, the run fails with CollectiveTimeoutError:

    [Rank 1] Watchdog caught collective operation timeout: WorkSim(SeqNum=7, OpType=ALLREDUCE, NumelIn=16640,
    NumelOut=16640, Timeout(ticks)=1000000) ran for 1,000,000 ticks before timing out.

It happens in two ways:
  - the call never completes: some rank never makes it (a skipped step, one loop iteration fewer, another
    collective first). The run is stuck; every rank that waits times out T ticks after its oldest unfinished
    call, and the error holds each one's watchdog line, then the flight recorder's analysis (which collective, and
    which ranks never arrived), then what each rank waits for, on which line. Raising T only makes the job wait
    longer before it says so.
  - the call completes, but more than T ticks after the rank issued it (a partner arrived that much later: a
    straggler slower than the timeout). The rank raises it when it waits for the call.

Every collective timeout turns the flight recorder on (flight_recorder.py), as TORCH_NCCL_DUMP_ON_TIMEOUT wants it:
the error carries the dump (`error.flight_recorder`).
"""

from __future__ import annotations

import datetime

from .flight_recorder import FlightRecorder
from .fr_analysis import describe_entry
from .types import (CollectiveMismatchError, CollectiveTimeoutError, DeadlockError, P2PMismatchError, SimError,
                    UnmatchedError)

_OP_TYPES = {"all_reduce": "ALLREDUCE", "broadcast": "BROADCAST", "all_gather": "ALLGATHER",
             "all_gather_into_tensor": "_ALLGATHER_BASE", "reduce_scatter_tensor": "_REDUCE_SCATTER_BASE",
             "all_to_all_single": "ALLTOALL_BASE", "all_to_all": "ALLTOALL", "barrier": "BARRIER", "send": "SEND",
             "recv": "RECV"}


def ticks_of(timeout) -> int | None:
    """A timeout in ticks: a timedelta (a tick is a nanosecond), a whole number of ticks, or None (none)."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        return timeout // datetime.timedelta(microseconds=1) * 1000
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
        raise ValueError(f"a collective timeout is a positive number of ticks or a timedelta, got {timeout!r}")
    return timeout


def start(world, collective_timeout, trace_buffer_size) -> None:
    """Set up the run's timeout and flight recorder (sim.run's collective_timeout and trace_buffer_size)."""
    world.collective_timeout = ticks_of(collective_timeout)
    size = trace_buffer_size if trace_buffer_size is not None else (2000 if world.collective_timeout else 0)
    if size < 0:
        raise ValueError(f"trace_buffer_size must be at least 0, got {size}")
    world.flight = FlightRecorder(world, size) if size else None


def on_issue(world, me, work, group, call=None, p2p=None) -> None:
    """A rank issued a communication call: note when, with which timeout, and record it in the flight recorder."""
    work._issued = work._queued.issued
    work._timeout = timeout_of(world, group)
    if world.flight is not None:
        if call is not None:
            world.flight.collective(me, call, group, work)
        else:
            world.flight.p2p(me, p2p, work)


class _NeverIssued:
    """The Work of a call refused at once (it met a different call): it stays 'scheduled' in the records."""

    _done, _queued = False, None

    def __init__(self, issued: int, timeout):
        self._issued, self._timeout = issued, timeout


def on_mismatch(world, call, group) -> None:
    """A collective call that met a different one was refused before it was issued: record it all the same."""
    if world.flight is not None:
        world.flight.collective(world.ranks[call.rank], call, group,
                                _NeverIssued(call.issued, timeout_of(world, group)))


def timeout_of(world, group) -> int | None:
    """A group's timeout in ticks: its own (new_group's timeout=), else the run's; None in a run without a
    collective timeout (there the simulator names a hang at once, whatever timeout a group was made with)."""
    if world.collective_timeout is None:
        return None
    own = getattr(group, "timeout", None)
    return own if own is not None else world.collective_timeout


def on_wait(world, me, work) -> None:
    """A rank's wait() returned: the call completed. Late beyond its timeout, it is the rank's error."""
    limit = getattr(work, "_timeout", None)
    if limit is None or work._end - work._issued <= limit:
        return
    record = _record_of(world, me.rank, work)
    late = ""
    if record is not None and not record["is_p2p"]:
        others = _same_collective(world, record)
        last = max(others.values(), default=None)
        if last is not None:
            ranks = sorted(r for r, t in others.items() if t == last)
            late = (f" It completed at tick {work._end:,}: rank(s) {ranks} issued it last, at tick {last:,} (on a "
                    f"real job the watchdog would have stopped the process at tick {work._issued + limit:,}).")
    raise CollectiveTimeoutError(_watchdog_line(me.rank, work, record, work._end - work._issued) + late
                                 + " A rank that is that much slower than the others is a straggler: find it in "
                                   "the per-rank timings, and even out the work.")


def timed_out(world, error: SimError) -> SimError:
    """The run is stuck (`error` says why). With a collective timeout, that is a watchdog timeout on every rank
    that waits: the error names each one's call and when it fired, then the flight recorder's analysis."""
    if world.collective_timeout is None:
        return error
    lines = []
    for r in world.ranks:
        pending = [e for lane in ("send", "recv") for e in r.clock.pending[lane] if e.work is not None]
        if r.status != "blocked" or not pending:
            continue
        oldest = min(pending, key=lambda e: e.issued)
        work = oldest.work
        limit = getattr(work, "_timeout", None)
        if limit is None:
            continue
        record = _record_of(world, r.rank, work)
        lines.append((oldest.issued + limit, _watchdog_line(r.rank, work, record, limit)
                      + ("" if record else f" (issued at tick {oldest.issued:,}, at {work.site})")))
    if not lines:
        return error
    lines.sort(key=lambda x: x[0])
    fired, _ = lines[0]
    text = "\n".join(line for _, line in lines)
    timeout = CollectiveTimeoutError(
        f"{text}\nThe first watchdog fired at tick {fired:,}. Some rank never made the call the others wait in, so "
        f"a longer timeout would only wait longer: the flight recorder's analysis below says at which collective "
        f"the ranks parted, and which ranks never arrived (its sequence numbers count from 1, as torch's do; the "
        f"\"call #n\" below counts from 0).\n{error}")
    timeout.stuck = error
    return timeout


def on_error(world, error: BaseException) -> BaseException:
    """The run failed: the error carries the flight recorder's dump (`error.flight_recorder`), and its analysis
    as a note (the text every report shows) when the failure is the communication's (a hang, a mismatch) or the
    analysis finds the ranks apart; an error of the learner's own (a stub's NotImplementedError, a bad shape) is
    not dressed up as a communication problem."""
    if world.flight is None:
        return error
    dump = world.flight.snapshot()
    try:
        error.flight_recorder = dump
    except AttributeError:
        return error
    analysis = dump.analyze()
    communication = isinstance(error, (DeadlockError, CollectiveMismatchError, P2PMismatchError, UnmatchedError))
    if hasattr(error, "add_note") and (communication or analysis.findings):
        tables = "\n".join(dump.table(r, last=3) for r in range(world.size))
        error.add_note(f"{analysis.text()}\nflight recorder dump (each rank's last records; the whole dump is "
                       f"error.flight_recorder):\n{tables}")
    return error


def _record_of(world, rank: int, work) -> dict | None:
    if world.flight is None:
        return None
    return next((dict(rec.fields) for rec in world.flight.buffers[rank] if rec.work is work), None)


def _same_collective(world, record: dict) -> dict[int, int]:
    """rank -> the tick it issued the same collective (same group, same sequence number)."""
    out = {}
    for r, buffer in enumerate(world.flight.buffers):
        for rec in buffer:
            f = rec.fields
            if (not f["is_p2p"] and f["process_group"] == record["process_group"]
                    and f["collective_seq_id"] == record["collective_seq_id"]):
                out[r] = f["time_created"]
    return out


def _watchdog_line(rank: int, work, record: dict | None, ran: int) -> str:
    what = getattr(work, "issued_as", work.what)
    op = _OP_TYPES.get(what.lstrip("i"), what.upper())
    if record is not None:
        seq = record["p2p_seq_id"] if record["is_p2p"] else record["collective_seq_id"]
        numel_in = sum(_numel(s) for s in record["input_sizes"])
        numel_out = sum(_numel(s) for s in record["output_sizes"])
        detail = f"SeqNum={seq}, OpType={op}, NumelIn={numel_in}, NumelOut={numel_out}, "
        where = f" The call: {describe_entry({**record, 'state': 'scheduled', 'time_started': None})}."
    else:
        detail, where = f"OpType={op}, ", ""
    return (f"[Rank {rank}] Watchdog caught collective operation timeout: WorkSim({detail}"
            f"Timeout(ticks)={work._timeout}) ran for {ran:,} ticks before timing out.{where}")


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
