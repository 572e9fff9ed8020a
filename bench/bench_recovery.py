"""p18 (recovery): the job's figures against the formulas its text states, on the simulator and on gloo.

    python bench/bench_recovery.py            (the simulator, seeds 0-2, and gloo at seed 0)
    python bench/bench_recovery.py --no-gloo

1. Bytes written per rank and save against its shard plus the manifest: 12·Ψ/N = 24,576 bytes of float32
   master, m and v per rank in torch.save's framing, the committing rank's replicated state G = 5,824 and the
   manifest on top; the budgets 12·Ψ/N + F = 28,672 and 12·Ψ/N + G + 2·F = 38,592.
2. The crash at every change a rank makes to the disk while it saves step 4: how many points (5 on rank 0, 2 on
   each other rank for the reference), which checkpoint each resume loaded, and whether every piece of the state
   was bit for bit the control's, right after loading and after the step that follows.
3. The failure at step 5 and the 4-to-2 reshard: the loaded state and the last step against the control on 4 ranks
   and on 2, bit for bit; the damaged checkpoint's fallback.
4. The disk's time on the clock: a save's ticks against calls·1,000 + bytes/8.
5. Grading time, whole job, on the simulator and on gloo; and each wrong answer's verdict.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.backends.simulator import SimLauncher  # noqa: E402
from grader.backends.learner_code import load_module  # noqa: E402
from grader.backends.simulator import grade_file  # noqa: E402
from grader.frontends.targets import REPO  # noqa: E402
from grader.specs import SPECS  # noqa: E402
from grader.specs.p18_recovery import spec as p18  # noqa: E402
from grader.specs.p18_recovery import job as jobs  # noqa: E402
from grader.specs.p18_recovery import training  # noqa: E402
from puzzles.simulator.filesystem import DISK  # noqa: E402

SPEC = SPECS["p18"]
REFERENCE = REPO / "solutions" / "p18_recovery.py"


def reference_job(seed: int):
    inputs = SPEC.make_inputs(seed)
    launcher = SimLauncher(SPEC, load_module(REFERENCE), inputs, seed)
    control = SPEC.reference(inputs)
    return jobs.job(launcher, control), launcher, control


def written(record, rank: int, step: int) -> list[int]:
    return [e["nbytes"] for e in record.train[rank]["disk"] if e["op"] == "write" and e["phase"] == f"save {step}"]


def exact(loaded, expected) -> bool:
    return not training.differences(loaded, expected)


def figures(seed: int) -> None:
    record, launcher, control = reference_job(seed)
    print(f"\n## seed {seed}")
    print("  bytes written per save (every save alike):")
    budgets = SPEC.budgets(SPEC.make_inputs(seed))
    for rank in range(training.N):
        files = written(record, rank, 4)
        formula = (f"12Ψ/N + G + framing = {p18.SHARD_BYTES:,} + {p18.REPLICATED_BYTES:,} + framing" if rank == 0
                   else f"12Ψ/N + framing = {p18.SHARD_BYTES:,} + framing")
        budget = budgets["bytes written" if rank == 0 else "bytes written by the others"].value
        print(f"    rank {rank}: files {', '.join(f'{n:,}' for n in files)} = {sum(files):,} bytes   ({formula}; "
              f"framing {sum(files) - p18.SHARD_BYTES - (p18.REPLICATED_BYTES if rank == 0 else 0):,}); budget "
              f"{budget:,}")
    per_rank = {}
    loads = {}
    all_exact = True
    for point in record.points:
        per_rank[point["event"]["rank"]] = per_rank.get(point["event"]["rank"], 0) + 1
        results = point["resume"].results or []
        step = results[0]["loaded"]["step"] if results else None
        loads[step] = loads.get(step, 0) + 1
        all_exact &= bool(results) and exact([r["loaded"] for r in results], control["at"][step]) and exact(
            [r["final"] for r in results], control["at"][step + 1])
    print(f"  crash points in the save of step 4: {len(record.points)} "
          f"({', '.join(f'rank {r}: {n}' for r, n in sorted(per_rank.items()))}; formula: rank 0 = makedirs + 2 "
          f"files x (write, rename) = 5, others 1 file x 2 = 2; 5 + 3·2 = 11); resumes loaded "
          f"{', '.join(f'step {s} x{n}' for s, n in sorted(loads.items()))}; all exact: {all_exact}")
    resume = [r["loaded"] for r in record.resume.results]
    reshard = [r["loaded"] for r in record.reshard.results]
    damaged = [r["loaded"] for r in record.damaged.results]
    end = exact([r["final"] for r in record.resume.results], control["final"])
    print(f"  failure at step 5, resume on 4: loaded step {resume[0]['step']}, exact "
          f"{exact(resume, control['at'][4])}; end exact {end}")
    four = torch.cat([p["master"] for p in control["final"]])
    two = torch.cat([p["master"] for p in control["two_final"]])
    end = exact([r["final"] for r in record.reshard.results], control["two_final"])
    print(f"  reshard 4 -> 2: loaded master {tuple(reshard[0]['master'].shape)} per rank (Ψ/2 = "
          f"{training.PSI // 2:,}), exact {exact(reshard, control['two_start'])}; end exact {end} (against the "
          f"grader's run on 2 ranks; the 4-rank run's end differs from it in {int((four != two).sum()):,} of "
          f"{four.numel():,} master weights, by at most {(four - two).abs().max().item():.2g}: 2 ranks sum the "
          f"gradient in another order)")
    print(f"  damaged {record.damaged_file}: loaded step {damaged[0]['step']}, exact "
          f"{exact(damaged, control['at'][2])}")
    # the train launch: load_checkpoint's one call on the empty disk (fs.exists), then two saves alike
    io = {r: (sum(e.ticks for e in launcher.first.events if e.rank == r and e.kind == "io") - DISK.latency_ticks) // 2
          for r in (0, 1)}
    calls = {0: 5, 1: 2}
    for r in (0, 1):
        formula = calls[r] * DISK.latency_ticks + sum(math.ceil(n / DISK.bytes_per_tick)
                                                      for n in written(record, r, 4))
        print(f"  disk time of one save, rank {r}: {io[r]:,} ticks (calls·1,000 + Σ ceil(bytes/8) = {formula:,})")
    backward = [e.ticks for e in launcher.first.events if e.rank == 1 and e.kind == "backward"]
    print(f"  a step's backward on rank 1: {statistics.median(backward):,.0f} ticks (median of {len(backward)})")


def timing(gloo: bool) -> None:
    print("\n## grading time, the whole job (wall seconds)")
    for name, path in (("reference", REFERENCE), ("naive", REPO / "tests" / "naive" / "p18_recovery.py")):
        start = time.perf_counter()
        result = grade_file(SPEC, path, 0)
        print(f"  simulator, {name}: {time.perf_counter() - start:.1f} s ({result.status})")
    if gloo:
        from grader.backends.real.grading import grade_job

        for name, path in (("reference", REFERENCE), ("naive", REPO / "tests" / "naive" / "p18_recovery.py")):
            outcomes = []
            start = time.perf_counter()
            result = grade_job(SPEC, path, None, 0, outcomes_out=outcomes)
            print(f"  gloo, {name}: {time.perf_counter() - start:.1f} s, {len(outcomes)} launches ({result.status}: "
                  f"{', '.join(c.name for c in result.failed_checks()) or 'every check passed'})")


def verdicts() -> None:
    print("\n## wrong answers (tests/wrong/p18_*.py), seed 7")
    for path in sorted((REPO / "tests" / "wrong").glob("p18_*.py")):
        answer = load_module(path)
        result = grade_file(SPEC, path, 7)
        failed = {c.name for c in result.failed_checks()}
        named = any(answer.DIAGNOSIS in c.diagnosis + c.message for c in result.failed_checks())
        print(f"  {path.stem:<36} {result.status:<5} {', '.join(sorted(failed)):<70} cause named: {named}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"# bench_recovery.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}")
    started = time.perf_counter()
    for seed in (0, 1, 2):
        figures(seed)
    timing("--no-gloo" not in sys.argv)
    verdicts()
    print(f"\ntotal bench time: {time.perf_counter() - started:.1f} s")
