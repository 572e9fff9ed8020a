"""The command line: `python -m grader [check TARGET] [-p p3 ...] [--seed N] [--timeout S] [--json]`,
`python -m grader build [--check] [--force]`, `python -m grader batch ...`."""

from __future__ import annotations

import argparse
import sys

from ..core import report
from ..core.grading import fresh_seed
from ..core.result import NOT_ATTEMPTED, PASS
from .notebooks.cells import NotebookError
from .targets import REPO, grade_target, in_checkout, normalize_puzzle_id


def cmd_check(args) -> int:
    seed = args.seed if args.seed is not None else fresh_seed()
    target = args.target
    if args.stray:  # `-p p3 solutions`: the folder was read as a puzzle id
        if target is not None or len(args.stray) > 1:
            print(f"error: not a puzzle id: {', '.join(args.stray)} (give p1..p8, 3, P3, 'p3,p4')", file=sys.stderr)
            return 2
        target = args.stray[0]
    target = "puzzles" if target is None else target
    options, on = {}, ""
    if args.backend == "torch":
        options = {"world_size": args.world_size, "timeout": args.timeout, "dist_backend": args.dist_backend}
        on = f"torch.distributed ({args.dist_backend}, one process per rank)"
    elif args.world_size is not None:
        print("error: --world-size goes with --backend torch", file=sys.stderr)
        return 2
    elif args.timeout is not None:
        options = {"timeout": args.timeout}
    notes: list[str] = []
    try:
        results = grade_target(target, args.puzzle, seed, args.backend, notes=notes, **options)
    except (FileNotFoundError, KeyError, NotebookError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(report.to_json(results, str(target), seed, figures=args.figures))
    else:
        print(report.console(results, str(target), seed, verbose=args.verbose, backend=on))
    if args.plots:
        from . import plots

        written = [p for r in results if r.figures for p in plots.write_plots(r, args.plots)]
        print(f"wrote {len(written)} plots to {args.plots}", file=sys.stderr)
    if args.trace or args.schedule:
        from . import timeline

        if args.schedule:
            for r in results:
                if r.figures:
                    print("\n" + timeline.schedule_text(r))
        if args.trace:
            for path in timeline.write_traces(results, args.trace):
                print(f"wrote {path}: open it at https://ui.perfetto.dev (or chrome://tracing)", file=sys.stderr)
    return 1 if any(r.status not in (PASS, NOT_ATTEMPTED) for r in results) else 0


def cmd_build(args) -> int:
    from . import build as build_mod  # here, not at the top: it imports nbformat, a second of every start

    root = REPO
    if not in_checkout():
        print(f"error: build regenerates a checkout's puzzles/ and notebooks from its solutions/, and {root} is an "
              f"installed package, not a checkout: run it in a clone of the repository", file=sys.stderr)
        return 2
    if args.check:
        problems = build_mod.stale(root)
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    done = build_mod.build(root, force=args.force)
    for path in done.write:
        print(f"wrote {path.relative_to(root)}")
    for line in done.kept:
        print(f"{line} (`python -m grader build --force` overwrites it)")
    return 0


def cmd_batch(args) -> int:
    from pathlib import Path

    from .batch import parent as batch

    seed = args.seed if args.seed is not None else fresh_seed()
    folder = Path(args.submissions)
    weights = batch_weights(args)
    if weights is None:
        return 2
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
    return write_batch_reports(args, folder, rows, seed, weights)


def batch_weights(args):
    """The --weights file, read before grading so that a mistake in it costs no grading time (None: refused)."""
    from .reports.scoring import WeightsError, load_weights

    try:
        return load_weights(args.weights)
    except (OSError, WeightsError) as exc:
        print(f"error: --weights: {exc}", file=sys.stderr)
        return None


def write_batch_reports(args, folder, rows, seed, weights) -> int:
    """batch's reports (class_report.py): CSV, JSON, per-student feedback, Gradescope's results.json."""
    from .reports import class_report

    rows = class_report.stray_rows(folder, rows)
    class_report.write_reports(rows, seed, args.puzzle, weights, csv_path=args.out, json_path=args.json,
                               feedback_dir=args.feedback, gradescope_dir=args.gradescope, plots=not args.no_plots)
    for path in (args.out, args.json, args.feedback, args.gradescope):
        if path:
            print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_gradescope(args) -> int:
    from .reports.gradescope_bundle import write_bundle

    try:
        out, archive = write_bundle(REPO, args.out, args.weights, args.timeout, args.memory_mb, args.puzzle,
                                    args.visibility, args.stdout_visibility, args.torch)
    except (FileExistsError, FileNotFoundError, KeyError, ValueError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}/ and {archive}: upload {archive.name} to Gradescope as the autograder", file=sys.stderr)
    return 0


def cmd_release(args) -> int:
    from pathlib import Path

    from . import release

    try:
        written = release.write_release(REPO, Path(args.out))
    except (FileExistsError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    _, left_out = release.learner_readme((REPO / "README.md").read_text())
    if left_out:
        print(f"note: README sections left out of the learner's README (neither a learner nor an instructor "
              f"section in release.py): {', '.join(left_out)}", file=sys.stderr)
    print(f"wrote {len(written)} files to {args.out}", file=sys.stderr)
    return 0


def cmd_zygote(args) -> int:
    from .batch import zygote

    zygote.serve(args.fd, args.sandbox, args.slot)
    return 0


def cmd_mutate(args) -> int:
    from .mutate import command

    if getattr(args, "stray", None):
        print(f"error: not a puzzle id: {', '.join(args.stray)} (give p1..p8, 3, P3, 'p3,p4')", file=sys.stderr)
        return 2
    return command.run(args)


class PuzzleIds(argparse.Action):
    """-p p3, -p 3, -p P3, -p p3 p4, -p p3,p4, repeatable; each puzzle once, in the order given. A word that is no
    puzzle id is kept in `stray` (it may be the target, as in `-p p3 solutions`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        ids = list(getattr(namespace, self.dest) or [])
        stray = list(getattr(namespace, "stray", None) or [])
        for value in values:
            for word in filter(None, value.split(",")):
                pid = normalize_puzzle_id(word)
                if pid is None:
                    stray.append(word)
                elif pid not in ids:
                    ids.append(pid)
        setattr(namespace, self.dest, ids)
        namespace.stray = stray


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m grader", description="Grade the distributed-training puzzles.")
    sub = p.add_subparsers(dest="command")
    check = sub.add_parser("check", help="grade a folder of puzzle files (default: puzzles)")
    check.add_argument("target", nargs="?", default=None,
                       help="a folder laid out like puzzles/ (default: ./puzzles, or the checkout's), a notebook, "
                            "or 'solutions' in a checkout")
    check.add_argument("--puzzle", "-p", action=PuzzleIds, nargs="+", metavar="ID", dest="puzzle", default=None,
                       help="grade only these puzzles: -p p3, -p 3, -p p3 p4, -p p3,p4 (repeatable)")
    check.add_argument("--seed", type=int, help="reproduce a run: the inputs are random for every seed")
    check.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    check.add_argument("--figures", action="store_true", help="with --json: include the data behind the plots")
    check.add_argument("--verbose", "-v", action="store_true", help="show passing checks too")
    check.add_argument("--plots", metavar="DIR", help="write each puzzle's memory and schedule plots here (PNG)")
    check.add_argument("--trace", metavar="FILE.json", help="write the run's timeline as Chrome trace-event JSON, for "
                       "Perfetto (ui.perfetto.dev) or chrome://tracing (several puzzles: FILE-p3.json, ...)")
    check.add_argument("--schedule", action="store_true", help="print each rank's timeline as a text grid")
    check.add_argument("--backend", choices=("sim", "torch"), default="sim",
                       help="sim: the simulator (default); torch: real processes on torch.distributed, one per rank")
    check.add_argument("--world-size", type=int, help="with --backend torch: grade only the puzzles written for "
                                                       "this many ranks (each puzzle's sizes fix its world size)")
    check.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="on the simulator: how long a rank may compute without communicating before it is "
                            "stopped (an endless loop; default 60); with --backend torch: how long each puzzle may "
                            "take before its process group counts as hung (default 60)")
    check.add_argument("--dist-backend", choices=("gloo", "nccl"), default="gloo",
                       help="with --backend torch: gloo (CPU, default) or nccl (one GPU per rank)")
    check.set_defaults(func=cmd_check, stray=[])
    b = sub.add_parser("build", help="regenerate the stubs in puzzles/ and the notebooks from solutions/ (stubs and "
                                     "cells a learner edited are left alone)")
    b.add_argument("--check", action="store_true", help="exit 1 and name the stale files instead of writing")
    b.add_argument("--force", action="store_true", help="overwrite the stubs and notebook cells a learner edited too "
                                                        "(for instructors; without it they are left alone)")
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
    add_report_options(bt)
    bt.set_defaults(func=cmd_batch)
    add_gradescope_parser(sub)
    add_release_parser(sub)
    mu = sub.add_parser("mutate", help="mutation testing of the grader: grade mutants of the reference solutions "
                                       "(learners' mistakes put into them); exit 1 if one that is not equivalent "
                                       "survives")
    mu.add_argument("target", nargs="?", default="solutions",
                    help="a folder of reference solutions laid out like solutions/ (default: solutions)")
    mu.add_argument("--puzzle", "-p", action=PuzzleIds, nargs="+", metavar="ID", dest="puzzle", default=None,
                    help="only these puzzles: -p p3, -p 3, -p p3 p4 (repeatable)")
    mu.add_argument("--seed", type=int, default=1, help="the grading seed (default 1, so runs compare)")
    mu.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    mu.add_argument("--quiet", "-q", action="store_true", help="leave out the table of every mutant")
    mu.add_argument("--jobs", "-j", type=int, help="mutants graded at once (default: the cores, at most 8)")
    mu.add_argument("--operator", "-o", action="append", help="only this operator; repeatable")
    mu.add_argument("--list-operators", action="store_true", help="list the operators and the mistakes they make")
    mu.add_argument("--equivalents", metavar="FILE",
                    help="a JSON list of reviewed equivalent mutants, added to the built-in list")
    mu.add_argument("--memory-mb", type=int, default=4096, help="memory a mutant may add, in MiB (default 4096)")
    mu.set_defaults(func=cmd_mutate)
    zy = sub.add_parser("_zygote")  # batch's worker: forks a jail per puzzle (no help=: not listed)
    zy.add_argument("--fd", type=int, required=True)
    zy.add_argument("--sandbox", default="auto")
    zy.add_argument("--slot", type=int, default=0)
    zy.set_defaults(func=cmd_zygote)
    sub.metavar = "{" + ",".join(name for name in sub.choices if not name.startswith("_")) + "}"
    return p


def add_report_options(bt) -> None:
    bt.add_argument("--weights", metavar="FILE", help="points per puzzle and per check (TOML or JSON; README, "
                                                      "\"For instructors\"); default: 100 points shared equally, "
                                                      "a puzzle's points earned when all its checks pass")
    bt.add_argument("--feedback", metavar="DIR", help="write DIR/<submission>/feedback.md, with the plots, for each")
    bt.add_argument("--no-plots", action="store_true", help="with --feedback: no memory and schedule plots (faster)")
    bt.add_argument("--gradescope", metavar="DIR", help="write DIR/<submission>.json in Gradescope's results format")


def add_gradescope_parser(sub) -> None:
    from .reports.gradescope import VISIBILITY

    g = sub.add_parser("gradescope", help="write a Gradescope autograder bundle: OUT/ and OUT.zip (setup.sh, "
                                          "run_autograder, the package without solutions)")
    g.add_argument("out", help="the folder to write (new); the zip to upload is written beside it as OUT.zip")
    g.add_argument("--weights", metavar="FILE", help="points per puzzle and per check (TOML or JSON)")
    g.add_argument("--timeout", type=float, default=120.0, help="seconds a submission may take (default 120)")
    g.add_argument("--memory-mb", type=int, default=4096, help="address-space limit per submission (default 4096)")
    g.add_argument("--puzzle", "-p", action="append", help="grade only this puzzle; repeatable")
    g.add_argument("--visibility", choices=VISIBILITY, default="visible",
                   help="when learners see their results (default visible: at once)")
    g.add_argument("--stdout-visibility", choices=VISIBILITY, default="hidden",
                   help="when learners see the autograder's log (default hidden)")
    g.add_argument("--torch", metavar="VERSION", help="the torch setup.sh installs (default: this one's version)")
    g.set_defaults(func=cmd_gradescope)


def add_release_parser(sub) -> None:
    r = sub.add_parser("release", help="write the student copy: stubs, notebook, self-grading tests, the "
                                       "package and a README for learners; no solutions")
    r.add_argument("out", help="the folder to write (new, or empty)")
    r.set_defaults(func=cmd_release)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["check", *argv]
    args = parser().parse_args(argv)
    return args.func(args)
