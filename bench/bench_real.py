"""The same puzzles graded on the simulator and on real gloo processes, in one run: wall time of each, and the ratio.

    python bench/bench_real.py                 # every puzzle, 3 repeats (about a minute on 2 cores)
    python bench/bench_real.py -p p3 -p p8     # some puzzles
    python bench/bench_real.py --write         # also write bench/REAL_BACKEND.md and bench/out/real.json

For each puzzle, graded from solutions/ with the same seed:

- sim, grade: `grade_file` (load the file, make the inputs, run the ranks on the simulator, reference, checks).
- sim, ranks: `sim.run` alone (the rank program on the simulator).
- gloo, grade (in a group): one puzzle's turn in a warm process group (`real.run_tasks`, several puzzles one after
  another): from the parent's go to every rank's report, plus the parent's reference and checks.
- gloo, ranks: the slowest rank's time inside its process (the same rank program, on torch.distributed).
- gloo, one command: `grade_target(..., backend="torch")` for that puzzle alone, with the forkserver already up:
  what `python -m grader check solutions -p pN --backend torch` costs after its first group.
- cold start: the first group of a fresh Python process (the forkserver imports torch once), reported apart.

Medians over the repeats. Also checks, for each puzzle, that the two backends agree (values, peak memory, ledger,
communication, FLOPs): `real.compare`. Nothing is asserted; the numbers are recorded in bench/REAL_BACKEND.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

try:
    from grader.backends import real
    from grader.backends.learner_code import load_module
    from grader.backends.simulator import grade_file, observe
    from grader.core.grading import grade_observation
    from grader.frontends.targets import REPO, grade_target
except ImportError:  # a checkout that was not pip-installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from grader.backends import real
    from grader.backends.learner_code import load_module
    from grader.backends.simulator import grade_file, observe
    from grader.core.grading import grade_observation
    from grader.frontends.targets import REPO, grade_target

import torch

from grader.specs import SPECS
from puzzles import model, sim

SEED = 0


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def sim_figures(spec, path: Path) -> tuple[float, float]:
    grade_s, _ = timed(lambda: grade_file(spec, path, SEED))
    with spec.run_context():
        module = load_module(path)
        inputs = spec.make_inputs(SEED)
        args, rank_args = spec.launch(inputs)
        ranks_s, _ = timed(lambda: sim.run(spec.program(module), spec.world_size, args=args, rank_args=rank_args,
                                           cost=spec.cost, seed=SEED, library_files=[model.__file__]))
    return grade_s, ranks_s


def gloo_in_group(specs, folder: Path) -> dict:
    """Every puzzle in turn in one group per world size; per puzzle: (turn + checks, slowest rank, agreement)."""
    out = {}
    for n in sorted({s.world_size for s in specs}):
        group = [s for s in specs if s.world_size == n]
        # a warm-up puzzle first, so that no measured turn includes the group's start
        tasks = [real.PuzzleTask(group[0].id, str(folder / group[0].filename), SEED)]
        tasks += [real.PuzzleTask(s.id, str(folder / s.filename), SEED) for s in group]
        outcomes = real.run_tasks(tasks, n)
        for spec, outcome in zip(group, outcomes[1:]):
            if not outcome.ok:
                out[spec.id] = {"error": outcome.error}
                continue
            obs = real.observation(outcome.payloads)
            inputs = spec.make_inputs(SEED)
            check_s, result = timed(lambda: grade_observation(spec, obs, inputs))
            with spec.run_context():
                module = load_module(folder / spec.filename)
            sim_obs = observe(spec, module, inputs, SEED)
            comparison = real.compare(sim_obs, obs)
            out[spec.id] = {"grade_s": outcome.wall_s + check_s, "ranks_s": max(p["run_s"] for p in outcome.payloads),
                            "status": result.status, "agree": comparison.agree,
                            "max_rel_diff": comparison.max_relative_difference,
                            "differences": comparison.differences}
    return out


def wrong_answers(timeout: float) -> list[str]:
    """Every tests/wrong answer on both backends, graded as `check --backend torch` grades (real.grade_files: the
    same source scan, import fingerprint and rank reports; one group per world size): status and failing checks."""
    paths = sorted((REPO / "tests" / "wrong").glob("p*_*.py"))
    answers = [(SPECS[p.stem.split("_")[0]], p) for p in paths]
    rows = ["| wrong answer | simulator | gloo | same? |", "| --- | --- | --- | --- |"]
    for (spec, path), result in zip(answers, real.grade_files(answers, SEED, timeout=timeout)):
        sim_result = grade_file(spec, path, SEED)
        sim_failed = [c.name for c in sim_result.checks if not c.passed]
        sim_text = _verdict(sim_result.status, sim_failed)
        only = [c.name for c in result.checks if c.simulator_only]
        failed = [c.name for c in result.checks if not c.passed]
        gloo_text = _verdict(result.status, failed) + (f" ({', '.join(only)}: simulator only)" if only else "")
        clock_aside = (result.checks and sorted(set(sim_failed) - set(only)) == sorted(failed)
                       and sim_result.status != "error")
        same = ("yes" if sim_text == gloo_text.split(" (")[0] else "yes, but for the clock checks" if clock_aside
                else "**no**")
        rows.append(f"| {path.stem} | {sim_text} | {gloo_text} | {same} |")
    return rows


def _verdict(status: str, failed) -> str:
    return status + (f": {', '.join(sorted(failed))}" if failed else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--puzzle", "-p", action="append", help="only this puzzle; repeatable")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--write", action="store_true", help="write bench/REAL_BACKEND.md and bench/out/real.json")
    p.add_argument("--wrong", action="store_true", help="also grade every tests/wrong answer on both backends")
    args = p.parse_args(argv)
    specs = [SPECS[i] for i in args.puzzle] if args.puzzle else list(SPECS.values())
    folder = REPO / "solutions"
    torch.set_num_threads(1)

    cold_s, _ = timed(lambda: real.run_tasks([real.PuzzleTask(specs[0].id, str(folder / specs[0].filename), SEED)],
                                             specs[0].world_size))
    print(f"cold start (forkserver imports torch, then a {specs[0].world_size}-process group grades "
          f"{specs[0].id}): {cold_s:.2f} s")

    for spec in specs:  # warm-up: the simulator's process pays its first-backward imports here, not in a row
        sim_figures(spec, folder / spec.filename)
    rows = {s.id: {"sim_grade": [], "sim_ranks": [], "gloo_grade": [], "gloo_ranks": [], "gloo_command": []}
            for s in specs}
    agree = {}
    for rep in range(args.repeats):
        for spec in specs:
            g, r = sim_figures(spec, folder / spec.filename)
            rows[spec.id]["sim_grade"].append(g)
            rows[spec.id]["sim_ranks"].append(r)
            command_s, _ = timed(lambda: grade_target(folder, [spec.id], SEED, backend="torch"))
            rows[spec.id]["gloo_command"].append(command_s)
        for pid, figures in gloo_in_group(specs, folder).items():
            if "error" in figures:
                print(f"{pid}: gloo error: {figures['error']}")
                continue
            rows[pid]["gloo_grade"].append(figures["grade_s"])
            rows[pid]["gloo_ranks"].append(figures["ranks_s"])
            agree[pid] = figures
        print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr)

    med = {pid: {k: statistics.median(v) if v else float("nan") for k, v in r.items()} for pid, r in rows.items()}
    header = ("| puzzle | ranks | sim: grade | gloo: grade (warm group) | ratio | sim: ranks only | gloo: ranks only "
              "| ratio | gloo: one command | agree |")
    lines = [header, "|" + " --- |" * 10]
    for spec in specs:
        m = med[spec.id]
        a = agree.get(spec.id, {})
        verdict = ("yes" if a.get("agree") else "NO: " + "; ".join(a.get("differences", [])[:2])) if a else "-"
        lines.append(f"| {spec.id} | {spec.world_size} | {m['sim_grade'] * 1e3:.0f} ms | {m['gloo_grade'] * 1e3:.0f} ms "
                     f"| {m['gloo_grade'] / m['sim_grade']:.2f} | {m['sim_ranks'] * 1e3:.0f} ms "
                     f"| {m['gloo_ranks'] * 1e3:.0f} ms | {m['gloo_ranks'] / m['sim_ranks']:.2f} "
                     f"| {m['gloo_command'] * 1e3:.0f} ms | {verdict} |")
    total_sim = sum(m["sim_grade"] for m in med.values())
    total_gloo = sum(m["gloo_grade"] for m in med.values())
    lines.append(f"| all | | {total_sim * 1e3:.0f} ms | {total_gloo * 1e3:.0f} ms | {total_gloo / total_sim:.2f} | | | | | |")
    table = "\n".join(lines)
    print(table)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch "
               f"{torch.__version__}, load average {os.getloadavg()[0]:.1f} at the end, "
               f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}")
    print(machine)
    wrong_rows = wrong_answers(timeout=5.0) if args.wrong else []
    if wrong_rows:
        print("\n".join(wrong_rows))
    if args.write:
        out = REPO / "bench" / "out"
        out.mkdir(parents=True, exist_ok=True)
        (out / "real.json").write_text(json.dumps({"machine": machine, "cold_start_s": cold_s, "repeats": args.repeats,
                                                   "seconds": rows, "agree": {k: {x: v[x] for x in ("agree",
                                                   "max_rel_diff", "differences")} for k, v in agree.items()}},
                                                  indent=1))
        path = REPO / "bench" / "REAL_BACKEND.md"
        path.write_text(render(table, machine, cold_s, args.repeats, "\n".join(wrong_rows)))
        print(f"wrote {path.relative_to(REPO)} and bench/out/real.json")
    return 0


def render(table: str, machine: str, cold_s: float, repeats: int, wrong: str = "") -> str:
    wrong_section = f"""
