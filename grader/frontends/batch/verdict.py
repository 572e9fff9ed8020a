"""The batch parent's side of one puzzle: from what the warden reported to a PuzzleResult and the row's flags.

Nothing the puzzle's process said is taken on trust: its record is parsed without pickle (record.py: JSON and
raw tensor bytes, nothing that can name code), its structure and its figures' consistency are checked, the backend is
forced to the simulator's, the reference is computed here, and any sign of tampering makes the puzzle an
error. Every text that came from the learner's process is escaped before it reaches a terminal or a report.
"""

from __future__ import annotations

import copy
import dataclasses
import signal
import threading

from ...core.grading import grade_observation
from ...core.result import ERROR, NOT_ATTEMPTED, PARTIAL, TAMPERED, PuzzleResult

# What a puzzle's process may report instead of an observation (what backends.simulator.observe_file returns when
# there is nothing to grade: not attempted, partly written, an error, tampering its own detector found). PASS,
# FAIL and a grader failure only the parent decides: a record that claims "grader_error" is malformed.
CHILD_STATUSES = (NOT_ATTEMPTED, PARTIAL, ERROR, TAMPERED)
from ...core.spec import Observation
from . import record as record_format
from .sandbox import FILE_MB

MEMORY_SIGNS = ("MemoryError", "can't allocate memory", "Cannot allocate memory", "std::bad_alloc")
LEDGER_KEYS = {"rank", "current", "peak", "peak_tick", "timeline", "peak_by_line"}
OBSERVATION_KEYS = {f.name for f in dataclasses.fields(Observation)}


class _ClassReference:
    """The spec as grade_observation sees it, with the serial reference computed once per (puzzle, seed) for the
    whole class (every submission is graded on the same inputs) and handed out as a deep copy each time, so that
    no check can change it for the next submission. Measured: it was half of the parent's time per submission."""

    _cache: dict = {}
    _lock = threading.Lock()

    def __init__(self, spec, seed: int):
        self._spec, self._seed = spec, seed

    def __getattr__(self, name):
        return getattr(self._spec, name)

    def reference(self, inputs):
        key = (self._spec.id, self._seed)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = self._spec.reference(self._spec.make_inputs(self._seed))
            return copy.deepcopy(self._cache[key])


def printable(text, limit: int = 2000) -> str:
    """Text from a learner's process, safe for a terminal: control characters (escape sequences, carriage
    returns that redraw a line, bells) shown as \\x.. escapes; newlines and tabs kept; at most `limit` characters."""
    text = str(text)
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text) - limit} more characters)"
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def verdict(spec, reply: dict, payload: bytes, seed: int, timeout: float, memory_mb: int):
    """(PuzzleResult, flags) for one puzzle."""
    def error(why: str) -> PuzzleResult:
        return PuzzleResult(spec.id, spec.name, spec.title, ERROR, error=why)

    output = printable(reply.get("output", "").strip()[-600:], 600)
    said = f"\n  its last output: {output}" if output else ""
    if reply.get("warden_error"):
        return error(f"the grader could not run this puzzle (a grader failure, not the answer's): "
                     f"{printable(reply['warden_error'], 600)}"), [f"{spec.id}: grader failure"]
    if not reply.get("jailed"):  # the puzzle's process ended before any learner's code ran
        return error(f"the grader could not run this puzzle: the sandbox could not be entered (a grader failure, "
                     f"not the answer's){said}"), [f"{spec.id}: grader failure (the sandbox could not be entered)"]
    if reply.get("timed_out"):
        return error(f"stopped after {timeout:g} s: an endless loop, or a wait that never ends? (the limit is "
                     f"{timeout:g} s per puzzle; the other puzzles are graded on their own){said}"), []
    if reply.get("too_big"):
        return error("its record was larger than the grader accepts (what do the ranks return?)"), []
    if not payload:
        return error(_ended(reply, memory_mb, said)), []
    record, problem = _load(payload, spec)
    if problem:
        return error(f"the puzzle's process reported a malformed record ({problem}): was the grader's output "
                     f"channel written to?"), [f"{spec.id}: malformed record ({problem})"]
    findings = [printable(f, 300) for f in record["findings"]]
    if findings:
        shown = "; ".join(findings[:3]) + (f"; and {len(findings) - 3} more" if len(findings) > 3 else "")
        return PuzzleResult(spec.id, spec.name, spec.title, TAMPERED, error=(
            f"the grader's or the simulator's code was changed while this puzzle ran (tampering): {shown}")), [
            f"{spec.id}: tampering: {f}" for f in findings]
    if record["status"] != "observed":
        why = printable(record.get("error", ""))
        if record["status"] == ERROR and any(s in why for s in MEMORY_SIGNS):
            why = f"ran out of memory (the limit is {memory_mb} MiB per puzzle, beyond the grader's own): {why}"
        if record["status"] == ERROR:
            why += said
        flags = [f"{spec.id}: tampering: {why.splitlines()[0] if why else ''}"] if record["status"] == TAMPERED else []
        return PuzzleResult(spec.id, spec.name, spec.title, record["status"], error=why), flags
    obs = Observation(**{**record["observation"], "backend": "sim"})  # a record cannot make clock checks optional
    try:
        return grade_observation(_ClassReference(spec, seed), obs, spec.make_inputs(seed)), []
    except Exception as exc:  # the learner's functions returned something the checks cannot read
        return error(f"the answer returned data the grader cannot check: {type(exc).__name__}: "
                     f"{printable(exc, 300)}"), []


