"""A cluster of real GPUs: nodes of 8, NVLink inside a node, InfiniBand between nodes. What a message or a
collective costs depends on which GPUs it joins.

    node 0                                  node 1
    [gpu 0 .. gpu 7]  <- NVLink, 300 GB/s ->   [gpu 8 .. gpu 15]
          |  one InfiniBand NIC per GPU, 25 GB/s each way  |
          +------------------------------------------------+

A collective runs over the slowest link its group crosses: NVLink when every GPU of the group is in one node, the
network between nodes otherwise (each GPU has a NIC of its own, so the groups do not share one). A link's
bandwidth is its peak times its efficiency. What a collective of n bytes among N GPUs costs on a link is
Calculon's formula (calculon/network.py at caa4b11): one latency, plus scalar·n·(1 + offset/N) bytes at the
achieved bandwidth, with a (scalar, offset) per kind of op and link:

                    all_reduce     all_gather / reduce_scatter    p2p       latency
    NVLink 3        2.0, -1        1.5, -1                        1.0       10 us      (ring: 2(N-1)/N·n; 1.5x it)
    NVLink 4        1.0, +1        1.0,  0                        1.0       10 us      (in-switch reduction)
    between nodes   1.0,  0        1.0,  0                        1.0       20 us      (in-network reduction)

A link without such a table (the tests' links) is charged cost.py's ring formulas, a latency per ring step. A
collective that spans nodes is charged as one collective over the network: no hierarchical algorithm, no
contention between groups on shared links.

Which GPU a simulated rank is: a `Placement`. Megatron-LM numbers the GPUs of a job tensor-parallel first, then
data-parallel, then pipeline (gpu = tp + t·dp + t·D·pp), so a tensor-parallel group of 8 fills a node and the
pipeline's messages cross nodes. To keep a large configuration cheap to simulate, one rank may stand for the
whole tensor-parallel group of its stage (the others do the same work on their own slices, in step): then a
group of that one rank is its tensor-parallel group, charged as a collective of `stand_in` GPUs of its node, and
an all-gather or reduce-scatter on it, which the rank runs on its own piece, moves `stand_in` pieces.

Constants: peak bandwidths from NVIDIA's datasheets; efficiencies, latencies and the op table from Calculon's
systems/a100_80g.json and h100_80g_nvl8.json at caa4b11 (unchanged since 71f6435, 2023-04-25; an older revision,
f50f3a4, had NVLink at 0.6 and latencies of 1 and 2 us a ring step, which this predictor used until issue 32):

    DGX A100     NVLink 3: 600 GB/s per GPU, 300 each way, at 0.65; HDR InfiniBand: 200 Gb/s, one NIC per GPU,
                 25 GB/s, at 0.9
    H100 hosts   NVLink 4: 900 GB/s per GPU, 450 each way, at 0.65; 400 Gb/s per GPU (NDR InfiniBand or RoCE),
                 50 GB/s, at 0.9
    SMs a collective takes from the compute under it (Calculon's processor_usage; sharing.py): 0.15 on NVLink,
                 0.02 between nodes
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from fractions import Fraction

from puzzles.simulator.cost import CostModel, DeviceProfile
from .devices import (A100_80GB, A100_80GB_ROOFLINE, A100_80GB_UNFITTED, H100_GRAND_TETON,
                      H100_GRAND_TETON_UNFITTED, H100_SXM)
from .sharing import InFlight, Windows

GATHER_KINDS = ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor")
# the simulator's kinds of op by Calculon's names (calculon/network.py)
CALCULON_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
                "reduce_scatter_tensor": "reduce_scatter", "send": "p2p", "recv": "p2p"}


@dataclass(frozen=True)
class Link:
    """One kind of link: its peak bandwidth each way, in bytes per tick (GB/s), the fraction of it a transfer
    achieves, the latency, and Calculon's table of (scalar, offset) by kind of op (module docstring). Without a
    table, the latency is paid each ring step of cost.py's formulas."""

    name: str
    bytes_per_tick: int | None  # None: free (latency only)
    efficiency: Fraction
    latency_ticks: int
    ops: tuple = ()  # ((calculon kind, scalar, offset), ...): latency once per op, Calculon's formula
    processor_usage: Fraction = Fraction(0)  # the share of the GPU's SMs a collective on it takes (sharing.py)

    def network(self, device: DeviceProfile) -> CostModel:
        """cost.py's alpha-beta model of this link: its ring formulas at the achieved bandwidth."""
        achieved = None if self.bytes_per_tick is None else self.bytes_per_tick * Fraction(self.efficiency)
        return CostModel(latency_ticks=self.latency_ticks, bytes_per_tick=achieved, device=device)

    def ticks(self, kind: str, nbytes: int, group_size: int, device: DeviceProfile) -> int:
        """What one op of `kind` on `nbytes` among `group_size` GPUs costs on this link."""
        table = {k: (Fraction(scalar), offset) for k, scalar, offset in self.ops}
        name = CALCULON_OPS.get(kind)
        if name not in table or (name != "p2p" and group_size <= 1):
            return self.network(device).comm_ticks(kind, nbytes, group_size)
        scalar, offset = table[name]
        moved = scalar * nbytes * (1 + Fraction(offset, group_size))
        if self.bytes_per_tick is None:
            return self.latency_ticks
        return self.latency_ticks + math.ceil(moved / (self.bytes_per_tick * Fraction(self.efficiency)))