## The deliberately wrong answers on both backends

Every file of `tests/wrong/` (`--wrong`; seed {SEED}; a 5 s time limit on gloo), graded on gloo as `check --backend
torch` grades (`real.grade_files`): the status and the checks that failed. "simulator only" lists the clock checks
gloo reports without making them.

{wrong}
""" if wrong else ""
    return _render(table, machine, cold_s, repeats) + wrong_section + DIFFERENCES


def _render(table: str, machine: str, cold_s: float, repeats: int) -> str:
    return f"""# The simulator and real gloo processes, side by side

Measured by `python bench/bench_real.py --write --wrong` ({machine}); medians of {repeats} repeats. Every puzzle graded
from `solutions/` with seed {SEED}, once on the simulator and once on real torch.distributed processes (gloo, CPU,
one process per rank, started from a forkserver).

{table}

- *grade*: everything the grader does for one puzzle. Simulator: load the file, make the inputs, run the ranks,
  the serial reference, the checks. gloo: the puzzle's turn in a process group that is already up (the parent's go
  to every rank's report: each rank makes the inputs, runs the program under its tracker and writes its result),
  plus the parent's reference and checks.
- *ranks only*: the rank program alone: `sim.run` against the slowest rank's time inside its own process.
- *one command*: `grade_target(solutions, [pN], backend="torch")` alone, forkserver already running: what
  `python -m grader check solutions -p pN --backend torch` costs after the first group of a session (it starts a
  group, runs the puzzle, stops the group).
