"""Tensors stay inside torch (puzzles/simulator/allowed.py, guards.py): while a run is on, a rank's own code gets no
address (data_ptr() is an opaque number there), may not reach ctypes by any path, pickle a tensor or a storage by
any path (torch.save into a BytesIO included), or take more than a small running total of numbers out of torch
(tolist, numpy, DLPack, item, each counted into one total per rank). torch-made tensors (get_rng_state) are the rank's own."""

import ctypes
import io
import pickle

import pytest
import torch
import torch.utils.dlpack
from sim_helpers import site_in

from puzzles import sim
from puzzles.simulator.guards import ITEMS, SMALL

F64 = torch.float64


def chunked_tolist():
    t = torch.ones(2 * ITEMS, dtype=F64)
    kept = []
    for i in range(0, t.numel(), SMALL):
        kept += t[i:i + SMALL].tolist()
    return len(kept)


def chunked_numpy():
    t = torch.ones(2 * ITEMS, dtype=F64)
    return [t[i:i + SMALL].numpy().copy() for i in range(0, t.numel(), SMALL)]


def chunked_dlpack():
    t = torch.ones(2 * ITEMS, dtype=F64)
    return [torch.utils.dlpack.to_dlpack(t[i:i + SMALL].clone()) for i in range(0, t.numel(), SMALL)]


WAYS_OUT = {
    "torch.ctypes": (lambda: torch.ctypes.string_at(id(0), 8), "used ctypes"),
    "ctypes by a built name": (lambda: getattr(torch, "ctyp" + "es").memmove(
        ctypes.create_string_buffer(8), b"12345678", 8), "used ctypes"),
    "a storage pickled": (lambda: pickle.dumps(torch.ones(1000, dtype=F64).untyped_storage()), "pickled bytes"),
    "a TypedStorage pickled": (lambda: pickle.dumps(torch.ones(1000, dtype=F64).storage()), "pickled bytes"),
    "torch.save of a storage into a BytesIO": (lambda: torch.save(torch.ones(1000, dtype=F64).untyped_storage(),
                                                                  io.BytesIO()), "without a checkpoint disk"),
    "tolist in small chunks": (chunked_tolist, "in all"),
    "numpy in small chunks": (chunked_numpy, "in all"),
    "dlpack in small chunks": (chunked_dlpack, "in all"),
    "to_dlpack at once": (lambda: torch.utils.dlpack.to_dlpack(torch.ones(1000, dtype=F64)), "DLPack"),
}


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("way", list(WAYS_OUT))
def test_every_way_out_of_torch_is_refused_with_the_line(way):
    out, said = WAYS_OUT[way]

    def fn(dist):
        out()  # leaves-torch
        dist.barrier()

    with pytest.raises(sim.HiddenMemoryError) as info:
        sim.run(fn, 2)
    text = str(info.value)
    assert said in text and "test_allowed_leaving_torch.py:" in text, text


def test_small_conversions_within_the_running_total_are_fine():
    def fn(dist):
        counts = torch.tensor([3, 1, 4, 1])
        losses = [torch.ones(1, dtype=F64).sum().item() for _ in range(100)]
        return counts.tolist(), sum(losses), torch.ones(SMALL).numpy().sum()

    assert sim.run(fn, 2).results[0] == ([3, 1, 4, 1], 100.0, SMALL)


def test_a_state_torch_makes_outside_an_op_is_the_rank_s_own():
    """torch.get_rng_state() makes its tensor outside any op the mode sees: it is the rank's own memory (once an
    IsolationError, "a tensor that lives on no rank")."""
    def fn(dist):
        state = torch.get_rng_state().clone()  # rng-state
        return state.numel()

    assert sim.run(fn, 2).results == [torch.get_rng_state().numel()] * 2


def test_a_generators_state_and_a_checkpoint_read_back_are_the_rank_s_own():
    """The other tensors torch makes without an op the mode sees, each used the way p18's learner does: a
    generator's state saved (torch.Generator's get_state() is a C method, read once as a tensor of no rank), and a
    checkpoint written to the rank's disk and read back with torch.load. isinstance still takes every generator."""
    def fn(dist, disk):
        g = torch.Generator().manual_seed(7 + dist.get_rank())
        saved = g.get_state().clone()
        first = torch.rand(3, generator=g)
        g.set_state(saved)
        again = torch.rand(3, generator=g)
        fs = disk.mount(dist)
        with fs.open(f"rank{dist.get_rank()}.pt", "wb") as f:
            torch.save({"state": saved, "w": first * 2}, f)
        with fs.open(f"rank{dist.get_rank()}.pt", "rb") as f:
            loaded = torch.load(f)
        kinds = [isinstance(x, torch.Generator) for x in (g, torch.default_generator, torch.Generator())]
        return (torch.equal(first, again), torch.equal(loaded["state"].clone(), saved),
                torch.equal(loaded["w"] + 0, first * 2), kinds)

    assert sim.run(fn, 2, args=(sim.Disk(),)).results == [(True, True, True, [True, True, True])] * 2
    assert torch.Generator is torch._C.Generator  # torch's own class again once the run is over


def test_data_ptr_in_a_rank_is_an_opaque_number_that_still_tells_storages_apart():
    """Honest code compares data_ptr()s (is this the buffer I saved?): that still works; the number is no address."""
    def fn(dist):
        a, b = torch.ones(64, dtype=F64), torch.ones(64, dtype=F64)
        return (a.data_ptr(), a[1:].data_ptr(), a.untyped_storage().data_ptr(), b.data_ptr(),
                a.untyped_storage().data_ptr.__wrapped__(a.untyped_storage()))

    pa, pa1, sa, pb, real = sim.run(fn, 1).results[0]
    assert pa == sa and pa1 == pa + 8 and pb != pa and real != pa


def test_torch_s_own_code_may_still_take_addresses():
    """The address rule binds a rank's own code: torch's (a storage compared, a tensor printed) is let through."""
    def fn(dist):
        a = torch.ones(4, dtype=F64)
        return a.is_set_to(a), str(a[:2])

    assert sim.run(fn, 1).results[0][0] is True
