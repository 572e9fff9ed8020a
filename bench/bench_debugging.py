"""Part IV (p20 the hang, p21 the slow step, p22 the NaN, p23 the straggler): each graded figure against its
formula, for the reference, the program as handed out and every wrong answer and alternative in tests/, at one seed.

    python bench/bench_debugging.py [--seed 3] > bench/DEBUGGING.md

For each answer, one row: its verdict, and per budgeted check the figure measured (the busiest rank's) against
the budget, with the checks that failed. The budgets are the puzzles' formulas (their texts state them):
p20 compute 1.5·k·12·L·d·h·r FLOPs, bytes k·2(N-1)/N·G + 1 KiB; p21 bytes S·2(N-1)/N·G + 1 KiB, overlap S·2A
ticks, makespan b·τ + S·(C + A) + T ticks; p22 bytes S·2(N-1)/N·G + 1 KiB (G the float32 gradients); p23 bytes
S·2(N-1)/N·G + 1 KiB, balance (the ticks a rank's device sits idle waiting in its collectives for the last to
arrive) 20% of S·C, makespan P + S·(C + A) + T ticks.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from grader.backends.simulator import grade_file  # noqa: E402
from grader.frontends.targets import REPO  # noqa: E402
from grader.specs import SPECS  # noqa: E402


NAIVE = {"p22": "naive: nan_to_num on the gradients"}  # the others' naive answer is the program as handed out


def answers(pid: str, name: str) -> list[tuple[str, Path]]:
    found = [("reference", REPO / "solutions" / f"{pid}_{name}.py"),
             (NAIVE.get(pid, "as handed out (naive)"), REPO / "tests" / "naive" / f"{pid}_{name}.py")]
    found += [(f"alternative: {p.stem[len(pid) + 1:]}", p) for p in sorted((REPO / "tests" / "alternatives").glob(
        f"{pid}_*.py"))]
    found += [(f"wrong: {p.stem[len(pid) + 1:]}", p) for p in sorted((REPO / "tests" / "wrong").glob(f"{pid}_*.py"))]
    return found


def table(pid: str, seed: int) -> None:
    spec = SPECS[pid]
    budgets = spec.budgets(spec.make_inputs(seed))
    names = list(budgets)
    print(f"## {pid} ({spec.title}), seed {seed}")
    print()
    print("budgets: " + "; ".join(f"{b.name} {b.describe()}" for b in budgets.values()))
    print()
    print("| answer | verdict | " + " | ".join(names) + " | failed checks |")
    print("| --- | --- | " + " | ".join("---:" for _ in names) + " | --- |")
    started = time.perf_counter()
    for label, path in answers(pid, spec.name):
        result = grade_file(spec, path, seed=seed)
        checks = {c.name: c for c in result.checks or []}
        cells = []
        for n in names:
            c = checks.get(n) or next((c for c in checks.values() if c.budget is not None and c.budget.name == n),
                                      None)
            cells.append("" if c is None or c.measured is None else f"{c.measured:,}" + ("" if c.passed else " ✗"))
        failed = ", ".join(c.name for c in checks.values() if not c.passed) or (result.error or "")[:60]
        print(f"| {label} | {result.status} | " + " | ".join(cells) + f" | {failed} |")
    print()
    print(f"({time.perf_counter() - started:.1f} s to grade them)")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    print(f"# bench_debugging.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print()
    for pid in ("p20", "p21", "p22", "p23"):
        table(pid, args.seed)


if __name__ == "__main__":
    main()
