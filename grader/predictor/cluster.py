"""A cluster of real GPUs: nodes of 8, NVLink inside a node, InfiniBand between nodes. What a message or a
collective costs depends on which GPUs it joins.

    node 0                                  node 1
    [gpu 0 .. gpu 7]  <- NVLink, 300 GB/s ->   [gpu 8 .. gpu 15]
          |  one InfiniBand NIC per GPU, 25 GB/s each way  |
          +------------------------------------------------+

A collective runs the ring algorithm (cost.py's formulas) over the slowest link its group crosses: NVLink when
every GPU of the group is in one node, the network between nodes otherwise (each GPU has a NIC of its own, so the
rings of different groups do not share one). A link's bandwidth is its peak times its efficiency; its latency is
paid once per ring step. A collective that spans nodes is charged as one flat ring over the network: a
hierarchical all-reduce (reduce-scatter inside each node, all-reduce across, all-gather inside) would be faster,
and is not modelled.

Which GPU a simulated rank is: a `Placement`. Megatron-LM numbers the GPUs of a job tensor-parallel first, then
data-parallel, then pipeline (gpu = tp + t·dp + t·D·pp), so a tensor-parallel group of 8 fills a node and the
pipeline's messages cross nodes. To keep a large configuration cheap to simulate, one rank may stand for the
whole tensor-parallel group of its stage (the others do the same work on their own slices, in step): then a
group of that one rank is its tensor-parallel group, charged as a collective of `stand_in` GPUs of its node, and
an all-gather or reduce-scatter on it, which the rank runs on its own piece, moves `stand_in` pieces.

Constants (NVIDIA's datasheets; the efficiencies and latencies are Calculon's assumptions,
github.com/calculon-ai/calculon, systems/a100_80g.json and h100_80g_nvl8.json):

    DGX A100     NVLink 3: 600 GB/s per GPU, 300 each way, at 0.6, 1 us a step; HDR InfiniBand: 200 Gb/s, one NIC
                 per GPU, 25 GB/s, at 0.9, 2 us
    H100 hosts   NVLink 4: 900 GB/s per GPU, 450 each way, at 0.6, 1 us; 400 Gb/s per GPU (NDR InfiniBand or
                 RoCE), 50 GB/s, at 0.9, 2 us
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from puzzles.simulator.cost import CostModel, DeviceProfile
from .devices import A100_80GB, A100_80GB_CALCULON, H100_GRAND_TETON, H100_SXM

GATHER_KINDS = ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor")


@dataclass(frozen=True)
class Link:
    """One kind of link: its peak bandwidth each way, in bytes per tick (GB/s), the fraction of it a transfer
    achieves, and the latency of one message or ring step."""

    name: str
    bytes_per_tick: int | None  # None: free (latency only)
    efficiency: Fraction
    latency_ticks: int

    def network(self, device: DeviceProfile) -> CostModel:
        """cost.py's alpha-beta model of this link: its ring formulas at the achieved bandwidth."""
        achieved = None if self.bytes_per_tick is None else self.bytes_per_tick * Fraction(self.efficiency)
        return CostModel(latency_ticks=self.latency_ticks, bytes_per_tick=achieved, device=device)


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
    """The cost model of a cluster: each op on a rank's compute stream by the cluster's device (its roofline at
    the achieved fractions of peak), each message and collective by the links its GPUs cross."""

    cluster: Cluster | None = None
    placement: Placement = field(default_factory=lambda: Placement(()))

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

    def comm_ticks(self, kind: str, nbytes: int, group_size: int, ranks: tuple | None = None) -> int:
        network, nbytes, n = self._route(kind, nbytes, group_size, ranks)
        return network.comm_ticks(kind, nbytes, n)

    def wire_bytes(self, kind: str, nbytes: int, group_size: int, ranks: tuple | None = None) -> int:
        network, nbytes, n = self._route(kind, nbytes, group_size, ranks)
        return network.wire_bytes(kind, nbytes, n)

    def describe(self) -> str:
        c = self.cluster
        return (f"{c.device.describe()}; {c.name}: nodes of {c.gpus_per_node}, {c.nvlink.name} "
                f"{c.nvlink.bytes_per_tick} GB/s at {Fraction(c.nvlink.efficiency)} inside a node, {c.network.name} "
                f"{c.network.bytes_per_tick} GB/s at {Fraction(c.network.efficiency)} between nodes")


NVLINK3 = Link("NVLink 3", bytes_per_tick=300, efficiency=Fraction("0.6"), latency_ticks=1_000)
HDR_INFINIBAND = Link("HDR InfiniBand", bytes_per_tick=25, efficiency=Fraction("0.9"), latency_ticks=2_000)
NVLINK4 = Link("NVLink 4", bytes_per_tick=450, efficiency=Fraction("0.6"), latency_ticks=1_000)
NDR_400G = Link("400 Gb/s RDMA", bytes_per_tick=50, efficiency=Fraction("0.9"), latency_ticks=2_000)

DGX_A100 = Cluster("DGX A100 (80 GB)", A100_80GB, 80 * 2**30, 8, NVLINK3, HDR_INFINIBAND)
DGX_A100_CALCULON = Cluster("DGX A100 (80 GB), Calculon's efficiency curves as published", A100_80GB_CALCULON,
                            80 * 2**30, 8, NVLINK3, HDR_INFINIBAND)
DGX_H100 = Cluster("DGX H100", H100_SXM, 80 * 2**30, 8, NVLINK4, NDR_400G)
GRAND_TETON = Cluster("Grand Teton H100 (96 GB HBM2e, 500 W)", H100_GRAND_TETON, 96 * 2**30, 8, NVLINK4, NDR_400G)

CLUSTERS = {"a100": DGX_A100, "a100-calculon": DGX_A100_CALCULON, "h100": DGX_H100,
            "h100-grand-teton": GRAND_TETON}
