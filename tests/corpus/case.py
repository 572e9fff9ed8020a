"""What a corpus case is: a rank program `fn(dist)` and, written next to it, what the simulator and gloo must each
do with it. A case is declared with a decorator that returns the function unchanged (so each gloo process can
import it by name) and registers it:

    @case(4)                                                   # same values on both backends
    def all_reduce_sum_f64(dist): ...

    @case(4, sim=NonContiguousError, gloo={WRONG}, fixed=fixed_all_reduce_column)
    def all_reduce_column(dist): ...                           # the simulator refuses what gloo gets wrong

The relations (each checked by runner.judge against one run of each backend):

    SAME      both return, with the same values (float64 to 1e-12, float32 to 1e-6, integers and bools exactly)
    REFUSED   the simulator raises `sim` (a named error) where gloo fails: each gloo outcome in `gloo` is allowed
              (RAISED, HUNG, DIED, or WRONG: it returns values other than what `fixed`, the intended program,
              gives on the simulator; LOST: it returns although a message was never delivered; RIGHT, beside
              WRONG, where the outcome is a race gloo sometimes wins)
    STRICTER  the simulator raises `sim` where gloo returns the intended values: deliberate, `why` says why
    LOOSER    the simulator returns where gloo fails: deliberate, `why` says why
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

SAME, REFUSED, STRICTER, LOOSER = "same values", "simulator refuses", "simulator stricter", "simulator looser"
# What a gloo run can do: return (right or wrong values), raise, hang past its time limit, or kill a process.
RETURNED, RAISED, HUNG, DIED = "returned", "raised", "hung", "died"
WRONG, RIGHT, LOST = "wrong values", "right values", "lost a message"  # what a gloo run that returned did

CASES: dict[str, Case] = {}


@dataclass
class Case:
    name: str
    fn: object
    ranks: int
    relation: str
    sim: type | None = None  # the error the simulator must raise (REFUSED, STRICTER)
    gloo: frozenset = field(default_factory=frozenset)  # the gloo outcomes allowed (REFUSED, LOOSER)
    fixed: object = None  # the intended program, for WRONG (its values on the simulator are the right ones)
    why: str = ""
    topic: str = ""

    @property
    def module(self) -> str:
        return self.fn.__module__

    @property
    def summary(self) -> str:
        return (inspect.getdoc(self.fn) or self.name).splitlines()[0]

    @property
    def may_wait(self) -> bool:
        """Whether a rank may wait in vain on gloo (every case but SAME: a partner raised, hung or died). Such
        cases run in groups of their own, with a short time limit."""
        return self.relation != SAME

    @property
    def may_hang(self) -> bool:
        """Whether gloo may leave a rank waiting until its time limit (a partner raised, hung or died): only such a
        case runs under the short limit; one whose gloo outcomes all return (wrong or right values, a lost
        message) gets the ordinary limit, so that a loaded machine cannot make it look hung."""
        return bool(self.gloo & {RAISED, HUNG, DIED})


def case(ranks: int, *, sim: type | None = None, gloo=(), fixed=None, why: str = "", relation: str | None = None):
    """Register `fn` as a corpus case (see the module's docstring); returns `fn` itself."""
    gloo = frozenset(gloo)
    if relation is None:
        relation = SAME if sim is None and not gloo else REFUSED if sim is not None else LOOSER
    if relation in (STRICTER, LOOSER) and not why:
        raise ValueError("a deliberate divergence needs its `why`")
    if relation in (REFUSED, STRICTER) and sim is None:
        raise ValueError(f"{relation} needs the simulator's error")
    if WRONG in gloo and fixed is None:
        raise ValueError("WRONG needs the intended program `fixed`")

    def register(fn):
        if fn.__name__ in CASES:
            raise ValueError(f"two corpus cases are named {fn.__name__}")
        topic = fn.__module__.rsplit(".", 1)[-1]
        CASES[fn.__name__] = Case(fn.__name__, fn, ranks, relation, sim, gloo, fixed, why, topic)
        return fn

    return register
