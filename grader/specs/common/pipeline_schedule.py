"""A pipeline's schedule read off its messages and its ops (core/schedule.py), for the bubble checks of p5, p6,
p11, p16 and p17: a bubble is a figure of the clock, so before it is read the clock must have seen the stages'
work where the messages say it ran.

    stage_relays(...)      a stage's work between its messages, on a pipeline whose stages talk to the stage
                           before and after: its forward (each activation received, one sent on), its backward's
                           input gradients (each gradient received, one sent back; on the last stage each
                           activation starts one), and the rest of its backward (every microbatch's weight gradients
                           by the rank's last compute)
    impossible(...)        the Check that refuses a schedule the clock could not have run: a stage that sent on a
                           microbatch without computing it since its input arrived, or a makespan below the critical
                           path's work at the device's peak rate; None when the schedule is possible
"""

from __future__ import annotations

from ...core.result import Budget, Check, fmt
from ...core.schedule import Relay, arrivals, departures, shortfall
from ...core.spec import Observation


def stage_relays(obs: Observation, rank: int, prev: int | None, next_: int | None, m: int, message: int,
                 forward: int, input_grad: int, weight_grad: int) -> list[Relay]:
    """The relays of one stage of a linear pipeline of m microbatches: `prev` and `next_` the global ranks of the
    stages before and after it (None at the ends), `message` one microbatch's activation in bytes (a message of a
    quarter of it counts: a half-precision one is another mistake), and the products of one microbatch's forward,
    input gradient and weight gradients on this stage."""
    least = message // 4
    fed = [0] * m if prev is None else arrivals(obs, rank, prev, least, count=m)  # each microbatch's input
    end = max((e["end"] for e in obs.events_of(rank, "compute")), default=0)
    relays = []
    if next_ is not None:
        relays.append(Relay("forward", tuple(fed), tuple(departures(obs, rank, next_, least)), forward,
                            ("input" if prev is None else f"activation from rank {prev}",
                             f"activation to rank {next_}")))
        grads = arrivals(obs, rank, next_, least, count=m)
        what_in, first = f"gradient from rank {next_}", 0
    else:  # the last stage: the loss's backward starts from each activation, after the microbatch's forward
        grads, what_in, first = fed, ("input" if prev is None else f"activation from rank {prev}"), forward
    if prev is not None:
        relays.append(Relay("backward", tuple(grads), tuple(departures(obs, rank, prev, least)), first + input_grad,
                            (what_in, f"input gradient to rank {prev}")))
    relays.append(Relay("backward", tuple(grads), (end,) * m, first + input_grad + weight_grad,
                        (what_in, None)))
    return relays


def impossible(obs: Observation, relays_of, floor: int, floor_formula: str, budget: Budget,
               values_right: bool) -> Check | None:
    """The failing "bubble" Check for a schedule the clock could not have run, or None. `relays_of(rank)` gives
    each rank's relays; `floor` is the critical path's work at the peak rate, in ticks, as `floor_formula` states
    it."""
    found = [s for rank in range(obs.world_size) for relay in relays_of(rank)
             if (s := shortfall(obs, rank, relay)) is not None]
    if found:
        short = min(found, key=lambda s: (s.end, s.rank))  # the earliest, where the schedule first went wrong
        message = (f"the schedule on the clock is not the stages' work, so no bubble can be read off it: "
                   f"{short.describe()} (at least half of them must be seen on the clock). Ranks with such a "
                   f"window: {sorted({s.rank for s in found})}")
        return Check("bubble", False, message, budget=budget, diagnosis=off_the_clock(values_right))
    if obs.makespan < floor:
        message = (f"the step took {fmt(obs.makespan, 'ticks')}, less than the critical path's work, "
                   f"{floor_formula} = {fmt(floor, 'ticks')} at the device's peak rate: no schedule of work on the "
                   f"clock is that short")
        return Check("bubble", False, message, measured=obs.makespan, budget=budget,
                     diagnosis=off_the_clock(values_right))
    return None


def off_the_clock(values_right: bool) -> str:
    """The cause, said only when the values are right: then the work was done, where the clock could not see it."""
    if not values_right:
        return ""
    return ("the values are right, so the stages' work was done, but not on the ranks' clocks where the messages "
            "needed it: work run in another thread or process, or outside torch, is neither timed nor counted. Run "
            "every op of a stage in the rank's own code, between the message it needs and the one it sends")
