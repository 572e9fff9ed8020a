"""The simulator and the real backend, side by side: does the simulator mean the same thing as
torch.distributed? `compare(sim_obs, real_obs)` lists every difference in values, memory, communication and
FLOPs, in words."""


from __future__ import annotations

import math
from dataclasses import dataclass

import torch



from .tracker import PLACED_SITE

# --------------------------------------------------------------------------------------------------------------
# The simulator and the real backend, side by side: does the simulator mean the same thing?


def _walk(a, b, where: str, out: list, rel_tol: float) -> float:
    """Compare two returned values; append differences to `out`; return the largest relative tensor difference."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape \
                or a.dtype != b.dtype:
            out.append(f"{where}: {_kind(a)} on the simulator, {_kind(b)} on the real backend")
            return float("inf")
        if a.numel() == 0:
            return 0.0
        a64, b64 = a.detach().double(), b.detach().double()
        same = (a64 == b64) | (a64.isnan() & b64.isnan())  # a NaN or an inf where the other has the same
        if not bool(((a64.isnan() | a64.isinf()) == (b64.isnan() | b64.isinf())).all()):
            out.append(f"{where}: non-finite entries in other places (simulator {int((~a64.isfinite()).sum())}, "
                       f"real backend {int((~b64.isfinite()).sum())})")
            return float("inf")
        scale = max(1.0, a64.where(a64.isfinite(), 0.0).abs().max().item())
        diff = (a64.where(~same, 0.0) - b64.where(~same, 0.0)).abs().max().item() / scale
        if diff > rel_tol:
            out.append(f"{where}: differs by {diff:.3g} (relative)")
        return diff
    if isinstance(a, dict) and isinstance(b, dict):
        worst = 0.0
        for k in sorted(set(a) | set(b), key=str):
            worst = max(worst, _walk(a.get(k), b.get(k), f"{where}[{k!r}]", out, rel_tol))
        return worst
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        worst = 0.0
        for i, (x, y) in enumerate(zip(a, b)):
            worst = max(worst, _walk(x, y, f"{where}[{i}]", out, rel_tol))
        return worst
    if a != b and not (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        out.append(f"{where}: {a!r} on the simulator, {b!r} on the real backend")
    return 0.0


def _kind(x) -> str:
    return f"tensor {list(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__


def _peak_sites(ledger: dict) -> list[tuple]:
    placed = ("input placed on the rank by sim.run", PLACED_SITE)
    return sorted(("input placed on the rank" if e["site"] in placed else e["site"], e["bytes"], e["count"])
                  for e in ledger["peak_by_line"])


def _comm_signature(obs, rank: int) -> list[tuple]:
    return sorted((e["kind"], e["nbytes"], e["wire_bytes"], e["phase"], tuple(e["peers"]))
                  for e in obs.events_of(rank, "comm"))


@dataclass
class Comparison:
    """What differs between a simulator run and a real run of the same answer on the same seed."""

    max_relative_difference: float  # over every tensor every rank returned
    differences: list[str]  # each in words; empty when the two agree on everything compared

    @property
    def agree(self) -> bool:
        return not self.differences


def compare(sim_obs, real_obs, rel_tol: float = 1e-10) -> Comparison:
    """Values and gradients (every tensor returned, to `rel_tol`), plain numbers returned (such as bytes read
    with probe.memory_now()), peak memory per rank and what was alive at the peak (by source line), the bytes
    alive after every allocation and free (the ledger's timeline, without its times), the communication each rank issued (kind, bytes, wire bytes, phase, peers) and
    its compute (FLOPs in ticks). Not compared: anything timed (makespan, event times), which only the simulator
    has."""
    out: list[str] = []
    if sim_obs.world_size != real_obs.world_size:
        return Comparison(float("inf"), [f"{sim_obs.world_size} ranks on the simulator, {real_obs.world_size} real"])
    worst = 0.0
    for r in range(sim_obs.world_size):
        worst = max(worst, _walk(sim_obs.results[r], real_obs.results[r], f"rank {r}: returned", out, rel_tol))
        if sim_obs.peak_bytes[r] != real_obs.peak_bytes[r]:
            out.append(f"rank {r}: peak memory {sim_obs.peak_bytes[r]:,} bytes on the simulator, "
                       f"{real_obs.peak_bytes[r]:,} on the real backend")
        a = [b for _, b in sim_obs.ledgers[r]["timeline"]]
        b = [b for _, b in real_obs.ledgers[r]["timeline"]]
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append(f"rank {r}: the ledgers part at allocation/free #{first} of {len(a)} (simulator) / {len(b)} "
                       f"(real)")
        pa, pb = _peak_sites(sim_obs.ledgers[r]), _peak_sites(real_obs.ledgers[r])
        if pa != pb:
            only = sorted(set(pb) - set(pa))[:2], sorted(set(pa) - set(pb))[:2]
            out.append(f"rank {r}: what was alive at the peak differs (only real: {only[0]}; only simulated: "
                       f"{only[1]})")
        sa, sb = _comm_signature(sim_obs, r), _comm_signature(real_obs, r)
        if sa != sb:
            extra = [x for x in sb if x not in sa][:2]
            lacking = [x for x in sa if x not in sb][:2]
            out.append(f"rank {r}: communication differs ({len(sa)} ops on the simulator, {len(sb)} real; "
                       f"only real: {extra}; only simulated: {lacking})")
        ca, cb = sim_obs.busy_ticks(r), real_obs.busy_ticks(r)
        if ca != cb:
            out.append(f"rank {r}: compute {ca:,} ticks of FLOPs on the simulator, {cb:,} on the real backend")
    return Comparison(worst, out)
