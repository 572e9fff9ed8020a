"""The likely cause of a plain error (torch's, Python's) out of the learner's code, when the error and the line it
came from single one out. describe_exception (learner_code.py) appends it to the error, on every backend.

    in-place on a leaf      torch: "a leaf Variable that requires grad is being used in an in-place operation"
                            -> a weight updated in place while autograd records (no torch.no_grad())
    inference tensors       torch: "... inference tensor ..." -> a forward under torch.inference_mode(), whose
                            tensors can never join a graph (torch.no_grad()'s can)
    a .grad that is None    a NoneType where a tensor was expected, on a line about gradients -> a .grad that
                            backward never filled: the tensor did not require grad when the forward used it (a
                            received activation, a microbatch)
    1 - beta**t = 0         ZeroDivisionError on a line of Adam's bias correction -> the step counter is 0 there
                            (advanced after the update, or started at 0)
    past the ends           the simulator: "rank 3: send to/from rank 4, but ranks are 0..3" -> the last rank
                            sends forward (or the first receives from before it): a pipeline's ends unguarded
    a rank gone ahead       the simulator: two collectives that can never meet, one rank's in the learner's code
                            and the other's in the grader's ([harness]) -> that rank left the learner's function
                            without a collective the other still waits in (returned early on its own decision)

Per puzzle (PUZZLE_CAUSES), where the puzzle's code gives an error one meaning:

    p19: ranks apart     the simulator: two ranks met in one collective of a group, one at a collective of the
                         learner's step() and the other at another collective (of step(), or the grader's after
                         it) -> the ranks did not decide the same thing: a norm or non-finite check from a rank's own
                         shard (or one group's sum), or a skip decided before the all-reduce
    p20: no gradient     the simulator: a collective handed None -> the rank with no real row ran no backward: its
                         share of the gradient is zeros

A rule names a mistake only when nothing else makes that error on that line; otherwise nothing is added.
"""

from __future__ import annotations

import re

INFERENCE = re.compile(r"inference tensor", re.IGNORECASE)
OUT_OF_RANGE = re.compile(r"rank (\d+): (\w+) to/from rank (-?\d+), but ranks are 0\.\.(\d+)")
ABOUT_GRADIENTS = re.compile(r"grad", re.IGNORECASE)  # a.grad, input_grads[i], grad_x
NEVER_MEET = re.compile(r"rank (\d+) waits in .+? at (.+?), while rank (\d+) waits in .+? at (.+?)\. The ranks of a "
                        r"group must make the same collective calls")
BIAS_CORRECTION = re.compile(r"beta|bias|correction|\bbc\d?\b", re.IGNORECASE)
# two ranks in one collective of a group, each with its own call: by name, or by the arguments of the same name
MET_CALLING = re.compile(r"ranks met in \S+ \(call #\d+ on .+?\) with different arguments: rank (\d+) called (\w+) at "
                         r"(.+?), rank (\d+) called (\w+) at (.+?)\. Every rank of the group")
MET_PASSING = re.compile(r"rank (\d+) passed \w+=[^()]*\(at (.+?)\)(?=; |, rank |\. Every rank)")


def likely_cause(exc: BaseException, line: str, puzzle: str = "") -> str:
    """The likely mistake behind `exc`, raised at the learner's `line` (its source text) in `puzzle` (its id, if
    known), or ''."""
    message = str(exc)
    own = PUZZLE_CAUSES.get(puzzle)
    cause = own(exc, message, line) if own is not None else ""
    if cause:
        return cause
    if isinstance(exc, RuntimeError) and "a leaf Variable that requires grad is being used in an in-place" in message:
        return ("a tensor that requires grad (a weight) was changed in place (w -= ..., w.copy_(...)) while "
                "autograd records: do the update under `with torch.no_grad():`")
    if isinstance(exc, RuntimeError) and INFERENCE.search(message):
        return ("a tensor made under torch.inference_mode() reached autograd: inference tensors can never join a "
                "graph, not even detached ones. Run a forward whose results autograd will see again (a "
                "checkpoint, an activation) under torch.no_grad() instead")
    if isinstance(exc, (TypeError, AttributeError)) and "NoneType" in message and ABOUT_GRADIENTS.search(line):
        return ("a .grad that is None: backward fills the .grad of a tensor only if it required grad when the "
                "forward used it. Was it made to require grad before its forward (a received activation or a "
                "microbatch: a.requires_grad_())?")
    if isinstance(exc, ZeroDivisionError) and BIAS_CORRECTION.search(line):
        return ("1 - beta**t is 0 when t = 0: the step counter was 0 at the bias correction (advanced after the "
                "update, or started at 0). Count the step first, so that t = 1 at the first step")
    gone = _gone_ahead(message) if type(exc).__name__ == "CollectiveMismatchError" else None
    if gone is not None:
        ahead, behind = gone
        return (f"rank {ahead} has already left your code (it waits in the grader's own collective, which comes "
                f"after your function returns), while rank {behind} still waits in a collective of yours that rank "
                f"{ahead} never made: rank {ahead} returned early. Every rank must make the same collective calls, "
                f"in the same order: a decision to skip (a step, an update) taken on one rank alone leaves the "
                f"others waiting; decide it from something every rank shares")
    peer = OUT_OF_RANGE.search(message) if isinstance(exc, ValueError) else None
    if peer is not None:
        rank, kind, other, last = (peer.group(1), peer.group(2), int(peer.group(3)), int(peer.group(4)))
        if other == last + 1:
            return (f"rank {rank} is the last rank, and rank {rank} + 1 is past it: the last pipeline stage sends "
                    f"nothing forward and receives no gradient from after it (it computes the loss; in 1F1B it runs "
                    f"no warm-up forward, p-1-rank = 0). Guard those {kind}s with `if rank < world - 1` (a ring "
                    f"would wrap around: (rank + 1) % world)")
        if other == -1:
            return (f"rank {rank} is the first rank, and rank {rank} - 1 is before it: the first pipeline stage "
                    f"receives no activation (it reads the batch) and sends no gradient back. Guard those {kind}s "
                    f"with `if rank > 0` (a ring would wrap around: (rank - 1) % world)")
    return ""


