"""The command line: `python -m grader [check TARGET] [--puzzle p3 ...] [--seed N] [--json]`, `python -m grader build`."""

from __future__ import annotations

import argparse
import secrets
import sys

from . import build as build_mod
from . import report, runner
from .result import ERROR, FAIL


def fresh_seed() -> int:
    return secrets.randbelow(1_000_000)


def cmd_check(args) -> int:
    seed = args.seed if args.seed is not None else fresh_seed()
    try:
        results = runner.grade_target(args.target, args.puzzle, seed)
    except (FileNotFoundError, KeyError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json(results, str(args.target), seed, figures=args.figures))
    else:
        print(report.console(results, str(args.target), seed, verbose=args.verbose))
    return 1 if any(r.status in (FAIL, ERROR) for r in results) else 0


def cmd_build(args) -> int:
    root = runner.REPO
    if args.check:
        problems = build_mod.stale(root)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    for path in build_mod.build(root):
        print(f"wrote {path.relative_to(root)}")
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
    check.set_defaults(func=cmd_check)
    b = sub.add_parser("build", help="regenerate the stubs in puzzles/ from solutions/")
    b.add_argument("--check", action="store_true", help="exit 1 and name the stale files instead of writing")
    b.set_defaults(func=cmd_build)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["check", *argv]
    args = parser().parse_args(argv)
    return args.func(args)
