"""The command line: `python -m grader [check TARGET] [--puzzle p3 ...] [--seed N] [--json]`, `python -m grader build`."""

from __future__ import annotations

import argparse
import sys

from ..core import report
from ..core.grading import fresh_seed
from ..core.result import ERROR, FAIL
from . import build as build_mod
from .targets import REPO, grade_target


def cmd_check(args) -> int:
    seed = args.seed if args.seed is not None else fresh_seed()
    options, on = {}, ""
    if args.backend == "torch":
        options = {"world_size": args.world_size, "timeout": args.timeout, "dist_backend": args.dist_backend}
        on = f"torch.distributed ({args.dist_backend}, one process per rank)"
    elif args.world_size is not None or args.timeout is not None:
        print("error: --world-size and --timeout go with --backend torch", file=sys.stderr)
        return 2
    try:
        results = grade_target(args.target, args.puzzle, seed, args.backend, **options)
    except (FileNotFoundError, KeyError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json(results, str(args.target), seed, figures=args.figures))
    else:
        print(report.console(results, str(args.target), seed, verbose=args.verbose, backend=on))
    if args.plots:
        from . import plots

        written = [p for r in results if r.figures for p in plots.write_plots(r, args.plots)]
        print(f"wrote {len(written)} plots to {args.plots}", file=sys.stderr)
    return 1 if any(r.status in (FAIL, ERROR) for r in results) else 0


def cmd_build(args) -> int:
    root = REPO
    if args.check:
        problems = build_mod.stale(root)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    for path in build_mod.build(root):
        print(f"wrote {path.relative_to(root)}")
    return 0


def cmd_batch(args) -> int:
    from pathlib import Path

    from . import batch

    seed = args.seed if args.seed is not None else fresh_seed()
    folder = Path(args.submissions)
    print(f"Grading the submissions in {folder} (seed {seed}; each puzzle: time limit {args.timeout:g} s, memory "
          f"limit {args.memory_mb} MiB)", file=sys.stderr)
    try:
        rows = batch.run_batch(folder, seed, args.timeout, args.memory_mb, args.puzzle, args.jobs,
                               sandbox_mode=args.sandbox)
    except (FileNotFoundError, KeyError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # every worker and every puzzle's process is stopped by then
        print("interrupted: no results written", file=sys.stderr)
        return 130
    batch.write_csv(rows, Path(args.out), args.puzzle)
    print(f"wrote {args.out}", file=sys.stderr)
    if args.json:
        batch.write_json(rows, Path(args.json), seed)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def cmd_zygote(args) -> int:
    from . import zygote

    zygote.serve(args.fd, args.sandbox, args.slot)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader", description="Grade the distributed-training puzzles.")
    sub = p.add_subparsers(dest="command")
    check = sub.add_parser("check", help="grade a folder of puzzle files (default: puzzles)")
    check.add_argument("target", nargs="?", default="puzzles",
                       help="'puzzles', 'solutions', or a folder laid out like puzzles/")
    check.add_argument("--puzzle", "-p", action="append", help="grade only this puzzle (p1..p8); repeatable")
    check.add_argument("--seed", type=int, help="reproduce a run: the inputs are random for every seed")
    check.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    check.add_argument("--figures", action="store_true", help="with --json: include the data behind the plots")
    check.add_argument("--verbose", "-v", action="store_true", help="show passing checks too")
    check.add_argument("--plots", metavar="DIR", help="write each puzzle's memory and schedule plots here (PNG)")
    check.add_argument("--backend", choices=("sim", "torch"), default="sim",
                       help="sim: the simulator (default); torch: real processes on torch.distributed, one per rank")
    check.add_argument("--world-size", type=int, help="with --backend torch: grade only the puzzles written for "
                                                       "this many ranks (each puzzle's sizes fix its world size)")
    check.add_argument("--timeout", type=float, help="with --backend torch: seconds each puzzle may take before "
                                                     "its process group counts as hung (default: the puzzle's, 60)")
    check.add_argument("--dist-backend", choices=("gloo", "nccl"), default="gloo",
                       help="with --backend torch: gloo (CPU, default) or nccl (one GPU per rank)")
    check.set_defaults(func=cmd_check)
    b = sub.add_parser("build", help="regenerate the stubs in puzzles/ from solutions/")
    b.add_argument("--check", action="store_true", help="exit 1 and name the stale files instead of writing")
    b.set_defaults(func=cmd_build)
    bt = sub.add_parser("batch", help="grade a folder of submissions (notebooks or puzzle folders), each puzzle in a "
                                      "sandbox of its own with time and memory limits; writes CSV (and JSON)")
    bt.add_argument("submissions", help="a folder holding one notebook or one puzzles-like folder per learner")
    bt.add_argument("--out", default="results.csv", help="the CSV to write (default results.csv)")
    bt.add_argument("--json", help="also write the full results as JSON here")
    bt.add_argument("--timeout", type=float, default=60.0,
                    help="seconds each puzzle may take, in its own process (default 60); a submission takes at "
                         "most this times the number of puzzles, and a puzzle over it costs that puzzle only")
    bt.add_argument("--memory-mb", type=int, default=4096,
                    help="MiB of address space each puzzle's process may map beyond the grader's own (default 4096)")
    bt.add_argument("--seed", type=int, help="the same inputs for every submission (default: a fresh seed, printed)")
    bt.add_argument("--puzzle", "-p", action="append", help="grade only this puzzle; repeatable")
    bt.add_argument("--jobs", "-j", type=int, default=2, help="submissions graded at once (default 2)")
    bt.add_argument("--sandbox", choices=("auto", "namespaces", "userns", "process"), default="auto",
                    help="the isolation (default auto: the strongest this machine allows; README, 'Grading for "
                         "credit')")
    bt.set_defaults(func=cmd_batch)
    zy = sub.add_parser("_zygote", help=argparse.SUPPRESS)  # batch's worker: forks a jail per puzzle
    zy.add_argument("--fd", type=int, required=True)
    zy.add_argument("--sandbox", default="auto")
    zy.add_argument("--slot", type=int, default=0)
    zy.set_defaults(func=cmd_zygote)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["check", *argv]
    args = parser().parse_args(argv)
    return args.func(args)
