"""A class made of the project's own answers, to see the class summary and the similarity report on it:

    python bench/class_of_answers.py OUT            writes OUT/submissions/, then grades it:
    python -m grader batch OUT/submissions --out OUT/results.csv --similarity --seed 1

Learner i hands in, for each puzzle, its i-th answer among tests/alternatives/ (correct, in other styles),
tests/wrong/ (each a deliberate mistake) and tests/naive/, in that order, and the stub when a puzzle has fewer
answers than that (not attempted). `reference` hands in solutions/. Two near-copies are added: `twin` is
learner-03's files with its names changed, comments and blank lines added and removed (what a copier does to
hide a copy), and `partial-twin` is learner-07's p3 and p5 copied the same way beside answers of its own (the
pools' 17th, where a puzzle has one). The similarity report should list those two pairs first. bench/CLASS.md
records a run.
"""

from __future__ import annotations

import io
import re
import shutil
import tokenize
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.frontends.build import planned_files  # noqa: E402
from grader.specs import SPECS  # noqa: E402

RENAMES = {"loss": "objective", "grad": "gradient", "out": "result", "layers": "blocks", "rank": "me",
           "world": "n_ranks", "shard": "piece", "x_shard": "inputs_here", "chunk": "part"}


def disguise(text: str) -> str:
    """What a copier does: rename the variables, drop the comments, add blank lines; the code does the same."""
    tokens, out, depth = list(tokenize.generate_tokens(io.StringIO(text).readline)), [], 0
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        before = tokens[i - 1].string if i else ""
        after = tokens[i + 1].string if i + 1 < len(tokens) else ""
        keyword = depth > 0 and after == "=" and before in ("(", ",")  # f(x, layers=...): the callee's name
        if tok.type == tokenize.NAME and tok.string in RENAMES and before != "." and not keyword:
            tok = tok._replace(string=RENAMES[tok.string])
        elif tok.type == tokenize.COMMENT and "stub digest" not in tok.string:
            tok = tok._replace(string="")
        out.append(tok)
    lines = tokenize.untokenize(out).splitlines()
    spaced = []
    for line in lines:
        spaced.append(line.rstrip())
        if line.lstrip().startswith(("for ", "if ")):
            spaced.append("")
    return "\n".join(spaced) + "\n"


def build_class(out: Path) -> Path:
    subs = out / "submissions"
    if subs.exists():
        shutil.rmtree(subs)
    subs.mkdir(parents=True)
    stubs = {path.name: text for path, text in planned_files(ROOT).items()}
    pools = {}
    for spec in SPECS.values():
        pool = []
        for folder in ("alternatives", "wrong", "naive"):
            pool += sorted((ROOT / "tests" / folder).glob(f"{spec.id}_*.py"))  # p1_* is not p10_*
        pools[spec.id] = pool
    learners = max(len(pool) for pool in pools.values())
    learners = min(learners, 16)  # a class of 16 learners, plus the reference and the two near-copies
    for i in range(learners):
        folder = subs / f"learner-{i:02d}"
        folder.mkdir()
        for spec in SPECS.values():
            pool = pools[spec.id]
            source = pool[i].read_text() if i < len(pool) else stubs[spec.filename]
            (folder / spec.filename).write_text(source)
    shutil.copytree(ROOT / "solutions", subs / "reference")
    (subs / "twin").mkdir()
    for path in sorted((subs / "learner-03").iterdir()):
        (subs / "twin" / path.name).write_text(disguise(path.read_text()))
    (subs / "partial-twin").mkdir()
    for spec in SPECS.values():  # answers of its own (the pools' next ones), but p3 and p5 copied from learner-07
        pool = pools[spec.id]
        source = pool[learners].read_text() if learners < len(pool) else stubs[spec.filename]
        (subs / "partial-twin" / spec.filename).write_text(source)
    for name in ("p3_data_parallel.py", "p5_gpipe.py"):
        (subs / "partial-twin" / name).write_text(disguise((subs / "learner-07" / name).read_text()))
    return subs


if __name__ == "__main__":
    where = build_class(Path(sys.argv[1] if len(sys.argv) > 1 else "class-of-answers"))
    print(f"wrote {where}: {len(list(where.iterdir()))} submissions")
