"""A rank's schedule read off its messages and its ops, not off FLOP totals alone: the work that ran between a
message's arrival and the messages that needed it, and the least time the work of a chain of ranks can take.

    products_between(obs, rank, start, end)   the FLOPs of products `rank` computed in [start, end] (an event the
                                              window cuts counts pro rata)
    arrivals(obs, rank, src, least)           when each message of at least `least` bytes from `src` arrived
    departures(obs, rank, dst, least)         when `rank` issued each message of at least `least` bytes to `dst`
    Relay                                     work that turns inputs into outputs: a stage's forward turns each
                                              activation that arrives into one it sends on, at least `unit` FLOPs of
                                              products each
    shortfall(obs, rank, relay)               the first window in which `rank` computed too few products for the
                                              outputs it sent since the inputs arrived
    peak_ticks(flops, device)                 the least time `flops` take at the device's peak rate

Why. A pipeline's figures (its bubble) are read off the clock, and the clock sees what ran on it. A stage that sends
microbatch k's activation without having computed its forward since microbatch k's input arrived computed that
forward where the clock did not see it, or not at all; its bubble is then a figure the clock could not have given
(below zero, or below the critical path's work). Every output needs its own input, so for any input time a and
output time t, at least (outputs issued by t) - (inputs arrived before a) units of work ran in [a, t], whatever the
order the rank ran them in: that holds for every correct schedule, in any style, and fails for one whose work is
off the clock. Extra messages only make it stricter (only the latest `count` arrivals are inputs, and every
output needs one); a merged event that straddles a window counts pro rata, and `share` (half) leaves room for it.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from fractions import Fraction
from math import ceil

from .spec import Observation

SHARE = Fraction(1, 2)  # the part of a window's products that must be seen: room for events cut by the window


def products_between(obs: Observation, rank: int, start: int, end: int) -> float:
    """The FLOPs of products `rank` computed between ticks `start` and `end`; an event the window cuts counts in
    proportion to its ticks inside it."""
    total = 0.0
    for e in obs.events_of(rank, "compute"):
        products = e.get("product_flops", 0)
        if not products or e["end"] <= start or e["start"] >= end:
            continue
        ticks = e["end"] - e["start"]
        inside = min(e["end"], end) - max(e["start"], start)
        total += products if ticks <= 0 else products * inside / ticks
    return total


def arrivals(obs: Observation, rank: int, src: int, least: int = 1, count: int | None = None) -> list[int]:
    """When each message from `src` of at least `least` bytes arrived on `rank` (its receive's end), earliest
    first; with `count`, the latest `count` of them."""
    times = sorted(e["end"] for e in obs.events_of(rank, "comm", "recv")
                   if int(e["peers"][0]) == src and e["nbytes"] >= least)
    return times[-count:] if count is not None and count < len(times) else times


def departures(obs: Observation, rank: int, dst: int, least: int = 1) -> list[int]:
    """When `rank` issued each message of at least `least` bytes to `dst` (its compute stream's tick then: what it
    sends was computed by that tick), earliest first."""
    return sorted(e.get("issued", e["start"]) for e in obs.events_of(rank, "comm", "send")
                  if int(e["peers"][-1]) == dst and e["nbytes"] >= least)


@dataclass(frozen=True)
class Relay:
    """Work a rank does between messages: each output (a message sent, or the rank's end) needs one input that
    arrived before it and at least `unit` FLOPs of products after that input's arrival.

    name:    what the work is ("forward", "backward", "the rest of backward")
    inputs:  when each input was there (an arrival, or 0 for what the rank held from the start), sorted
    outputs: when each output left (a send's issue, or the rank's last compute for the work that ends there), sorted
    unit:    the FLOPs of products one output needs at least
    what:    the inputs and outputs in words, for the message ("activation from rank 0", "activation to rank 2"; None
             for outputs that are the rank's end)
    """

    name: str
    inputs: tuple
    outputs: tuple
    unit: int
    what: tuple = ("input", "output")


@dataclass(frozen=True)
class Shortfall:
    """A window [start, end] of `rank`'s clock in which it computed `found` FLOPs of products where `units` outputs
    of `relay` needed at least units·unit: the output at `end` is the `output`-th (from 1), the input at `start`
    the `input`-th."""

    rank: int
    relay: Relay
    start: int
    end: int
    units: int
    found: float
    input: int
    output: int

    def describe(self) -> str:
        r, what_in, what_out = self.relay, self.relay.what[0], self.relay.what[1]
        need = self.units * r.unit
        since = (f"since its {ordinal(self.input)} {what_in} arrived at tick {self.start:,}" if self.start else
                 "from the start")
        done = (f"its compute ended at tick {self.end:,}" if what_out is None else
                f"issued its {ordinal(self.output)} {what_out} at tick {self.end:,}")
        return (f"rank {self.rank} {done}, having computed {self.found:,.0f} FLOPs of products {since}, where the "
                f"{self.units} {r.name}(s) that had to run in between take {need:,} ({r.unit:,} each)")


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def shortfall(obs: Observation, rank: int, relay: Relay, share: Fraction = SHARE) -> Shortfall | None:
    """The window, earliest output first, in which `rank` computed fewer than `share` of the products the relay's
    outputs needed since an input arrived; None when every window holds them."""
    inputs = sorted(relay.inputs)
    for k, end in enumerate(sorted(relay.outputs), start=1):
        for j, start in enumerate(inputs):
            if start > end:
                break
            units = k - bisect_left(inputs, start)  # outputs by `end`, less the inputs there before `start`
            if units <= 0:
                continue
            found = products_between(obs, rank, start, end)
            if found < units * relay.unit * share:
                return Shortfall(rank, relay, start, end, units, found, j + 1, k)
    return None


def peak_ticks(flops: int, device) -> int:
    """The least ticks `flops` FLOPs take on `device`: every op's time is at least its FLOPs at the peak rate."""
    return ceil(flops / device.flops_per_tick)
