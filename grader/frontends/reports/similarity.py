"""Similar submissions: pairs whose code for one puzzle is suspiciously alike, for a person to read. Never a
penalty: two correct answers to a short puzzle can be alike by nature, and the report says how alike the class is
on that puzzle (its median pair) so that a pair that stands out can be told from one that does not.

    compare_class(sources, stubs)   per puzzle, every pair of submissions that attempted it, most alike first
    pairs_across(found)             per pair of submissions, the puzzles on which their code is the same
    similarity_markdown(found)      RESULTS.similarity.md: the pairs of submissions alike on several puzzles, then
                                    per puzzle the pairs that stand out from the class's median pair
    similar_to(found)               {submission: "bob: 5 of 12 puzzles the same (p1, p3, ...)"}: the CSV's column

Why across puzzles: answers derived from one reference (or a short puzzle's natural answer) can make every pair
of a class alike on one puzzle; a copy is the same on many.

The comparison is copydetect's (PyPI; the winnowing of k-gram fingerprints that MOSS uses, after Schleimer,
Wilkerson and Aiken): each puzzle's code is tokenized with Pygments and its names replaced (so renaming variables
changes nothing), the fingerprints of the stub the learner started from are dropped (the story, the signature
and the imports every learner has), and a pair's similarity is the share of each one's code that the other holds.
It is the instructor's tool (`pip install copydetect`, or the project's `dev` extra); `batch --similarity` asks
for it, and says so when it is missing.
"""

from __future__ import annotations

import io
import statistics
from dataclasses import dataclass, field
from itertools import combinations

THRESHOLD = 0.6  # a pair stands out on a puzzle from this, when also well above the puzzle's median pair
ABOVE_MEDIAN = 0.25
SAME = 0.99  # each holds this much of the other's code: the same code, names and comments aside
SEVERAL = 2  # a pair of submissions with the same code on this many puzzles is listed
NOISE, GUARANTEE = 25, 30  # copydetect's defaults: k-grams of 25 filtered characters, winnowing window 6


class SimilarityUnavailable(RuntimeError):
    """copydetect is not installed."""


@dataclass
class Pair:
    puzzle: str
    a: str
    b: str
    share_a: float  # how much of a's code is also in b's
    share_b: float

    @property
    def score(self) -> float:
        return max(self.share_a, self.share_b)


@dataclass
class PuzzleSimilarity:
    puzzle: str
    compared: int  # submissions that attempted it
    median: float  # the median pair's score: how alike the class is on this puzzle anyway
    pairs: list[Pair] = field(default_factory=list)  # every pair, most alike first


def _fingerprint(text: str, boilerplate=None):
    try:
        from copydetect.detector import CodeFingerprint
    except ImportError as exc:
        raise SimilarityUnavailable("comparing submissions needs copydetect: pip install copydetect (or the "
                                    "project's dev extra: pip install -e \".[dev]\")") from exc
    return CodeFingerprint("answer.py", NOISE, GUARANTEE - NOISE + 1, boilerplate=boilerplate,
                           fp=io.StringIO(text))


def compare_class(sources: dict[str, dict[str, str]], stubs: dict[str, str]) -> list[PuzzleSimilarity]:
    """`sources`: {submission: {puzzle id: its code for that puzzle}} (only what the learner attempted);
    `stubs`: {puzzle id: the stub's text}."""
    from copydetect.detector import compare_files

    out = []
    for puzzle, stub in stubs.items():
        boilerplate = sorted(_fingerprint(stub).hashes) if stub else []
        prints = {name: _fingerprint(code[puzzle], boilerplate) for name, code in sources.items() if puzzle in code}
        pairs = []
        for a, b in combinations(sorted(prints), 2):
            _, (share_a, share_b), _ = compare_files(prints[a], prints[b])
            pairs.append(Pair(puzzle, a, b, float(share_a), float(share_b)))
        pairs.sort(key=lambda p: (-p.score, p.a, p.b))
        median = statistics.median(p.score for p in pairs) if pairs else 0.0
        out.append(PuzzleSimilarity(puzzle, len(prints), median, pairs))
    return out