@dataclass(frozen=True)
class Cluster:
    """GPUs of one kind in nodes of `gpus_per_node`, NVLink inside a node, `network` between nodes."""

    name: str
    device: DeviceProfile
    memory_bytes: int
    gpus_per_node: int
    nvlink: Link
    network: Link

    def node(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def link(self, gpus) -> Link:
        """The slowest link a group of GPUs crosses."""
        return self.nvlink if len({self.node(g) for g in gpus}) <= 1 else self.network


@dataclass(frozen=True)
class Placement:
    """Which GPU each simulated rank is (gpus[rank]); `stand_in` > 1: each rank stands for the GPUs gpus[rank] to
    gpus[rank] + stand_in - 1, its tensor-parallel group, and a group of that one rank is that group."""

    gpus: tuple
    stand_in: int = 1

    def group(self, ranks) -> tuple:
        """The GPUs that a group of simulated ranks communicates among."""
        if len(ranks) == 1 and self.stand_in > 1:
            first = self.gpus[ranks[0]]
            return tuple(range(first, first + self.stand_in))
        return tuple(self.gpus[r] for r in ranks)


@dataclass(frozen=True)
class ClusterCostModel(CostModel):
    """The cost model of a cluster: each op on a rank's compute stream by the cluster's device (at the achieved
    fractions of peak, slowed while collectives issued asynchronously take some of its SMs: sharing.py), each
    message and collective by the links its GPUs cross. `shared` False: the device alone (what a tally of the
    ops counts)."""

    cluster: Cluster | None = None
    placement: Placement = field(default_factory=lambda: Placement(()))
    windows: Windows = field(default_factory=Windows, compare=False, repr=False)
    shared: bool = True
    _ticks: dict = field(default_factory=dict, compare=False, repr=False)  # comm_ticks by its arguments
    ticks_vary = True  # (not a field) compute_ticks advances the windows of the collectives in flight: ask per op

    def __post_init__(self):
        super().__post_init__()
        if self.cluster is None:
            raise ValueError("ClusterCostModel needs a cluster")
        if self.device is not self.cluster.device:
            object.__setattr__(self, "device", self.cluster.device)

    def _route(self, kind: str, nbytes: int, group_size: int, ranks) -> tuple[CostModel, int, int]:
        """The link's model, the bytes and the group size of the op among real GPUs."""
        gpus = self.placement.group(tuple(ranks)) if ranks is not None else tuple(range(group_size))
        if kind in GATHER_KINDS and len(gpus) != group_size and group_size:
            nbytes = nbytes * len(gpus) // group_size  # one piece per GPU: the rank ran it on its own piece
        return self.cluster.link(gpus).network(self.device), nbytes, len(gpus)

    def compute_ticks(self, cost, dtype=None) -> int:
        ticks = self.device.compute_ticks(cost, dtype)
        return self.windows.charge(ticks) if self.shared else ticks

    def comm_ticks(self, kind: str, nbytes: int, group_size: int, ranks: tuple | None = None) -> int:
        key = (kind, nbytes, group_size, None if ranks is None else tuple(ranks))
        ticks = self._ticks.get(key)
        if ticks is None:  # a step asks for the same few thousand times: worked out once (measured: a fifth of
            # a rank's time, in Fractions)
            gpus = self.placement.group(key[3]) if ranks is not None else tuple(range(group_size))
            if kind in GATHER_KINDS and len(gpus) != group_size and group_size:
                nbytes = nbytes * len(gpus) // group_size  # one piece per GPU: the rank ran it on its own piece
            ticks = self._ticks[key] = self.cluster.link(gpus).ticks(kind, nbytes, len(gpus), self.device)
        return ticks

    def in_flight(self, handle, kind: str, nbytes: int, ranks: tuple):
        """`handle`'s collective (of `kind` on `nbytes`, among the simulated `ranks`) runs from now under this
        rank's compute: an InFlight handle whose wait() ends its share of the SMs (sharing.py)."""
        gpus = self.placement.group(tuple(ranks))
        ticks = self.comm_ticks(kind, nbytes, len(ranks), ranks)
        return InFlight(handle, self.windows, self.windows.open(ticks, self.cluster.link(gpus).processor_usage))

    def tally_model(self) -> ClusterCostModel:
        """The same costs without the sharing: what sim.tally counts an op at."""
        return dataclasses.replace(self, shared=False)

    def wire_bytes(self, kind: str, nbytes: int, group_size: int, ranks: tuple | None = None) -> int:
        network, nbytes, n = self._route(kind, nbytes, group_size, ranks)
        return network.wire_bytes(kind, nbytes, n)

    def describe(self) -> str:
        c = self.cluster
        return (f"{c.device.describe()}; {c.name}: nodes of {c.gpus_per_node}, {c.nvlink.name} "
                f"{c.nvlink.bytes_per_tick} GB/s at {Fraction(c.nvlink.efficiency)} inside a node, {c.network.name} "
                f"{c.network.bytes_per_tick} GB/s at {Fraction(c.network.efficiency)} between nodes")


_P2P = (("p2p", 1, 0),)
_NVLINK_SMS, _NETWORK_SMS = Fraction("0.15"), Fraction("0.02")  # Calculon's processor_usage
NVLINK3 = Link("NVLink 3", bytes_per_tick=300, efficiency=Fraction("0.65"), latency_ticks=10_000,
               ops=(*_P2P, ("all_reduce", 2, -1), ("all_gather", "1.5", -1), ("reduce_scatter", "1.5", -1)),
               processor_usage=_NVLINK_SMS)
HDR_INFINIBAND = Link("HDR InfiniBand", bytes_per_tick=25, efficiency=Fraction("0.9"), latency_ticks=20_000,
                      ops=(*_P2P, ("all_reduce", 1, 0), ("all_gather", 1, 0), ("reduce_scatter", 1, 0)),
                      processor_usage=_NETWORK_SMS)
NVLINK4 = Link("NVLink 4", bytes_per_tick=450, efficiency=Fraction("0.65"), latency_ticks=10_000,
               ops=(*_P2P, ("all_reduce", 1, 1), ("all_gather", 1, 0), ("reduce_scatter", 1, 0)),
               processor_usage=_NVLINK_SMS)
NDR_400G = Link("400 Gb/s RDMA", bytes_per_tick=50, efficiency=Fraction("0.9"), latency_ticks=20_000,
                ops=(*_P2P, ("all_reduce", 1, 0), ("all_gather", 1, 0), ("reduce_scatter", 1, 0)),
                processor_usage=_NETWORK_SMS)

DGX_A100 = Cluster("DGX A100 (80 GB)", A100_80GB, 80 * 2**30, 8, NVLINK3, HDR_INFINIBAND)
DGX_A100_ROOFLINE = Cluster("DGX A100 (80 GB), ops by the roofline", A100_80GB_ROOFLINE, 80 * 2**30, 8, NVLINK3,
                            HDR_INFINIBAND)
DGX_H100 = Cluster("DGX H100", H100_SXM, 80 * 2**30, 8, NVLINK4, NDR_400G)
GRAND_TETON = Cluster("Grand Teton H100 (96 GB HBM2e, 500 W)", H100_GRAND_TETON, 96 * 2**30, 8, NVLINK4, NDR_400G)

CLUSTERS = {"a100": DGX_A100, "a100-roofline": DGX_A100_ROOFLINE, "h100": DGX_H100,
            "h100-grand-teton": GRAND_TETON,
            "a100-unfitted": dataclasses.replace(DGX_A100, device=A100_80GB_UNFITTED,
                                                 name="DGX A100 (80 GB), nothing fitted"),
            "h100-grand-teton-unfitted": dataclasses.replace(GRAND_TETON, device=H100_GRAND_TETON_UNFITTED,
                                                             name="Grand Teton H100, nothing fitted")}
