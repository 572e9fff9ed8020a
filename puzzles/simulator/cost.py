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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from .op_costs import OpCost


@dataclass(frozen=True)
class DeviceProfile:
    """The constants of one simulated GPU.

    flops_per_tick:        peak arithmetic rate in float32 and float64.
    memory_bytes_per_tick: memory bandwidth (HBM): how many bytes the device reads or writes in one tick.
    launch_ticks:          the fixed cost of every kernel (an op that computes or moves data; views are free).
    half_precision_speedup: how many times faster arithmetic is in float16 or bfloat16 (tensor cores); the bytes
                           halve by themselves.
    """

    name: str
    flops_per_tick: int
    memory_bytes_per_tick: int
    launch_ticks: int
    half_precision_speedup: int = 1

    def __post_init__(self):
        if self.flops_per_tick <= 0 or self.memory_bytes_per_tick <= 0 or self.launch_ticks < 0 or \
                self.half_precision_speedup < 1:
            raise ValueError(f"DeviceProfile needs positive rates and a non-negative launch cost, got {self}")

    def compute_ticks(self, cost: OpCost, dtype: torch.dtype | None = None) -> int:
        """One op on the compute stream: the roofline plus the launch."""
        rate = self.flops_per_tick
        if dtype in (torch.float16, torch.bfloat16):
            rate *= self.half_precision_speedup
        return max(-(-cost.flops // rate), -(-cost.bytes // self.memory_bytes_per_tick)) + self.launch_ticks

    def describe(self) -> str:
        return (f"{self.name}: {self.flops_per_tick:,} FLOPs/tick (x{self.half_precision_speedup} in half "
                f"precision), {self.memory_bytes_per_tick:,} bytes/tick of memory bandwidth, "
                f"{self.launch_ticks} ticks per kernel launch")


# The one device every puzzle runs on: 1 TFLOP/s, 2 TB/s, 4 ns a launch (a tick is a nanosecond).
PUZZLE_GPU = DeviceProfile("the puzzles' GPU", flops_per_tick=1024, memory_bytes_per_tick=2048, launch_ticks=4,
                           half_precision_speedup=2)


@dataclass(frozen=True)
class CostModel:
    """The simulated machine: its device (the compute stream) and its network (the communication queue).

    latency_ticks:  the fixed cost of one message (alpha), paid once per ring step of a collective.
    bytes_per_tick: the bandwidth of one link (1/beta); None: messages cost their latency only.
    device:         the DeviceProfile of every rank.
    """

    latency_ticks: int = 8
    bytes_per_tick: int | None = 512
    device: DeviceProfile = PUZZLE_GPU

    def __post_init__(self):
        if self.latency_ticks < 0 or (self.bytes_per_tick is not None and self.bytes_per_tick <= 0):
            raise ValueError(f"CostModel needs a positive bandwidth and a non-negative latency, got {self}")

    def compute_ticks(self, cost: OpCost, dtype: torch.dtype | None = None) -> int:
        return self.device.compute_ticks(cost, dtype)

    def comm_ticks(self, kind: str, nbytes: int, group_size: int) -> int:
        """Ticks that one communication op occupies the communication queue of every rank taking part."""
        n, a = group_size, self.latency_ticks
        if kind in ("send", "recv"):
            return a + self._wire(nbytes)
        if n <= 1:
            return 0
        if kind == "all_reduce":
            return 2 * (n - 1) * a + self._wire(Fraction(2 * (n - 1) * nbytes, n))
        if kind in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
            return (n - 1) * a + self._wire(Fraction((n - 1) * nbytes, n))
        if kind == "broadcast":
            return (n - 1) * a + self._wire(nbytes)
        if kind == "barrier":
            return 2 * (n - 1) * a
        if kind in ("all_to_all_single", "all_to_all"):
            return (n - 1) * a + self._wire(nbytes)
        if kind == "new_group":
            return 0
        raise ValueError(f"no cost formula for {kind!r}")

    def wire_bytes(self, kind: str, nbytes: int, group_size: int) -> int:
        """Bytes each rank sends under the ring algorithm (the 'communication volume' of the ZeRO paper)."""
        n = group_size
        if kind in ("send", "recv", "broadcast", "all_to_all_single", "all_to_all"):
            return nbytes  # an all-to-all's caller passes what this rank sends to the others
        if n <= 1:
            return 0
        if kind == "all_reduce":
            return math.ceil(Fraction(2 * (n - 1) * nbytes, n))
        if kind in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor"):
            return math.ceil(Fraction((n - 1) * nbytes, n))
        return 0

    def describe(self) -> str:
        link = "free" if self.bytes_per_tick is None else f"{self.bytes_per_tick:,} bytes/tick"
        return f"{self.device.describe()}; messages {self.latency_ticks} ticks of latency, links {link}"

    def _wire(self, nbytes) -> int:
        if self.bytes_per_tick is None:
            return 0
        return math.ceil(Fraction(nbytes) / self.bytes_per_tick)
