"""The host (puzzles/simulator/host.py): a rank's host launches its ops ahead of the device, and a sync makes it
wait for the device's queue to empty. Held here: without a host nothing changes; with one, the device waits for
launches only when the host falls behind, every way of reading data on the host is a sync (the methods and the
aten ops that torch.cuda.set_sync_debug_mode flags), and the ops counted as syncs are exactly those torch's fake
tensors cannot run without data."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException,
                                           FakeTensorMode)

from puzzles import sim
from puzzles.simulator import host as host_model
from puzzles.simulator.host import SYNC_OPS, HostProfile

HOST = HostProfile(op_ticks=8, sync_ticks=40)
INPUTS = (torch.ones(8, 64, dtype=torch.float64), torch.eye(64, dtype=torch.float64))


def three_products(dist, x, w, sync_after_first=False):
    """Three products of 68 ticks each (65,536 FLOPs): longer than a launch, so the host stays ahead."""
    x = x @ w
    if sync_after_first:
        x.sum().item()
    x = x @ w
    x = x @ w
    return None


def compute(result, rank=0):
    return [(e.start, e.end) for e in result.events_of(rank, "compute")]


def test_without_a_host_the_device_never_waits():
    plain = sim.run(three_products, 1, args=INPUTS)
    assert plain.makespan == sum(e - s for s, e in compute(plain)) and not plain.events_of(stream="host")
    again = sim.run(three_products, 1, args=INPUTS, host=None)
    assert compute(again) == compute(plain) and again.makespan == plain.makespan


def test_a_host_ahead_of_the_device_delays_only_the_first_kernel():
    plain, hosted = sim.run(three_products, 1, args=INPUTS), sim.run(three_products, 1, args=INPUTS, host=HOST)
    assert compute(hosted) == [(s + 8, e + 8) for s, e in compute(plain)]  # the first launch, then never again
    assert hosted.makespan == plain.makespan + 8 and not hosted.events_of(stream="host")


def test_a_sync_drains_the_queue_and_the_device_waits_for_the_copy_and_the_next_launch():
    result = sim.run(three_products, 1, args=(*INPUTS, True), host=HOST)
    [sync] = result.events_of(0, "host")
    products = [e for e in result.events_of(0, "compute") if "mm" in e.op]
    summed = next(e for e in result.events_of(0, "compute") if e.op == "sum")
    assert sync.kind == "sync" and sync.op == "_local_scalar_dense" and "x.sum().item()" in sync.site
    assert sync.end == summed.end + 40  # waits for the sum, then the round trip
    assert products[1].start == sync.end + 8  # the device idles until the host has launched the next product
    assert products[1].start - summed.end == 48


def _one_sync(expression: str):
    def program(dist):
        x = torch.arange(6, dtype=torch.float64)
        mask = x > 2
        index = torch.tensor([0, 2])
        _ = eval(expression, {"torch": torch, "x": x, "mask": mask, "index": index, "print": lambda *a: str(*a)})
        return None

    return program


@pytest.mark.parametrize("expression, syncs", [
    ("x[0].item()", 1), ("float(x[0])", 1), ("int(x[0])", 1), ("bool(x[0])", 1), ("1 if x[0] else 0", 1),
    ("x.tolist()", 1), ("x.cpu()", 1), ("x.to('cpu')", 1), ("x.to(device=torch.device('cpu'))", 1),
    ("x.numpy()", 1), ("print(x)", 1), ("f'{x[0]:.3f}'", 1), ("repr(x)", 1),
    ("x.nonzero()", 1), ("torch.masked_select(x, mask)", 1), ("x[mask]", 1), ("torch.unique(x)", 1),
    ("torch.equal(x, x)", 1), ("x.repeat_interleave(torch.tensor([1, 1, 1, 1, 1, 1]))", 1),
    ("torch.bincount(index)", 1),
    # no sync: the device can run these without the host knowing anything of the data
    ("x.to(torch.float32)", 0), ("x[index]", 0), ("x.masked_fill(mask, 0.0)", 0), ("torch.where(mask, x, 0.0)", 0),
    ("(x * 2).sum()", 0), ("x.repeat_interleave(2)", 0), ("x[1:3]", 0),
])
def test_every_way_of_reading_data_on_the_host_is_one_sync(expression, syncs):
    result = sim.run(_one_sync(expression), 1, host=HOST)
    assert len(result.events_of(0, "host")) == syncs, [(e.op, e.site) for e in result.events_of(0, "host")]


def test_the_sync_ops_are_those_torch_cannot_run_without_data():
    """Fake tensors have shapes and no data: torch refuses exactly the ops whose result needs the data on the host
    (a number read out, or an output whose shape the data decides). Those are the syncs of a GPU."""
    samples = {"_local_scalar_dense": lambda x, m, i: x[0].item(), "nonzero": lambda x, m, i: x.nonzero(),
               "masked_select": lambda x, m, i: torch.masked_select(x, m),
               "_unique2": lambda x, m, i: torch.unique(x, return_inverse=True),
               "unique_consecutive": lambda x, m, i: torch.unique_consecutive(x),
               "unique_dim": lambda x, m, i: torch.unique(x.view(2, 3), dim=0),
               "equal": lambda x, m, i: torch.equal(x, x), "is_nonzero": lambda x, m, i: x[:1].is_nonzero(),
               "bincount": lambda x, m, i: torch.bincount(i), "index": lambda x, m, i: x[m],
               "repeat_interleave": lambda x, m, i: x.repeat_interleave(i.new_ones(6))}
    names = {op.overloadpacket.__name__ for op in SYNC_OPS} | {"index", "repeat_interleave"}
    assert names - {"_unique", "unique_dim_consecutive"} <= set(samples), names - set(samples)
    for name, sample in samples.items():
        with FakeTensorMode() as mode:
            x, i = mode.from_tensor(torch.arange(6.0)), mode.from_tensor(torch.tensor([0, 2]))
            with pytest.raises((DataDependentOutputException, DynamicOutputShapeException, RuntimeError)):
                sample(x, x > 2, i)
    with FakeTensorMode() as mode:  # and these run without data: not syncs
        x, i = mode.from_tensor(torch.arange(6.0)), mode.from_tensor(torch.tensor([0, 2]))
        x.masked_fill(x > 2, 0.0), x[i], torch.where(x > 2, x, 0.0), (x @ x), x.sum(), x.to(torch.float32)


def test_the_host_issues_communication_too():
    def after_a_sync(dist):
        t = torch.ones(4, dtype=torch.float64)
        t.sum().item()
        dist.all_reduce(t)
        return None

    result = sim.run(after_a_sync, 2, host=HOST)
    [sync] = result.events_of(0, "host")
    [reduce] = result.events_of(0, "comm")
    assert reduce.issued == sync.end + 8


def test_a_host_behind_the_device_starves_it():
    def tiny_ops(dist):
        x = torch.ones(4, dtype=torch.float64)
        for _ in range(10):
            x = x + 1  # 5 ticks on the device, 8 to launch
        return None

    result = sim.run(tiny_ops, 1, host=HOST)
    assert result.makespan == 11 * 8 + 5  # the ones and the ten adds launched one after the other, then the last add


def test_the_methods_are_restored_after_the_run():
    before = {name: torch.Tensor.__dict__.get(name) for name in host_model._METHODS}
    sim.run(three_products, 1, args=(*INPUTS, True), host=HOST)
    assert {name: torch.Tensor.__dict__.get(name) for name in host_model._METHODS} == before
    assert torch.ones(2).tolist() == [1.0, 1.0]
