"""The differential corpus (tests/corpus/) on both backends: every case on the simulator and on gloo processes,
judged against the relation written next to it, as a table.

    python bench/bench_corpus.py            # run both, print the summary and any case that disagrees
    python bench/bench_corpus.py --write    # also write bench/CORPUS.md and tests/corpus/gloo_results.json

The second file is the record of what gloo did with each case, which tests/test_sim_corpus.py holds the
simulator to on every test run (rewrite it whenever a case changes: the test says which are stale).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # before any process group starts: its processes import by name

OUT = ROOT / "bench" / "CORPUS.md"
COMMAND = "python bench/bench_corpus.py --write"


def run():
    import torch

    from corpus.case import LOOSER, REFUSED, SAME, STRICTER
    from corpus.runner import (gloo_verdict, intended_values, judge, load_cases, run_on_gloo, run_on_sim,
                               save_record)

    cases = load_cases()
    started = time.perf_counter()
    sims = {name: run_on_sim(c.fn, c.ranks) for name, c in cases.items()}
    sim_s = time.perf_counter() - started
    started = time.perf_counter()
    gloos = run_on_gloo(list(cases.values()))
    gloo_s = time.perf_counter() - started
    rows = []
    for name, c in cases.items():
        intended = intended_values(c)
        problems = judge(c, sims[name], gloos[name], intended)
        rows.append((c, sims[name], gloos[name], gloo_verdict(c, gloos[name], intended), problems))
    meta = {"sim_s": sim_s, "gloo_s": gloo_s, "torch": torch.__version__, "cases": len(cases),
            "relations": {r: sum(c.relation == r for c in cases.values()) for r in (SAME, REFUSED, STRICTER, LOOSER)}}
    return cases, rows, sims, gloos, meta, save_record


def _cell(text: str, limit: int = 110) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sim_cell(o) -> str:
    return "returned" if o.kind == "returned" else f"`{o.error_type}`"


def _gloo_cell(o, verdict: str) -> str:
    if verdict in ("returned", "right values", "wrong values", "lost a message"):
        return verdict if verdict != "returned" else "returned"
    if o.kind == "raised":
        message = o.error[len(o.error_type) + 2:] if o.error.startswith(f"{o.error_type}: ") else o.error
        return f"raised `{o.error_type}`: {_cell(message, 70)}"
    return verdict


def table(cases, rows, meta) -> str:
    from corpus.case import LOOSER, REFUSED, SAME, STRICTER
    from corpus.runner import TOPICS

    agree = sum(not problems for *_, problems in rows)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "# The differential corpus: the simulator against gloo, case by case",
        "",
        f"Made by `{COMMAND}` ({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"torch {meta['torch']}, gloo, load average {load:.1f}, "
        f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}). The cases are in `tests/corpus/` (one module per "
        "topic), each a rank program with its expected relation written next to it; "
        "`tests/corpus/gloo_results.json` records what gloo did with each.",
        "",
        f"**{meta['cases']} cases; {agree} of {meta['cases']} behave as their relation says.** "
        f"The simulator ran all of them in {meta['sim_s']:.1f} s; gloo in {meta['gloo_s']:.1f} s (processes "
        "started from a forkserver, the first group's start included; each case in a fresh process group).",
        "",
        "| relation | cases | what it means |",
        "| --- | --- | --- |",
        f"| same values | {meta['relations'][SAME]} | both return the same values (float64 to 1e-12, float32 to "
        "1e-6, integers and bools exactly) |",
        f"| simulator refuses | {meta['relations'][REFUSED]} | the simulator raises a named error where gloo "
        "fails: raises, hangs, kills a process, computes wrong values or loses a message |",
        f"| simulator stricter | {meta['relations'][STRICTER]} | the simulator raises where gloo computes the "
        "intended values: deliberate, explained below |",
        f"| simulator looser | {meta['relations'][LOOSER]} | the simulator computes where gloo raises: "
        "deliberate, explained below |",
        "",
        "How gloo is run: `grader.backends.real.run_tasks` with `FunctionTask`s, one process per rank, on "
        "`torch.distributed` itself (outside the real backend's tracker, whose private copies for blocking "
        "collectives would hide what gloo does with aliased and strided tensors). The same-values cases of a "
        "world size run one after another in one process group; every other case runs alone, in a process group "
        "with `TORCH_DISTRIBUTED_DEBUG=DETAIL` (as the real backend runs) and a 1 s time limit, after which a rank "
        "still waiting counts as hung. *wrong values* means gloo returned, but not what the case's intended "
        "program (`fixed_...` beside it) gives; *right values* beside *wrong values* marks a race that gloo "
        "sometimes wins.",
        "",
    ]
    for topic in TOPICS:
        topic_rows = [r for r in rows if r[0].topic == topic]
        if not topic_rows:
            continue
        doc = " ".join(sys.modules[f"corpus.{topic}"].__doc__.strip().split("\n\n")[0].split())
        lines += [f"## {topic} ({len(topic_rows)})", "", doc, "",
                  "| case | ranks | what it does | expected | simulator | gloo | as expected |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for c, s, g, verdict, problems in topic_rows:
            expected = c.relation if c.sim is None else f"{c.relation}: `{c.sim.__name__}`"
            if c.gloo:
                expected += f"; gloo {' or '.join(sorted(c.gloo))}"
            ok = "yes" if not problems else "NO: " + _cell("; ".join(problems), 80)
            lines.append(f"| `{c.name}` | {c.ranks} | {_cell(c.summary)} | {expected} | {_sim_cell(s)} | "
                         f"{_gloo_cell(g, verdict)} | {ok} |")
        lines.append("")
    lines += ["## Deliberate divergences", "",
              "Where the simulator does not do what gloo does, and why that is on purpose.", ""]
    by_why: dict[str, list] = {}
    for c, s, g, verdict, problems in rows:
        if c.relation in (STRICTER, LOOSER):
            by_why.setdefault(c.why, []).append((c, verdict))
    for why, group in by_why.items():
        names = ", ".join(f"`{c.name}`" for c, _ in group)
        outcome = "; ".join(sorted({f"{c.relation}, gloo {verdict}" for c, verdict in group}))
        lines += [f"- **{names}** ({outcome}). {why}", ""]
    lines += [
        "## Notes",
        "",
        "- **AVG.** gloo on torch 2.13 runs `ReduceOp.AVG` on floating-point tensors (the `all_reduce_avg` and "
        "`reduce_scatter_tensor_ops` cases); on integers it raises, and so does the simulator "
        "(`average_of_integers`). NCCL runs AVG too, so the simulator keeps it.",
        "- **Bitwise ops.** BAND, BOR and BXOR run on integer and bool tensors on both; on floats both raise.",
        "- **Strided tensors.** gloo copies strided tensors properly in `all_gather`, `all_gather_into_tensor` and "
        "`reduce_scatter_tensor` (the *simulator stricter* cases in layouts). NCCL is stricter: torch's "
        "ProcessGroupNCCL refuses a non-contiguous tensor in every collective (\"Tensors must be contiguous\"), and "
        "so does the simulator, so that an answer that passes here also runs on GPUs; NCCL was not run here (no "
        "GPU).",
        "- **Waiting.** On gloo a send or recv handle says `is_completed()` only after `wait()` (measured: False "
        "0.4 s after the data arrived), and a second `wait()` on it never returns; the simulator does the same, "
        "and raises `WorkError` where gloo would hang. A dropped handle is `UnwaitedWorkError`: gloo lost the "
        "message (the receiver hung) in some runs and not in others.",
        "- **The clock's issue order.** Time is the simulator's own (gloo has no clock), and the corpus compares values "
        "and errors, which the clock never changes. The clock places each rank's communication in the order the "
        "rank issued it, as NCCL runs a stream: sends one after another, receives one after another, a collective "
        "after everything issued before it. gloo runs point-to-point operations independently, and torch's NCCL "
        "backend gives each pair of peers a stream of its own, so both run programs in which an earlier operation "
        "waits for a later one (the `tags_received_out_of_order` case; an async all-reduce left pending across a "
        "send its partner needs first). The simulator runs them too, as gloo does, placing the waited-for operation "
        "out of issue order, and adds a warning to the run that a single NCCL stream would hang there. A wait is "
        "never held back for the clock's sake alone: no program deadlocks here that gloo runs.",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)} and the gloo record")
    args = parser.parse_args(argv)
    cases, rows, sims, gloos, meta, save_record = run()
    bad = [(c.name, problems) for c, *_, problems in rows if problems]
    print(f"{meta['cases']} cases: {meta['relations']}; simulator {meta['sim_s']:.1f} s, gloo {meta['gloo_s']:.1f} s")
    for name, problems in bad:
        print(f"  NOT AS EXPECTED {name}: {'; '.join(problems)}")
    if args.write:
        save_record(cases, gloos)
        OUT.write_text(table(cases, rows, meta))
        print(f"wrote {OUT.relative_to(ROOT)} and tests/corpus/gloo_results.json")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
