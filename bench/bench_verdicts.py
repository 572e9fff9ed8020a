"""How far the grader's verdicts can be trusted, on the project's own suites of answers.

    python bench/bench_verdicts.py [--seed 7] [--wrong tests/wrong] [--alternatives tests/alternatives] [-v]

Every file under --wrong is a wrong answer that declares its real mistake (MISTAKE, in words) and a phrase that
names it (DIAGNOSIS); every file under --alternatives is a correct answer in a style other than the reference's.
Four figures, and the grader's own crashes:

  1. wrong answers rejected            status is not "pass" (and the grader did not crash)
  2. correct alternatives accepted     status is "pass"
  3. rejections naming the mistake     the DIAGNOSIS phrase is in a failing check's likely cause (the message
                                       alone does not count: it says what was measured, not why), or in the error
                                       of an answer that errs
  4. rejections naming another         a failing check gives a likely cause, and none of the causes given
                                       contains the phrase: a hint that points elsewhere
  5. grader crashes                    the grading itself raised (or reported a grader error)

Each answer is graded in a forked child process (a cheat may patch the grader). Files that declare NEEDS (a fix
on another branch) are graded and counted apart, so that the figures on this
branch's own grader stay comparable. To measure another version of the grader on the same suites, put its
checkout first on the path:  PYTHONPATH=/path/to/that/checkout python bench/bench_verdicts.py --wrong ... (the
answers import `puzzles` and `grader` from wherever the path finds them).
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))  # after whatever PYTHONPATH puts first

from grader.backends.learner_code import load_module  # noqa: E402
from grader.backends.simulator import grade_file  # noqa: E402
from grader.specs import SPECS  # noqa: E402


@dataclass
class Verdict:
    path: Path
    status: str  # the grader's status, or "crash"
    names_mistake: bool = False
    names_another: bool = False
    waits_for: str = ""
    detail: str = ""


def grade_apart(path: Path, seed: int) -> Verdict:
    """grade() in a forked child, so that an answer that patches the grader or the simulator (a cheat) cannot
    change the verdicts of the answers graded after it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            verdict = grade(path, seed)
        except BaseException as exc:  # loading the answer failed
            verdict = Verdict(path, "crash", detail=f"{type(exc).__name__}: {exc}")
        with os.fdopen(write, "wb") as out:
            pickle.dump(verdict, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as into:
        data = into.read()
    os.waitpid(pid, 0)
    return pickle.loads(data) if data else Verdict(path, "crash", detail="the grading process died")


def grade(path: Path, seed: int) -> Verdict:
    answer = load_module(path)
    waits = getattr(answer, "NEEDS", "")
    try:
        result = grade_file(SPECS[path.stem.split("_")[0]], path, seed)
    except Exception as exc:  # the grader's own failure
        return Verdict(path, "crash", waits_for=waits, detail=f"{type(exc).__name__}: {exc}\n"
                       + "".join(traceback.format_tb(exc.__traceback__)[-3:]))
    if result.status == "grader_error":
        return Verdict(path, "crash", waits_for=waits, detail=result.error)
    phrase = getattr(answer, "DIAGNOSIS", None)
    failed = [c for c in result.checks if not c.passed]
    causes = [c.diagnosis for c in failed if c.diagnosis]
    named = bool(phrase) and (any(phrase in c for c in causes) or (result.status != "fail" and phrase in result.error))
    detail = "; ".join(f"{c.name}: {c.diagnosis or '(no likely cause)'}" for c in failed) or result.error
    return Verdict(path, result.status, named, bool(causes) and not named, waits, detail)


def share(part: int, whole: int) -> str:
    return f"{part}/{whole} = {100 * part / whole:.0f}%" if whole else "0/0"


def figures(wrong: list[Verdict], alternatives: list[Verdict]) -> list[str]:
    rejected = [v for v in wrong if v.status not in ("pass", "crash")]
    return [
        f"  wrong answers rejected:           {share(len(rejected), len(wrong))}",
        f"  correct alternatives accepted:    {share(sum(v.status == 'pass' for v in alternatives), len(alternatives))}",
        f"  rejections naming the mistake:    {share(sum(v.names_mistake for v in rejected), len(rejected))}",
        f"  rejections naming another:        {share(sum(v.names_another for v in rejected), len(rejected))}",
        f"  grader crashes:                   {sum(v.status == 'crash' for v in wrong + alternatives)}",
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--wrong", type=Path, default=HERE / "tests" / "wrong")
    parser.add_argument("--alternatives", type=Path, default=HERE / "tests" / "alternatives")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per answer")
    args = parser.parse_args(argv)
    import grader
    import torch

    torch.set_num_threads(1)  # no thread pool alive when the children fork

    suites = {}
    for name, folder in (("wrong", args.wrong), ("alternatives", args.alternatives)):
        paths = sorted(folder.glob("p*_*.py")) if folder.exists() else []
        suites[name] = [grade_apart(p, args.seed) for p in paths]
    print(f"# bench_verdicts.py: grader from {Path(grader.__file__).parent.parent}, seed {args.seed}")
    for label, keep in (("answers that need nothing from other branches", lambda v: not v.waits_for),
                        ("answers that wait for another branch (NEEDS)", lambda v: bool(v.waits_for))):
        wrong = [v for v in suites["wrong"] if keep(v)]
        alternatives = [v for v in suites["alternatives"] if keep(v)]
        print(f"\n## {label}: {len(wrong)} wrong, {len(alternatives)} alternatives")
        print("\n".join(figures(wrong, alternatives)))
    if args.verbose:
        print("\n## per answer")
        for kind, verdicts in suites.items():
            for v in verdicts:
                mark = ("named" if v.names_mistake else "OTHER" if v.names_another else "-") if kind == "wrong" else ""
                wait = f" [needs {v.waits_for}]" if v.waits_for else ""
                print(f"  {kind:<12} {v.path.stem:<40} {v.status:<14} {mark:<6}{wait}  {v.detail[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
