"""`grader batch` on a class of 50: the zygote design (this tree) against the design it replaced, in one run.

    python bench/bench_batch.py [--size 50] [--jobs 2] [--old f0a03d6] [--rounds 1]

Makes the class in a temporary folder: copies of solutions/, stubs (puzzles/), naive answers (tests/naive/),
solutions with one puzzle replaced by a wrong answer from tests/wrong/, and notebooks built with
build_notebook(solved=True/False). Checks out the old design (`git worktree add` of --old, by default main's
commit f0a03d6: one child per submission, each importing torch and grading all eight) in a temporary folder,
grades the class with both, alternating when --rounds > 1, and prints each wall time, the ratio and whether the
two agree on every puzzle's status. Each batch is run as its own `python -m grader batch` process, the way an
instructor runs it, with --seed fixed and time limits far above what any answer needs.
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import nbformat

from grader.frontends.notebooks.file import build_notebook
from grader.specs import SPECS


def make_class(folder: Path, size: int) -> dict[str, int]:
    """`size` submissions in the mix 20% solutions, 16% stubs, 16% naive, 32% wrong, 16% notebooks."""
    folder.mkdir(parents=True)
    wrong = sorted((ROOT / "tests" / "wrong").glob("p*_*.py"))
    kinds = {"solution": 0, "stub": 0, "naive": 0, "wrong": 0, "notebook": 0}
    plan = (["solution"] * 10 + ["stub"] * 8 + ["naive"] * 8 + ["wrong"] * 16 + ["notebook"] * 8)
    for i in range(size):
        kind = plan[i * len(plan) // size]
        name = f"s{i:03d}_{kind}"
        if kind == "notebook":
            nbformat.write(build_notebook(ROOT, solved=i % 2 == 0), str(folder / f"{name}.ipynb"))
        elif kind == "wrong":
            shutil.copytree(ROOT / "solutions", folder / name)
            answer = wrong[i % len(wrong)]
            spec = SPECS[answer.name.split("_")[0]]
            shutil.copyfile(answer, folder / name / spec.filename)
        else:
            source = {"solution": "solutions", "stub": "puzzles", "naive": "tests/naive"}[kind]
            shutil.copytree(ROOT / source, folder / name, ignore=shutil.ignore_patterns("__*", "*.ipynb"))
        kinds[kind] += 1
    return kinds


def run(tree: Path, subs: Path, out: Path, jobs: int, timeout: float) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the batch and every process it waited for)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grader", "batch", str(subs), "--out", str(out), "--seed", "3",
                           "--jobs", str(jobs), "--puzzle-timeout", str(timeout)], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"batch failed in {tree}:\n{proc.stderr[-3000:]}")
    return elapsed, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def statuses(path: Path) -> dict[str, tuple]:
    with open(path) as f:
        return {r["submission"]: tuple(r[i] for i in SPECS) for r in csv.DictReader(f)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=50)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--old", default="f0a03d6", help="the commit of the old design")
    p.add_argument("--rounds", type=int, default=1, help="old and new alternately, this many times each")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        tmp = Path(tmp)
        kinds = make_class(tmp / "class", args.size)
        old = tmp / "old"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), args.old], cwd=ROOT, check=True)
        try:
            load = os.getloadavg()[0]
            print(f"# bench_batch.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; "
                  f"load average {load:.1f} at the start")
            print(f"# class of {args.size}: {kinds}; --jobs {args.jobs}; old design: {args.old}")
            times, cpus = {"old": [], "new": []}, {"old": [], "new": []}
            for r in range(args.rounds):
                for design, tree, timeout in (("old", old, 1200), ("new", ROOT, 600)):
                    out = tmp / f"{design}-{r}.csv"
                    wall, cpu = run(tree, tmp / "class", out, args.jobs, timeout)
                    times[design].append(wall)
                    cpus[design].append(cpu)
                    print(f"{design} design, round {r + 1}: {wall:.1f} s wall ({wall / args.size:.2f} s a submission), "
                          f"{cpu:.1f} s of CPU ({cpu / args.size:.2f} s a submission)", flush=True)
            agree = statuses(tmp / "old-0.csv") == statuses(tmp / "new-0.csv")
            best_old, best_new = min(times["old"]), min(times["new"])
            cpu_old, cpu_new = min(cpus["old"]), min(cpus["new"])
            print(f"old {best_old:.1f} s, new {best_new:.1f} s: {best_old / best_new:.1f}x the throughput "
                  f"({cpu_old / cpu_new:.1f}x less CPU); same status for every puzzle of every submission: {agree}")
            if not agree:
                a, b = statuses(tmp / "old-0.csv"), statuses(tmp / "new-0.csv")
                for name in sorted(a):
                    if a[name] != b.get(name):
                        print(f"  {name}: old {a[name]} new {b.get(name)}")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
