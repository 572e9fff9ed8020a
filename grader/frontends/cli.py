"""The command line: `python -m grader [check TARGET] [-p p3 ...] [--seed N] [--timeout S] [--json]`,
`python -m grader build [--check] [--force]`, `python -m grader batch ...`, `python -m grader predict ...`
(predict.py: a training step at a published size)."""

from __future__ import annotations

import argparse
import sys

from ..core import report
from ..core.grading import fresh_seed
from ..core.result import NOT_ATTEMPTED, PASS
from .notebooks.cells import NotebookError
from ..specs import SPECS
from .targets import REPO, grade_target, in_checkout, normalize_puzzle_id


def cmd_check(args) -> int:
    seed = args.seed if args.seed is not None else fresh_seed()
    target = args.target
    if args.stray:  # `-p p3 solutions`: the folder was read as a puzzle id
        if target is not None or len(args.stray) > 1:
            print(not_puzzle_ids(args.stray), file=sys.stderr)
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
        if (root / "pyproject.toml").is_file() and not (root / "solutions").exists():  # a student copy (release)
            print("error: build is the instructor's: it regenerates puzzles/ and the notebooks from solutions/, "
                  "which this copy of the puzzles does not have. You do not need it: write your answers in "
                  "puzzles/ (or puzzles.ipynb) and grade them with `python -m grader` or `pytest`", file=sys.stderr)
        else:
            print(f"error: build regenerates a checkout's puzzles/ and notebooks from its solutions/, and {root} is "
                  f"an installed package, not a checkout: run it in a clone of the repository", file=sys.stderr)
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


def not_puzzle_ids(words: list[str]) -> str:
    return f"error: not a puzzle id: {', '.join(words)} (give p1..p{len(SPECS)}, 3, P3, 'p3,p4')"


def positional_from_stray(args, name: str) -> bool:
    """`-p p3 SUBMISSIONS`: -p took the folder as a puzzle id; it is the positional `name`. False (and the error
    printed) when a word is neither."""
    if args.stray and getattr(args, name) is None and len(args.stray) == 1:
        setattr(args, name, args.stray.pop())
    if args.stray:
        print(not_puzzle_ids(args.stray), file=sys.stderr)
        return False
    if getattr(args, name) is None:
        print(f"error: give the {name} folder", file=sys.stderr)
        return False
    return True


def refuse_plain_timeout(args) -> bool:
    """batch and gradescope had one --timeout each, one per puzzle and one (in name) per submission: two names now,
    so that neither is taken for the other. True (and the error printed) when the old one was given."""
    if args.timeout is None:
        return False
    print("error: --timeout is ambiguous here: give --puzzle-timeout SECONDS (each puzzle's limit) and/or "
          "--submission-timeout SECONDS (the whole submission's)", file=sys.stderr)
    return True


def limits_text(puzzle_timeout: float, submission_timeout: float | None, memory_mb: int) -> str:
    whole = f", {submission_timeout:g} s for a whole submission" if submission_timeout else ""
    return f"time limit {puzzle_timeout:g} s a puzzle{whole}; memory limit {memory_mb} MiB a puzzle"


def cmd_batch(args) -> int:
    from pathlib import Path

    from .batch import parent as batch

    if not positional_from_stray(args, "submissions") or refuse_plain_timeout(args):
        return 2
    seed = args.seed if args.seed is not None else fresh_seed()
    folder = Path(args.submissions)
    weights = batch_weights(args)
    if weights is None:
        return 2
    print(f"Grading the submissions in {folder} (seed {seed}; "
          f"{limits_text(args.puzzle_timeout, args.submission_timeout, args.memory_mb)})", file=sys.stderr)
    try:
        rows = batch.run_batch(folder, seed, args.puzzle_timeout, args.memory_mb, args.puzzle, args.jobs,
                               sandbox_mode=args.sandbox, submission_timeout=args.submission_timeout)
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
    """batch's reports (class_report.py): CSV and its class summary, JSON, per-student feedback, Gradescope's
    results.json; with --similarity, the similar pairs (similarity.py)."""
    from .reports import class_report

    rows = class_report.stray_rows(folder, rows)
    similar = None
    if args.similarity:
        from .reports.similarity import SimilarityUnavailable

        try:
            similar = class_report.compare_submissions(folder, rows, args.puzzle)
        except SimilarityUnavailable as exc:
            print(f"warning: --similarity: {exc}; the other reports are written", file=sys.stderr)
    written = class_report.write_reports(rows, seed, args.puzzle, weights, csv_path=args.out, json_path=args.json,
                                         feedback_dir=args.feedback, gradescope_dir=args.gradescope,
                                         plots=not args.no_plots, similarity=similar)
    companions = [str(p) for p in written if p.name.endswith((".summary.md", ".summary.png", ".similarity.md"))]
    for path in (args.out, *companions, args.json, args.feedback, args.gradescope):
        if path:
            print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_gradescope(args) -> int:
    from .reports.gradescope_bundle import write_bundle

    if not positional_from_stray(args, "out") or refuse_plain_timeout(args):
        return 2
    try:
        out, archive = write_bundle(REPO, args.out, args.weights, args.puzzle_timeout, args.memory_mb, args.puzzle,
                                    args.visibility, args.stdout_visibility, args.torch,
                                    submission_timeout=args.submission_timeout)
    except (OSError, KeyError, ValueError) as exc:
        print(f"error: {message(exc)}", file=sys.stderr)
        return 2
    print(f"wrote {out}/ and {archive}: upload {archive.name} to Gradescope as the autograder", file=sys.stderr)
    return 0