def _ended(reply: dict, memory_mb: int, said: str) -> str:
    """Why a puzzle's process ended without a record, in the learner's terms."""
    memory = any(s in reply.get("output", "") for s in MEMORY_SIGNS)
    if memory:
        return f"ran out of memory (the limit is {memory_mb} MiB per puzzle, beyond the grader's own){said}"
    sig = reply.get("signal")
    if sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        why = {signal.SIGXCPU: "used up its CPU time (an endless loop?)",
               signal.SIGXFSZ: f"wrote a file larger than {FILE_MB} MiB",
               signal.SIGKILL: "was killed (out of memory?)",
               signal.SIGSEGV: "crashed in native code (SIGSEGV)"}.get(sig, f"was killed by {name}")
        return f"the puzzle's process {why} before it reported{said}"
    code = reply.get("exit")
    return (f"the puzzle's process ended (exit status {code}) before it reported: os._exit() or sys.exit() "
            f"outside the puzzle's functions?{said}")


def _load(payload: bytes, spec) -> tuple[dict, str]:
    """The record, or why it is refused: exactly one record (record.py: JSON and raw tensor bytes, no pickle), with
    the keys, lengths and consistent figures an honest run produces."""
    try:
        record = record_format.loads(payload)
    except record_format.RecordError as exc:
        return {}, str(exc)
    except Exception as exc:  # noqa: BLE001  (a parser's bug must not take the batch down; record.py aims at none)
        return {}, f"unreadable ({type(exc).__name__})"
    if not isinstance(record, dict) or record.get("status") not in ("observed", *CHILD_STATUSES):
        return {}, "no status"
    if not isinstance(record.get("findings"), list) or not all(isinstance(f, str) for f in record["findings"]):
        return {}, "no findings list"
    if record["status"] != "observed":
        return record, "" if isinstance(record.get("error"), str) else "no error text"
    return record, _observation_problem(record.get("observation"), spec.world_size)


def _observation_problem(obs, world_size: int) -> str:
    if not isinstance(obs, dict) or set(obs) != OBSERVATION_KEYS:
        return "not an observation"
    if not all(isinstance(obs[k], list) for k in ("results", "peak_bytes", "ledgers", "events", "warnings")):
        return "a field of the wrong type"
    if not (len(obs["results"]) == len(obs["peak_bytes"]) == len(obs["ledgers"]) == world_size):
        return f"not {world_size} ranks"
    for rank, (peak, ledger) in enumerate(zip(obs["peak_bytes"], obs["ledgers"])):
        if not isinstance(ledger, dict) or set(ledger) != LEDGER_KEYS or ledger["rank"] != rank:
            return f"rank {rank}'s ledger is malformed"
        timeline = ledger["timeline"]
        if not all(isinstance(p, list) and len(p) == 2 and all(type(v) is int for v in p) for p in timeline):
            return f"rank {rank}'s timeline is malformed"
        if type(peak) is not int or peak != ledger["peak"] or peak != max((b for _, b in timeline), default=0):
            return f"rank {rank}'s peak ({peak}) disagrees with its own timeline"
    ends = []
    for e in obs["events"]:
        if not isinstance(e, dict) or type(e.get("start")) is not int or type(e.get("end")) is not int \
                or not 0 <= e["start"] <= e["end"] or e.get("rank") not in range(world_size):
            return "a malformed event"
        ends.append(e["end"])
    if type(obs["makespan"]) is not int or obs["makespan"] != max(ends, default=0):
        return "the makespan disagrees with the events"
    if not all(isinstance(w, str) for w in obs["warnings"]):
        return "a malformed warning"
    return ""
