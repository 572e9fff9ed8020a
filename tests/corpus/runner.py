"""Running the corpus: each case on the simulator (`run_on_sim`) and on gloo processes (`run_on_gloo`, one process
group per world size, the cases that may hang in groups of their own with a short time limit), and judging the
two runs against the case's relation (`judge`). The gloo outcomes are recorded in gloo_results.json (by
`python bench/bench_corpus.py --write`), so that every test run can hold the simulator to gloo without starting
a process."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import _disable_current_modes

from puzzles import sim

from .case import CASES, DIED, HUNG, LOOSER, LOST, RAISED, REFUSED, RETURNED, RIGHT, SAME, STRICTER, WRONG, Case

TOPICS = ("collectives", "aliasing", "layouts", "reduce_ops", "p2p", "handles", "groups", "errors", "autograd",
          "all_to_all")
RECORD = Path(__file__).with_name("gloo_results.json")
TIMEOUT = 30.0  # seconds a case may take on gloo
HANG_TIMEOUT = 1.0  # gloo's time limit for the cases where a rank may wait in vain (their ops take milliseconds)


def load_cases() -> dict[str, Case]:
    for topic in TOPICS:
        importlib.import_module(f"{__package__}.{topic}")
    return CASES


@dataclass
class Outcome:
    """What one backend did with one case. values: each rank's return value, encoded as plain data (`encode`)."""

    kind: str  # returned | raised | hung | died
    error_type: str = ""
    error: str = ""  # its first line
    error_types: list = field(default_factory=list)  # the error's class and its bases (the simulator's)
    values: list | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# ---- values as plain data, compared with a tolerance by dtype


def encode(value):
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "data": t.reshape(-1).tolist()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v) for k, v in value.items()}}
    return value


_RTOL = {"float64": 1e-12, "float32": 1e-6}