def cmd_release(args) -> int:
    from pathlib import Path

    from . import release

    try:
        written = release.write_release(REPO, Path(args.out))
    except (OSError, ValueError) as exc:
        print(f"error: {message(exc)}", file=sys.stderr)
        return 2
    _, left_out = release.learner_readme((REPO / "README.md").read_text())
    if left_out:
        print(f"note: README sections left out of the learner's README (neither a learner nor an instructor "
              f"section in release.py): {', '.join(left_out)}", file=sys.stderr)
    print(f"wrote {len(written)} files to {args.out}", file=sys.stderr)
    return 0


def message(exc: Exception) -> str:
    """What went wrong, in words: an OSError's str() names the file and the reason ("[Errno 2] No such file or
    directory: 'x'"), where its args[0] is the bare errno (the "error: 2" this used to print)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return str(exc)
    return str(exc.args[0]) if exc.args else str(exc)


def cmd_zygote(args) -> int:
    from .batch import zygote

    zygote.serve(args.fd, args.sandbox, args.slot)
    return 0


def cmd_mutate(args) -> int:
    from .mutate import command

    if getattr(args, "stray", None):
        print(not_puzzle_ids(args.stray), file=sys.stderr)
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
    check = command(sub, "check", "grade a folder of puzzle files (default: puzzles), one puzzle file or a notebook")
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
    b = command(sub, "build", "for instructors, in the project's repository: regenerate the stubs in puzzles/, "
                              "puzzles.ipynb and puzzles-standalone.ipynb from solutions/ (stubs and cells a learner "
                              "edited are left alone). A learner never needs it")
    b.add_argument("--check", action="store_true", help="exit 1 and name the stale files instead of writing")
    b.add_argument("--force", action="store_true", help="overwrite the stubs and notebook cells a learner edited too "
                                                        "(for instructors; without it they are left alone)")
    b.set_defaults(func=cmd_build)
    bt = command(sub, "batch", "for instructors: grade a class, a folder of submissions (a notebook, a folder "
                               "holding the puzzle files or a repository, or an LMS export of files named "
                               "NAME_..._pN_*.py per learner), each puzzle in a sandbox of its own with time and "
                               "memory limits; writes a CSV, its class summary, and the reports asked for")
    bt.add_argument("submissions", nargs="?", default=None,
                    help="a folder holding one notebook, folder or repository per learner, or an LMS export")
    bt.add_argument("--out", default="results.csv", help="the CSV to write (default results.csv); its class "
                                                          "summary is written beside it (RESULTS.summary.md, .png)")
    bt.add_argument("--json", help="also write the full results as JSON here")
    add_limit_options(bt, puzzle=60.0, submission=None)
    bt.add_argument("--seed", type=int, help="the same inputs for every submission (default: a fresh seed, printed)")
    bt.add_argument("--puzzle", "-p", action=PuzzleIds, nargs="+", metavar="ID", dest="puzzle", default=None,
                    help="grade only these puzzles: -p p3, -p 3, -p p3 p4, -p p3,p4 (repeatable)")
    bt.add_argument("--jobs", "-j", type=int, default=2, help="submissions graded at once (default 2)")
    bt.add_argument("--sandbox", choices=("auto", "namespaces", "userns", "process"), default="auto",
                    help="the isolation (default auto: the strongest this machine allows; docs/grading.md, "
                         "'Grading for credit')")
    add_report_options(bt)
    bt.set_defaults(func=cmd_batch, stray=[])
    add_gradescope_parser(sub)
    add_release_parser(sub)
    from .predict import add_predict_parser

    add_predict_parser(sub, command)
    if has_mutate():  # the instructor's tool: not in a student copy or the Gradescope bundle (shipping.py)
        add_mutate_parser(sub)
    zy = sub.add_parser("_zygote")  # batch's worker: forks a jail per puzzle (no help=: not listed)
    zy.add_argument("--fd", type=int, required=True)
    zy.add_argument("--sandbox", default="auto")
    zy.add_argument("--slot", type=int, default=0)
    zy.set_defaults(func=cmd_zygote)
    sub.metavar = "{" + ",".join(name for name in sub.choices if not name.startswith("_")) + "}"
    return p


def has_mutate() -> bool:
    import importlib.util

    return importlib.util.find_spec("grader.frontends.mutate") is not None


def add_mutate_parser(sub) -> None:
    mu = command(sub, "mutate", "for instructors, in the project's repository: mutation testing of the grader, "
                                "grading mutants of the reference solutions (learners' mistakes put into them); "
                                "exit 1 if one that is not equivalent survives")
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


def command(sub, name: str, what: str):
    """A subcommand whose --help opens with what it does (help= alone shows only in the list of commands)."""
    return sub.add_parser(name, help=what, description=what[:1].upper() + what[1:] + ".")


def add_limit_options(parser, puzzle: float, submission: float | None) -> None:
    """The time limits of batch and gradescope, one name each for the puzzle's and the submission's."""
    parser.add_argument("--puzzle-timeout", type=float, default=puzzle, metavar="SECONDS",
                        help=f"seconds each puzzle may take, in its own process (default {puzzle:g}); a puzzle over "
                             f"it costs that puzzle only")
    whole = f"default {submission:g}" if submission else "default none: at most the number of puzzles times " \
                                                         "--puzzle-timeout"
    parser.add_argument("--submission-timeout", type=float, default=submission, metavar="SECONDS",
                        help=f"seconds a whole submission may take ({whole}); the puzzles left when it runs out "
                             f"are errors that say so")
    parser.add_argument("--memory-mb", type=int, default=4096,
                        help="MiB of address space each puzzle's process may map beyond the grader's own "
                             "(default 4096)")
    parser.add_argument("--timeout", type=float, help=argparse.SUPPRESS)  # the old name: refused, see cmd_batch


def add_report_options(bt) -> None:
    bt.add_argument("--weights", metavar="FILE", help="points per puzzle and per check (TOML or JSON; "
                                                      "docs/grading.md); default: 100 points shared equally, "
                                                      "a puzzle's points earned when all its checks pass")
    bt.add_argument("--feedback", metavar="DIR", help="write DIR/<submission>/feedback.md, with the plots, for each")
    bt.add_argument("--no-plots", action="store_true", help="with --feedback: no memory and schedule plots (faster)")
    bt.add_argument("--gradescope", metavar="DIR", help="write DIR/<submission>.json in Gradescope's results format")
    bt.add_argument("--similarity", action="store_true",
                    help="also compare the submissions, puzzle by puzzle, and list the pairs whose code is alike "
                         "in RESULTS.similarity.md and the CSV's `similar` column, for a person to read (no "
                         "points depend on it; needs copydetect: pip install copydetect)")


def add_gradescope_parser(sub) -> None:
    from .reports.scoring import VISIBILITY

    g = command(sub, "gradescope", "for instructors: write a Gradescope autograder bundle, OUT/ and OUT.zip "
                                   "(setup.sh, run_autograder, the package without solutions or instructor tools)")
    g.add_argument("out", nargs="?", default=None,
                   help="the folder to write (new; its parents are made); the zip to upload is written beside it "
                        "as OUT.zip")
    g.add_argument("--weights", metavar="FILE", help="points per puzzle and per check, each test's visibility, the "
                                                     "leaderboard (TOML or JSON; docs/grading.md)")
    # Gradescope stops a run at the assignment's own timeout (10 minutes unless changed) and then shows no test
    # at all: the submission's limit keeps under it, so that results.json is always written.
    add_limit_options(g, puzzle=60.0, submission=540.0)
    g.add_argument("--puzzle", "-p", action=PuzzleIds, nargs="+", metavar="ID", dest="puzzle", default=None,
                   help="grade only these puzzles: -p p3, -p 3, -p p3 p4, -p p3,p4 (repeatable)")
    g.add_argument("--visibility", choices=VISIBILITY, default="visible",
                   help="when learners see their results (default visible: at once)")
    g.add_argument("--stdout-visibility", choices=VISIBILITY, default="hidden",
                   help="when learners see the autograder's log (default hidden)")
    g.add_argument("--torch", metavar="VERSION", help="the torch setup.sh installs (default: this one's version)")
    g.set_defaults(func=cmd_gradescope, stray=[])


def add_release_parser(sub) -> None:
    r = command(sub, "release", "for instructors, in the project's repository: write the copy a class receives "
                                "(the stubs, the notebooks, the self-grading tests, the package and a README for "
                                "learners; no solutions and no instructor tools)")
    r.add_argument("out", help="the folder to write (new, or empty)")
    r.set_defaults(func=cmd_release)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["check", *argv]
    args = parser().parse_args(argv)
    return args.func(args)


def run():
    """`python -m grader`: main(), quiet when its reader goes away (`python -m grader ... | head`), as `ls | head`
    is: no BrokenPipeError traceback, and no second one when Python flushes stdout at exit."""
    try:
        try:
            status = main()
        except SystemExit as exc:  # argparse's --help and usage errors: their text is still to be flushed
            status = exc.code
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command ended by a closed pipe
