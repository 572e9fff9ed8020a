"""Similar submissions: pairs whose code for one puzzle is suspiciously alike, for a person to read. Never a
penalty: two correct answers to a short puzzle can be alike by nature, and the report says how alike the class is
on that puzzle (its median pair) so that a pair that stands out can be told from one that does not.

    compare_class(sources, stubs)   per puzzle, every pair of submissions that attempted it, most alike first
    similarity_markdown(found)      RESULTS.similarity.md: per puzzle, the pairs at or above THRESHOLD
    similar_to(found)               {submission: "p3: bob (92%); ..."}: the CSV's `similar` column

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

THRESHOLD = 0.6  # a pair is reported when the larger of its two shares reaches this
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


def reported(found: list[PuzzleSimilarity], threshold: float = THRESHOLD) -> list[Pair]:
    return [p for ps in found for p in ps.pairs if p.score >= threshold]


def percent(x: float) -> str:
    return f"{100 * x:.0f}%"


def similarity_markdown(found: list[PuzzleSimilarity], threshold: float = THRESHOLD) -> str:
    out = ["# Similar submissions", "",
           f"Pairs whose code for a puzzle is alike (copydetect's winnowing, names normalised, the stub's own text "
           f"left out): each share is how much of one submission's code the other holds. Listed from "
           f"{percent(threshold)}; the class's median pair is beside each puzzle, since correct answers to a short "
           f"puzzle are alike by nature. For a person to read: similarity is not proof of copying, and no points "
           f"depend on it.", "",
           "| puzzle | attempted by | median pair | pairs listed |", "| --- | ---: | ---: | ---: |"]
    for ps in found:
        listed = sum(p.score >= threshold for p in ps.pairs)
        out.append(f"| {ps.puzzle} | {ps.compared} | {percent(ps.median)} | {listed} |")
    for ps in found:
        listed = [p for p in ps.pairs if p.score >= threshold]
        if not listed:
            continue
        out += ["", f"## {ps.puzzle} (median pair {percent(ps.median)})", "",
                "| submission | submission | share of the first in the second | share of the second in the first |",
                "| --- | --- | ---: | ---: |"]
        out += [f"| {p.a} | {p.b} | {percent(p.share_a)} | {percent(p.share_b)} |" for p in listed]
    return "\n".join(out) + "\n"


def similar_to(found: list[PuzzleSimilarity], threshold: float = THRESHOLD) -> dict[str, str]:
    """Each submission's reported pairs, for the CSV: "p3: bob (92%); p5: carol (81%)"."""
    cells: dict[str, list[str]] = {}
    for p in reported(found, threshold):
        cells.setdefault(p.a, []).append(f"{p.puzzle}: {p.b} ({percent(p.score)})")
        cells.setdefault(p.b, []).append(f"{p.puzzle}: {p.a} ({percent(p.score)})")
    return {name: "; ".join(parts) for name, parts in cells.items()}