- *cold start*: the first group of a fresh Python process took {cold_s:.2f} s (the forkserver imports torch
  and the grader once; every later group forks from it).
- *agree*: `real.compare` found no difference between the two runs in values and gradients (to 1e-10 relative;
  the largest difference is float64 rounding from gloo's ring order of summation, below 1e-15), peak memory per
  rank, what was alive at the peak, the whole sequence of allocations and frees, every communication op (kind,
  bytes, wire bytes, phase, peers) and FLOPs.

Reading it: the rank program costs about the same on both where compute dominates (p2, p6: ratio near 1), and
up to several times more on gloo where communication dominates (p3, p4, p7, p8: six to eight collectives in a few
milliseconds of compute). Each collective on gloo is a round of socket messages between 4 processes that share the
cores, preceded by DETAIL's fingerprint check (an extra all-gather on a helper group: without DETAIL, p3's ranks
took 0.10 s instead of 0.16 s in the same group); the simulator's collective is a few tensor copies in one
process. A one-puzzle command on the real backend adds about 0.1 s to start and stop its processes (the
forkserver makes a group start in about 50 ms), after the one-off cold start above.
"""


DIFFERENCES = """
## Where the real backend's figures differ from the simulator's, and why

- **Clock checks are simulator only.** p5 and p6 `bubble`, p7 `makespan` read the simulated clock (idle ticks,
  the makespan); real processes on a shared CPU have no clock that means the same on every machine, so these
  checks are reported as "simulator only" (passed, not made). Everything else is measured for real: values and
  gradients, peak memory and `probe.memory_now()` (p1 checkpoint bytes, p2, p8 optimizer state), communication
  counts, phases and volumes (p3, p4, p7, p8), and FLOPs (p1 `compute`: FLOPs in ticks are a count, not a clock).
  On gloo the events sit on a FLOP clock (compute laid end to end, each communication at the tick it was issued,
  zero width) and the makespan is 0.