def _gone_ahead(message: str) -> tuple[int, int] | None:
    """(the rank already in the grader's code, the rank still in the learner's) when a mismatch says so."""
    met = NEVER_MEET.search(message)
    if met is None:
        return None
    first, first_at, second, second_at = int(met.group(1)), met.group(2), int(met.group(3)), met.group(4)
    harness = (first_at.startswith("[harness]"), second_at.startswith("[harness]"))
    if harness == (False, True):
        return second, first
    if harness == (True, False):
        return first, second
    return None


def _apart(message: str) -> list[tuple[int, str]] | None:
    """[(rank, where it called), ...] for the two ranks of a collective that met with different calls."""
    calling = MET_CALLING.search(message)
    if calling is not None:
        return [(int(calling.group(1)), calling.group(3)), (int(calling.group(4)), calling.group(6))]
    ranks = {}
    for rank, where in MET_PASSING.findall(message):  # one pair per argument that differs
        ranks.setdefault(int(rank), where)
    return list(ranks.items()) if len(ranks) == 2 else None


def _line_of(where: str) -> str:
    """'p19_global_clipping.py:79' out of a site 'p19_global_clipping.py:79: dist.all_gather(...)'."""
    return where.split(": ", 1)[0]


def _p19_ranks_apart(exc: BaseException, message: str, line: str = "") -> str:
    """p19: step() is the learner's only code, and its one decision is whether to skip; two ranks at different
    calls of one group took different branches of it."""
    if type(exc).__name__ != "CollectiveMismatchError":
        return ""
    gone = _gone_ahead(message)
    sides = _apart(message) if gone is None else None
    if sides is not None:
        harness = [where.startswith("[harness]") for _, where in sides]
        if harness == [False, True]:
            gone = (sides[1][0], sides[0][0])
        elif harness == [True, False]:
            gone = (sides[0][0], sides[1][0])
        elif True in harness or MET_CALLING.search(message) is None:
            return ""  # both in the grader's code, or one call of step() with different shapes: no branch taken
    same = ("The ranks did not decide the same thing: a norm or a non-finite check computed from a rank's own "
            "gradient shard only (or summed over one group, not both), or a skip decided before the all-reduce. "
            "Decide from what every rank shares: the sum of squares all-reduced over both groups, then one test of "
            "that global norm, the same on every rank")
    if gone is not None:
        ahead, behind = gone
        return (f"rank {ahead} has already left your step() (it is in the grader's own collective, after your "
                f"function returns), while rank {behind} is still in a collective of your step(): rank {ahead} "
                f"returned early, skipping a step rank {behind} went on with. {same}")
    if sides is None:
        return ""
    (first, first_at), (second, second_at) = sides
    return (f"ranks {first} and {second} reached different collectives of your step() (rank {first} at "
            f"{_line_of(first_at)}, rank {second} at {_line_of(second_at)}): they took different branches of it, "
            f"one skipping what the other ran (an update, a collective). {same}")


def _p20_no_gradient(exc: BaseException, message: str, line: str = "") -> str:
    """p20: a gradient that is None where a collective (or the update) wants a tensor is the share of the rank with
    no real row, whose (empty) loop of microbatches never ran backward."""
    if isinstance(exc, (TypeError, AttributeError)) and "NoneType" in message and ABOUT_GRADIENTS.search(line):
        return ("a gradient that is None: a rank with no real row runs no microbatch, so backward never fills its "
                "w.grad, and the others still wait for its share. Its share is zero: w.grad = torch.zeros_like(w) "
                "before the all-reduce")
    return ""


PUZZLE_CAUSES = {"p19": _p19_ranks_apart, "p20": _p20_no_gradient}