def stands_out(p: Pair, ps: PuzzleSimilarity, threshold: float = THRESHOLD) -> bool:
    return min(p.share_a, p.share_b) >= SAME or p.score >= max(threshold, ps.median + ABOVE_MEDIAN)


def reported(found: list[PuzzleSimilarity], threshold: float = THRESHOLD) -> list[Pair]:
    """Each puzzle's pairs that stand out: the same code, or far more alike than the class's median pair."""
    return [p for ps in found for p in ps.pairs if stands_out(p, ps, threshold)]


@dataclass
class SubmissionPair:
    a: str
    b: str
    compared: int  # puzzles both attempted
    same: list[str]  # puzzles on which each holds SAME of the other's code
    mean: float  # the mean of the pair's scores over those puzzles


def pairs_across(found: list[PuzzleSimilarity]) -> list[SubmissionPair]:
    """Every pair of submissions with the same code on SEVERAL puzzles or more, the most such puzzles first."""
    scores: dict[tuple[str, str], list[Pair]] = {}
    for ps in found:
        for p in ps.pairs:
            scores.setdefault((p.a, p.b), []).append(p)
    out = [SubmissionPair(a, b, len(ps), [p.puzzle for p in ps if min(p.share_a, p.share_b) >= SAME],
                          statistics.mean(p.score for p in ps)) for (a, b), ps in scores.items()]
    return sorted((s for s in out if len(s.same) >= SEVERAL), key=lambda s: (-len(s.same), -s.mean, s.a, s.b))


def percent(x: float) -> str:
    return f"{100 * x:.0f}%"


def similarity_markdown(found: list[PuzzleSimilarity], threshold: float = THRESHOLD, most: int = 10) -> str:
    out = ["# Similar submissions", "",
           "Code compared puzzle by puzzle (copydetect's winnowing, names normalised, the stub's own text left out); "
           "a pair's share is how much of one submission's code the other holds. For a person to read: similarity "
           "is not proof of copying, and no points depend on it.", "",
           f"## Pairs of submissions with the same code on {SEVERAL} puzzles or more", ""]
    across = pairs_across(found)
    out += ["| submission | submission | puzzles the same | of those both attempted | mean share |",
            "| --- | --- | --- | ---: | ---: |"] if across else ["None."]
    out += [f"| {s.a} | {s.b} | {len(s.same)}: {', '.join(s.same)} | {s.compared} | {percent(s.mean)} |"
            for s in across]
    out += ["", "## Per puzzle", "",
            f"The pairs that stand out: the same code ({percent(SAME)} each way), or at least {percent(threshold)} "
            f"and {percent(ABOVE_MEDIAN)} above the puzzle's median pair (correct answers to a short puzzle, or "
            f"answers grown from one reference, are alike by nature; at most {most} a puzzle here).", "",
            "| puzzle | attempted by | median pair | pairs that stand out |", "| --- | ---: | ---: | ---: |"]
    for ps in found:
        listed = sum(stands_out(p, ps, threshold) for p in ps.pairs)
        out.append(f"| {ps.puzzle} | {ps.compared} | {percent(ps.median)} | {listed} |")
    for ps in found:
        listed = [p for p in ps.pairs if stands_out(p, ps, threshold)][:most]
        if not listed:
            continue
        out += ["", f"## {ps.puzzle} (median pair {percent(ps.median)})", "",
                "| submission | submission | share of the first in the second | share of the second in the first |",
                "| --- | --- | ---: | ---: |"]
        out += [f"| {p.a} | {p.b} | {percent(p.share_a)} | {percent(p.share_b)} |" for p in listed]
    return "\n".join(out) + "\n"


def similar_to(found: list[PuzzleSimilarity]) -> dict[str, str]:
    """Each submission's pairs across puzzles, for the CSV: "bob: 5 of 12 puzzles the same (p1, p3, ...)"."""
    cells: dict[str, list[str]] = {}
    for s in pairs_across(found):
        what = f"{len(s.same)} of {s.compared} puzzles the same ({', '.join(s.same)})"
        cells.setdefault(s.a, []).append(f"{s.b}: {what}")
        cells.setdefault(s.b, []).append(f"{s.a}: {what}")
    return {name: "; ".join(parts) for name, parts in cells.items()}