- **Values** differ by float64 rounding only (at most 4.2e-16 relative over every tensor of every reference and
  naive answer): gloo's ring all-reduce sums the ranks in a different order than the simulator's rank order.
- **Peak memory is identical, by construction.** gloo's work object holds the tensors of a collective, and its
  worker thread lets go of them a moment after `wait()` returns, racing the learner's thread. Graded on the
  learner's own tensors, a buffer dropped right after a collective left the ledger sometimes at once and
  sometimes a few ops later: before the fix, p4's peak was 901,136 or 917,520 bytes (+16,384, one [B, d]
  gradient) from run to run, and p8's up to +49,152 (enough to fail its optimizer-state budget by chance). So a
  blocking collective goes to gloo on private copies (off the ledger, like gloo's own buffers) and its result is
  copied back; the learner's tensors leave the ledger exactly when the learner drops them, as on the simulator.
  Async ops (isend/irecv, batch_isend_irecv, async_op=True) go to gloo with the learner's tensors, which the Work
  handle keeps alive until it is dropped (the simulator does the same); the ledgers agreed on every measured run.
- **Stricter or looser than the simulator.** The simulator is stricter on purpose: it names a deadlock at once
  (gloo hangs until its time limit, then the report names what each rank waited for), raises InFlightError for a
  buffer used before `wait()` (gloo silently computes with a half-reduced buffer: `p7_divide_before_wait` and
  `p7_hook_registered_twice` fail their values instead), and raises UnmatchedError for a message nobody received (gloo buffers it; the process
  group is discarded after each puzzle). gloo is stricter in one place: `all_gather_into_tensor` wants the
  output shaped like the inputs concatenated along dim 0, where the simulator (and NCCL) accept any output with N
  times the elements (`p2_column_shards` errors on gloo, fails its gradients on the simulator).
- **Tampering.** Both backends scan the answer's source for the grader's and the runtime's internals and
  fingerprint what its import changes, so `p1_reload_torch_checkpoint`, `p3_tolerance_patched` and
  `p7_free_communication` are "tampered" on both. `p6_ledger_peak_zeroed` overwrites the simulator's ledger
  through the runtime it is handed; on gloo that ledger is not the one the rank's tracker keeps, so the cheat
  changes nothing there and the answer fails the checks it meant to slip past (GPipe's order and memory).
- **DETAIL and point-to-point.** With TORCH_DISTRIBUTED_DEBUG=DETAIL, a collective's fingerprint carries a
  sequence number that point-to-point ops advance too; a collective after unequal numbers of sends and receives
  on the ranks is reported as a mismatch. So each puzzle runs in a fresh process group (in both launchers).
"""


if __name__ == "__main__":
    sys.exit(main())