def differences(a, b, where: str = "") -> list[str]:
    """Where two encoded values differ: [] when they are the same (floats within their dtype's tolerance)."""
    if isinstance(a, dict) and "dtype" in a and isinstance(b, dict) and "dtype" in b:
        if (a["dtype"], a["shape"]) != (b["dtype"], b["shape"]):
            return [f"{where}: {a['dtype']}{a['shape']} vs {b['dtype']}{b['shape']}"]
        rtol = _RTOL.get(a["dtype"], 0.0)
        for i, (x, y) in enumerate(zip(a["data"], b["data"])):
            if not _close(x, y, rtol):
                return [f"{where}[{i}] (flat): {x!r} vs {y!r}"]
        return []
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a["dict"]) | set(b["dict"]))
                for d in differences(a["dict"].get(k), b["dict"].get(k), f"{where}.{k}")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if _close(a, b, 1e-12) else [f"{where}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def _close(x, y, rtol: float) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return abs(x - y) <= rtol * max(1.0, abs(x), abs(y))
    return x == y


# ---- the simulator


def run_on_sim(fn, ranks: int) -> Outcome:
    try:
        result = sim.run(fn, ranks, timeout=10.0)
    except Exception as exc:
        return Outcome(RAISED, type(exc).__name__, _first_line(str(exc)),
                       [c.__name__ for c in type(exc).__mro__ if c is not object])
    return Outcome(RETURNED, values=[encode(v) for v in result.results])


# ---- gloo


def raw(dist, module: str, name: str):
    """Rank program of the real backend: corpus case `name` of `module`, run on torch.distributed itself, outside
    the real backend's tracker (whose private copies for blocking ops would hide what gloo does with aliased or
    strided tensors)."""
    fn = getattr(importlib.import_module(module), name)
    with _disable_current_modes():
        return fn(dist)


def raw_in_turn(dist, cases: list) -> dict:
    """Several SAME cases, one after another in one process group: {name: value}. (A task per case costs a
    process group per case, ten times the case itself.)"""
    return {name: raw(dist, module, name) for module, name in cases}


def run_on_gloo(cases: list[Case], *, timeout: float = TIMEOUT, hang_timeout: float = HANG_TIMEOUT) -> dict:
    """{case name: Outcome} from gloo processes. Per world size: the SAME cases in one task (each case alone
    again if that task fails, to say which), then the others, a task each: those where a rank may wait in vain
    (Case.may_hang) with gloo's time limit at `hang_timeout`, the rest at `timeout`. These run with TORCH_DISTRIBUTED_DEBUG=DETAIL, as the real backend
    does (its fingerprints turn some mismatches into errors); the SAME cases without (it halves their time)."""
    from grader.backends import real

    outcomes = {}
    for ranks in sorted({c.ranks for c in cases}):
        same = [c for c in cases if c.ranks == ranks and not c.may_wait]
        others = [c for c in cases if c.ranks == ranks and c.may_wait]
        if same:
            task = real.FunctionTask(raw_in_turn, ([(c.module, c.name) for c in same],), threads_allowed=True)
            [together] = real.run_tasks([task], ranks, timeout=timeout, detail=False)
            if together.ok:
                for c in same:
                    outcomes[c.name] = Outcome(RETURNED, values=[encode(p["result"][c.name])
                                                                 for p in together.payloads])
            else:
                others = same + others
        for group, limit in (([c for c in others if c.may_hang], hang_timeout),
                             ([c for c in others if not c.may_hang], timeout)):
            if group:
                tasks = [real.FunctionTask(raw, (c.module, c.name), threads_allowed=True) for c in group]
                for c, o in zip(group, real.run_tasks(tasks, ranks, timeout=limit)):
                    outcomes[c.name] = gloo_outcome(o)
    return outcomes


_TIMEOUT = re.compile(r"[Tt]imed out|timeout|monitoredBarrier")
_SECONDARY = re.compile(r"Connection closed by peer|Connection reset|Broken pipe|ECONNRESET")


def gloo_outcome(o) -> Outcome:
    """A TaskOutcome of the real backend as an Outcome: returned, raised (the first rank's own error, not a time
    limit and not a peer gone), hung (every error a time limit, or a rank never reported) or died."""
    if o.ok:
        return Outcome(RETURNED, values=[encode(p["result"]) for p in o.payloads])
    payloads = [p for p in o.payloads or [] if p is not None]
    if " died " in o.error:
        return Outcome(DIED, error=_first_line(o.error))
    primary = [p for p in payloads if "error" in p and not _TIMEOUT.search(p["error"])
               and not _SECONDARY.search(p["error"])]
    if primary:  # a rank's own error (its partners may then wait for it in vain: that is not the story)
        return Outcome(RAISED, primary[0]["error_type"], _first_line(primary[0]["error"]))
    return Outcome(HUNG, error=_first_line(next((p["error"] for p in payloads if "error" in p), o.error)))


def _first_line(text: str) -> str:
    """The first line of an error, without what changes from run to run (c10d's "[rank0]:[F1130 12:27:57.1...]")."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    line = re.sub(r"\[rank\d+\]:\[[^\]]*\] ?", "", line)
    return line if len(line) <= 300 else line[:297] + "..."


# ---- the record of gloo's outcomes


def fingerprint(c: Case) -> str:
    """Changes whenever the case's program (or its intended program) changes: then its record is stale."""
    text = inspect.getsource(c.fn) + (inspect.getsource(c.fixed) if c.fixed else "") + str(c.ranks)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def save_record(cases: dict[str, Case], outcomes: dict[str, Outcome]) -> None:
    entries = [f"  {json.dumps(name)}: " + json.dumps({"fingerprint": fingerprint(cases[name]),
                                                        **outcomes[name].to_dict()}, sort_keys=True)
               for name in sorted(outcomes)]  # one line per case: a change shows as that case's line
    head = f'{{"torch": {json.dumps(torch.__version__)}, "backend": "gloo", "cases": {{\n'
    RECORD.write_text(head + ",\n".join(entries) + "\n}}\n")


def load_record() -> dict:
    return json.loads(RECORD.read_text()) if RECORD.exists() else {"cases": {}}


def recorded_outcome(entry: dict) -> Outcome:
    return Outcome(**{k: v for k, v in entry.items() if k != "fingerprint"})


# ---- the verdict


def intended_values(c: Case) -> list | None:
    """What the case should compute: its intended program `fixed`, run on the simulator (None without one)."""
    if c.fixed is None:
        return None
    o = run_on_sim(c.fixed, c.ranks)
    if o.kind != RETURNED:
        raise AssertionError(f"{c.name}: its intended program raised on the simulator: {o.error_type}: {o.error}")
    return o.values


def gloo_verdict(c: Case, gloo: Outcome, intended: list | None) -> str:
    """The gloo outcome in the words of the relations: a run that returned is WRONG or RIGHT when the case has an
    intended program, LOST when the case says a message vanishes."""
    if gloo.kind != RETURNED:
        return gloo.kind
    if intended is None:
        return LOST if LOST in c.gloo else RETURNED
    return RIGHT if not differences(gloo.values, intended) else WRONG


def judge(c: Case, sim_o: Outcome, gloo: Outcome, intended: list | None = None) -> list[str]:
    """What is wrong with the two runs, against the case's relation ([] when they agree with it)."""
    problems = []
    verdict = gloo_verdict(c, gloo, intended)
    if c.relation == SAME:
        if sim_o.kind != RETURNED:
            problems.append(f"the simulator raised {sim_o.error_type}: {sim_o.error}")
        if gloo.kind != RETURNED:
            problems.append(f"gloo {gloo.kind}: {gloo.error_type} {gloo.error}")
        if not problems:
            problems += [f"values differ at {d}" for d in differences(sim_o.values, gloo.values, "rank")][:3]
        return problems
    if c.relation in (REFUSED, STRICTER):
        if sim_o.kind != RAISED or c.sim.__name__ not in sim_o.error_types:
            problems.append(f"the simulator should raise {c.sim.__name__}, it "
                            + (f"raised {sim_o.error_type}: {sim_o.error}" if sim_o.kind == RAISED else "returned"))
        allowed = c.gloo if c.relation == REFUSED else {RIGHT if intended is not None else RETURNED}
        if verdict not in allowed:
            problems.append(f"gloo {verdict} ({gloo.error_type} {gloo.error}), expected one of {sorted(allowed)}")
        return problems
    if c.relation == LOOSER:
        if sim_o.kind != RETURNED:
            problems.append(f"the simulator raised {sim_o.error_type}: {sim_o.error}")
        if verdict not in c.gloo:
            problems.append(f"gloo {verdict} ({gloo.error_type} {gloo.error}), expected one of {sorted(c.gloo)}")
        return problems
    raise ValueError(c.relation)
