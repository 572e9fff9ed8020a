"""The cost model: what a compute op or a message costs, in whole ticks.

Think of a tick as a nanosecond. The simulated GPU is one named device profile, PUZZLE_GPU, the same for every
puzzle: a 1 TFLOP/s device (1,024 FLOPs a tick; float16 and bfloat16 twice as fast, as on tensor cores) with
2 TB/s of memory bandwidth (2,048 bytes a tick) and 4 ticks to launch a kernel. It is a GPU scaled to the puzzles'
small sizes: with d = 64 a matmul is bound by arithmetic and an elementwise op by memory, as they are on a real
GPU at a real model's sizes. A puzzle picks its network
(latency, link bandwidth) and prints it in its text.

An op on the compute stream costs by the roofline: it is limited either by arithmetic or by memory traffic,

    ticks = max(⌈FLOPs / flops_per_tick⌉, ⌈bytes read and written / memory_bytes_per_tick⌉) + launch_ticks

so a matrix product of 8·64 by 64·256 (262,144 FLOPs, 151,552 bytes) takes 256 + 4 ticks, bound by arithmetic,
while a gelu over the 8·256 result (2,048 FLOPs, 32,768 bytes) takes 16 + 4: bound by memory, like every
elementwise op. Views cost nothing (op_costs.py says what each op costs).

A message costs a latency plus its bytes over the link bandwidth; a collective costs what the ring algorithm that
NCCL and gloo use would cost (alpha = latency, beta = 1/bandwidth, a buffer of n bytes, a group of N ranks):

    send/recv       alpha + n*beta
    all_reduce      2(N-1)*alpha + 2(N-1)/N * n*beta     (reduce-scatter then all-gather)
    all_gather      (N-1)*alpha + (N-1)/N * n*beta       n = the gathered (full) buffer
    reduce_scatter  (N-1)*alpha + (N-1)/N * n*beta       n = the input (full) buffer
    broadcast       (N-1)*alpha + n*beta                 (pipelined along the ring)
    barrier         2(N-1)*alpha                         (an all_reduce of nothing)
    all_to_all      (N-1)*alpha + n*beta                 n = the most bytes any rank sends or receives
                                                         from the others (pairwise exchanges, N-1 steps)

A group of one rank communicates with nobody and costs nothing. Bandwidth terms are rounded up to a whole tick;
`bytes_per_tick=None` makes them zero (free messages, for exact textbook figures such as a pipeline's bubble).
Times are integers, so 19.9 never prints as 19.90000000000001 and the timeline is the same on every run and
every machine.

A real GPU reaches its peak only on large kernels. A DeviceProfile may carry an `Efficiency`: the fraction of
peak that one op achieves, as a step function of its size (a product's GFLOPs, an elementwise op's GFLOPs, the MB
an op moves), and the rate of non-product arithmetic in half precision (a GPU's vector units, not its tensor
cores). The puzzles' GPU has none: it reaches its peak on every op. devices.py holds real GPUs; cluster.py a
network of them, where what a collective costs depends on which GPUs its group spans (`comm_ticks(...,
ranks=...)`: the group's global ranks, which a cost model of a cluster maps to GPUs and links).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from .op_costs import PRODUCTS, OpCost

TICKS_PER_MS = 1_000_000  # a tick is a nanosecond: what a rank's timing events (timing.py) report in milliseconds


@dataclass(frozen=True)
class Efficiency:
    """The fraction of peak one op achieves on a real GPU, as step functions of its size.

    Each curve is ((threshold, fraction), ...) from the largest threshold down: an op of size >= threshold
    achieves that fraction; the last threshold is 0. Fractions are exact (Fraction("0.95")), so ticks stay integers.

    matrix:  products (matmuls, attention), by the GFLOPs of the one op (one GEMM, one batched GEMM)
    vector:  every other op's arithmetic, by its GFLOPs
    memory:  every op's memory traffic, by the MB (10^6 bytes) it reads and writes
    vector_half_speedup: how many times faster than `flops_per_tick` non-product arithmetic runs in float16 and
             bfloat16 (an A100's vector units: 78 TFLOP/s against 19.5 in float32, 4); products get the device's
             `half_precision_speedup` (its tensor cores).
    """

    matrix: tuple
    vector: tuple
    memory: tuple
    vector_half_speedup: int | Fraction = 1

    def __post_init__(self):
        for name in ("matrix", "vector", "memory"):
            curve = tuple((threshold, Fraction(f)) for threshold, f in getattr(self, name))
            if not curve or curve[-1][0] != 0 or any(not 0 < f <= 1 for _, f in curve) or \
                    any(a[0] <= b[0] for a, b in zip(curve, curve[1:])):
                raise ValueError(f"an efficiency curve runs from the largest threshold down to 0, with fractions in "
                                 f"(0, 1]: got {name}={getattr(self, name)}")
            object.__setattr__(self, name, curve)  # exact fractions, whatever the caller wrote

    def scaled(self, matrix: Fraction) -> Efficiency:
        """The same curves with every product's fraction of peak times `matrix` (at most 1)."""
        return Efficiency(tuple((t, min(Fraction(1), f * matrix)) for t, f in self.matrix), self.vector,
                          self.memory, self.vector_half_speedup)

    @staticmethod
    def at(curve: tuple, size: float) -> Fraction:
        """The fraction of peak at `size` (the first step whose threshold it reaches)."""
        return next(f for threshold, f in curve if size >= threshold)


@dataclass(frozen=True)
class DeviceProfile:
    """The constants of one simulated GPU.

    flops_per_tick:        peak arithmetic rate in float32 and float64.
    memory_bytes_per_tick: memory bandwidth (HBM): how many bytes the device reads or writes in one tick.
    launch_ticks:          the fixed cost of every kernel (an op that computes or moves data; views are free).
    half_precision_speedup: how many times faster arithmetic is in float16 or bfloat16 (tensor cores); the bytes
                           halve by themselves.
    efficiency:            None: every op reaches the peak (the puzzles' GPU); else the achieved fractions of peak
                           of a real GPU (Efficiency).
    """

    name: str
    flops_per_tick: int
    memory_bytes_per_tick: int
    launch_ticks: int
    half_precision_speedup: int | Fraction = 1
    efficiency: Efficiency | None = None

    def __post_init__(self):
        if self.flops_per_tick <= 0 or self.memory_bytes_per_tick <= 0 or self.launch_ticks < 0 or \
                self.half_precision_speedup < 1:
            raise ValueError(f"DeviceProfile needs positive rates and a non-negative launch cost, got {self}")

    def compute_ticks(self, cost: OpCost, dtype: torch.dtype | None = None) -> int:
        """One op on the compute stream: the roofline plus the launch."""
        if self.efficiency is not None:
            return self._achieved_ticks(cost, dtype) + self.launch_ticks
        rate = self.flops_per_tick
        if dtype in (torch.float16, torch.bfloat16):
            rate *= self.half_precision_speedup
        return max(-(-cost.flops // rate), -(-cost.bytes // self.memory_bytes_per_tick)) + self.launch_ticks

    def _achieved_ticks(self, cost: OpCost, dtype) -> int:
        """The roofline at the fractions of peak that an op of this size achieves (Efficiency)."""
        eff, half = self.efficiency, dtype in (torch.float16, torch.bfloat16)
        product = cost.kind in PRODUCTS
        rate = self.flops_per_tick * ((self.half_precision_speedup if product else eff.vector_half_speedup)
                                      if half else 1)
        arithmetic = Efficiency.at(eff.matrix if product else eff.vector, cost.flops / 1e9)
        memory = Efficiency.at(eff.memory, cost.bytes / 1e6)
        flops_ticks = -(-cost.flops * arithmetic.denominator // (rate * arithmetic.numerator))
        bytes_ticks = -(-cost.bytes * memory.denominator // (self.memory_bytes_per_tick * memory.numerator))
        return max(flops_ticks, bytes_ticks)

    def describe(self) -> str:
        achieved = "" if self.efficiency is None else ", at the fractions of peak of its efficiency curves"
        return (f"{self.name}: {self.flops_per_tick:,} FLOPs/tick (x{self.half_precision_speedup} in half "
                f"precision), {self.memory_bytes_per_tick:,} bytes/tick of memory bandwidth, "
                f"{self.launch_ticks} ticks per kernel launch{achieved}")


# The one device every puzzle runs on: 1 TFLOP/s, 2 TB/s, 4 ns a launch (a tick is a nanosecond).
PUZZLE_GPU = DeviceProfile("the puzzles' GPU", flops_per_tick=1024, memory_bytes_per_tick=2048, launch_ticks=4,
                           half_precision_speedup=2)


@dataclass(frozen=True)
class CostModel:
    """The simulated machine: its device (the compute stream) and its network (the communication queue).

    latency_ticks:  the fixed cost of one message (alpha), paid once per ring step of a collective.
    bytes_per_tick: the bandwidth of one link (1/beta); None: messages cost their latency only.
    device:         the DeviceProfile of every rank.
    slow_ranks:     Part IV, a straggler: ((rank, k), ...), each such rank's device taking k times as long for every
                    op (a throttled or faulty GPU; its links are as fast as the others'). k may be a Fraction.
    """

    latency_ticks: int = 8
    bytes_per_tick: int | None = 512
    device: DeviceProfile = PUZZLE_GPU
    slow_ranks: tuple = ()

    def __post_init__(self):
        if self.latency_ticks < 0 or (self.bytes_per_tick is not None and self.bytes_per_tick <= 0):
            raise ValueError(f"CostModel needs a positive bandwidth and a non-negative latency, got {self}")
        if any(len(pair) != 2 or Fraction(pair[1]) < 1 for pair in self.slow_ranks):
            raise ValueError(f"slow_ranks holds (rank, k) pairs with k >= 1, got {self.slow_ranks}")

    def slowdown(self, rank: int) -> Fraction:
        """How many times as long rank's device takes for an op (1 but for a straggler)."""
        return next((Fraction(k) for r, k in self.slow_ranks if r == rank), Fraction(1))

    # An op's ticks depend on its cost and dtype alone, so the dispatch mode asks once per (cost, dtype) and keeps
    # the answer; a model whose answer also depends on what is running (the predictor's, while a collective takes
    # some of the SMs) sets this True and is asked for every op.
    ticks_vary = False

    def compute_ticks(self, cost: OpCost, dtype: torch.dtype | None = None) -> int:
        return self.device.compute_ticks(cost, dtype)

    def comm_ticks(self, kind: str, nbytes: int, group_size: int, ranks: tuple | None = None) -> int:
        """Ticks that one communication op occupies the communication queue of every rank taking part. `ranks`,
        the global ranks of the group (or (src, dst) of a message), is for a cost model whose links differ
        between ranks (cluster.py); this one has one network, the same between any two ranks."""
        n, a = group_size, self.latency_ticks
        if kind in ("send", "recv"):
            return a + self._wire(nbytes)
        if n <= 1:
            return 0
        if kind == "all_reduce":
            return 2 * (n - 1) * a + self._wire(2 * (n - 1) * nbytes, n)
        if kind in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
            return (n - 1) * a + self._wire((n - 1) * nbytes, n)
        if kind == "broadcast":
            return (n - 1) * a + self._wire(nbytes)
        if kind == "barrier":
            return 2 * (n - 1) * a
        if kind in ("all_to_all_single", "all_to_all"):
            return (n - 1) * a + self._wire(nbytes)
        if kind == "new_group":
            return 0
        raise ValueError(f"no cost formula for {kind!r}")

    def wire_bytes(self, kind: str, nbytes: int, group_size: int, ranks: tuple | None = None) -> int:
        """Bytes each rank sends under the ring algorithm (the 'communication volume' of the ZeRO paper). `ranks`:
        as for comm_ticks."""
        n = group_size
        if kind in ("send", "recv", "broadcast", "all_to_all_single", "all_to_all"):
            return nbytes  # an all-to-all's caller passes what this rank sends to the others
        if n <= 1:
            return 0
        if kind == "all_reduce":
            return _ceil_ratio(2 * (n - 1) * nbytes, n)
        if kind in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
            return _ceil_ratio((n - 1) * nbytes, n)
        return 0

    def describe(self) -> str:
        link = "free" if self.bytes_per_tick is None else f"{self.bytes_per_tick:,} bytes/tick"
        slow = "".join(f"; rank {r}'s device {Fraction(k)}x slower" for r, k in self.slow_ranks)
        return f"{self.device.describe()}; messages {self.latency_ticks} ticks of latency, links {link}{slow}"

    def _wire(self, nbytes, parts: int = 1) -> int:
        """Ticks to send nbytes / parts bytes over one link, rounded up to a whole tick."""
        per_tick = self.bytes_per_tick
        if per_tick is None:
            return 0
        if type(nbytes) in _EXACT and type(per_tick) in _EXACT:  # (a link's bandwidth may be a Fraction of a peak)
            return _ceil_ratio(nbytes.numerator * per_tick.denominator,
                               parts * nbytes.denominator * per_tick.numerator)
        return math.ceil(Fraction(nbytes if parts == 1 else Fraction(nbytes, parts)) / per_tick)


def _ceil_ratio(num: int, den: int) -> int:
    """⌈num / den⌉ of whole numbers, exactly (den > 0). In integers: the Fractions this took before were a tenth
    of a collective's cost (measured)."""
    if type(num) is int and type(den) is int:
        return -(-num // den)
    return math.ceil(Fraction(num, den))


_EXACT = (int, Fraction)
