"""The data loader (puzzles/simulator/loader.py) against torch.utils.data.DataLoader: the same batches in the same
order, the same hand-out of batches to workers (prefetch_factor·num_workers when the loop starts, one more per batch
taken, batch j to worker j mod num_workers), the same refusals; and on the clock, who loads and when."""

from __future__ import annotations

import pytest
import torch
import torch.utils.data as tud

from puzzles import sim

HOST = sim.HostProfile(op_ticks=8, sync_ticks=40)
X, Y = torch.arange(40.0, dtype=torch.float64).view(20, 2), torch.arange(20, dtype=torch.float64)


@pytest.mark.parametrize("options", [dict(batch_size=4), dict(batch_size=6), dict(batch_size=6, drop_last=True),
                                     dict(batch_size=4, shuffle=True)], ids=["4", "6", "drop_last", "shuffle"])
@pytest.mark.parametrize("workers", [0, 2])
def test_the_batches_are_torchs(options, workers):
    ours = sim.DataLoader(sim.TensorDataset(X, Y), num_workers=workers,
                          generator=torch.Generator().manual_seed(5) if options.get("shuffle") else None, **options)
    theirs = tud.DataLoader(tud.TensorDataset(X, Y), num_workers=0,
                            generator=torch.Generator().manual_seed(5) if options.get("shuffle") else None, **options)
    assert len(ours) == len(theirs)
    for (a, b), (c, d) in zip(ours, theirs, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)


class _Logged(tud.Sampler):
    """A batch sampler that notes each batch torch's loader draws (in the main process, as it hands a batch to a
    worker), beside the batches the loop takes."""

    def __init__(self, batches, log):
        self.batches, self.log = batches, log

    def __iter__(self):
        for j, b in enumerate(self.batches):
            self.log.append(("dispatch", j))
            yield b

    def __len__(self):
        return len(self.batches)


def _worker_of(samples):
    info = tud.get_worker_info()
    return torch.tensor([info.id if info is not None else -1]), tud.default_collate(samples)


@pytest.mark.parametrize("workers, prefetch", [(2, 2), (2, 1), (1, 3)])
def test_batches_are_handed_to_workers_as_torch_hands_them(workers, prefetch):
    batches = [list(range(i, i + 2)) for i in range(0, 20, 2)]
    log: list = []
    theirs = tud.DataLoader(tud.TensorDataset(X, Y), batch_sampler=_Logged(batches, log), num_workers=workers,
                            prefetch_factor=prefetch, collate_fn=_worker_of, multiprocessing_context="fork")
    workers_of = []
    for i, (worker, _) in enumerate(theirs):
        log.append(("yield", i))
        workers_of.append(int(worker))
    ours = iter(sim.DataLoader(sim.TensorDataset(X, Y), batch_sampler=batches, num_workers=workers,
                               prefetch_factor=prefetch))
    for _ in ours:
        pass
    assert ours.log == log
    assert workers_of == [j % workers for j in range(len(batches))]


def test_the_refusals_are_torchs():
    for kwargs in (dict(num_workers=0, prefetch_factor=2), dict(num_workers=-1), dict(persistent_workers=True)):
        with pytest.raises(ValueError) as ours:
            sim.DataLoader(tud.TensorDataset(X), **kwargs)
        with pytest.raises(ValueError) as theirs:
            tud.DataLoader(tud.TensorDataset(X), **kwargs)
        assert str(ours.value).replace(" ", "") == str(theirs.value).replace(" ", "")


def train(dist, x, y, w, workers):
    loader = sim.DataLoader(sim.TensorDataset(x, y, ticks_per_sample=100), batch_size=4, num_workers=workers,
                            prefetch_factor=2 if workers else None)
    for xb, _ in loader:  # 4 samples: 400 ticks to load a batch; the product takes 68 ticks (65,536 FLOPs)
        xb @ w
    return None


ARGS = (torch.ones(20, 64, dtype=torch.float64), torch.zeros(20, dtype=torch.float64),
        torch.ones(64, 128, dtype=torch.float64))


def test_without_workers_the_host_loads_each_batch_and_the_device_waits():
    result = sim.run(train, 1, args=(*ARGS, 0), host=HOST)
    loads = [e for e in result.events_of(0, "host") if e.kind == "load"]
    products = [e for e in result.events_of(0, "compute") if e.op == "mm"]
    assert [(e.end - e.start, e.label) for e in loads] == [(400, f"batch {i}") for i in range(5)]
    for load, product in zip(loads, products):
        assert product.start == load.end + 8  # loaded, then launched
    assert result.makespan == products[-1].end and result.makespan > 5 * 400


def test_workers_load_in_the_background_and_the_loop_waits_only_for_batches_not_yet_loaded():
    result = sim.run(train, 1, args=(*ARGS, 2), host=HOST)
    loads = sorted(result.events_of(0, "loader"), key=lambda e: int(e.label.split()[1]))
    assert [(e.peers, e.label) for e in loads] == [((j % 2,), f"batch {j}") for j in range(5)]
    assert [(e.start, e.end) for e in loads[:2]] == [(0, 400), (0, 400)]  # both workers start at once
    assert loads[2].start == 400 and loads[4].start == 800  # each worker's batches one after the other
    waits = [e for e in result.events_of(0, "host") if e.kind == "wait for data"]
    assert waits[0].end == 400 and len(waits) == 3  # batches 0, 2, 4: the workers are the bottleneck
    assert result.makespan == 1200 + 8 + 68  # batch 4 loaded, launched, multiplied
    # without workers: the host loads and launches, 408 ticks a batch; each product runs while it loads the next
    assert sim.run(train, 1, args=(*ARGS, 0), host=HOST).makespan == 5 * (400 + 8) + 68


def test_a_batch_is_charged_to_the_rank_when_the_loop_takes_it_and_costs_the_device_nothing():
    def take_one(dist, x, y, w, workers):
        loader = iter(sim.DataLoader(sim.TensorDataset(x, y, ticks_per_sample=100), batch_size=4,
                                     num_workers=workers))
        before = sim.current_ledger().current
        batch = next(loader)
        return sim.current_ledger().current - before, sim.current_ledger().live_by_line(), batch

    for workers in (0, 2):
        result = sim.run(take_one, 1, args=(*ARGS, workers), host=HOST)
        grew, live, (xb, yb) = result.results[0]
        assert grew == xb.numel() * 8 + yb.numel() * 8
        assert any("(a batch from the DataLoader)" in site and "batch = next(loader)" in site and n == grew
                   for site, n, _ in live), live
        assert not result.events_of(0, "compute")  # no stack, no copy on the device: loading is the host's work


def test_without_a_host_the_loader_gives_the_batches_and_takes_no_time():
    result = sim.run(train, 1, args=(*ARGS, 0))
    assert not result.events_of(0, "host") and not result.events_of(0, "loader")
    assert result.makespan == sum(e.ticks for e in result.events_of(0, "compute"))


def read_some(dist, x, y, w, how):
    """Read the dataset's 20 samples one way or another; returns what the dataset counted."""
    dataset = sim.TensorDataset(x, y, ticks_per_sample=100)
    if how == "subset":  # through a wrapper of torch's: the samples it reads are the dataset's
        for xb, _ in sim.DataLoader(tud.Subset(dataset, list(range(20))), batch_size=4):
            xb @ w
    elif how == "directly":  # the rank reads them itself: its host loads them, as num_workers=0 does
        for i in range(0, 20, 4):
            dataset[i:i + 4][0] @ w
    elif how == "tensors":  # dataset.tensors: no sample is read (a puzzle that gives a dataset can tell)
        for i in range(0, 20, 4):
            dataset.tensors[0][i:i + 4] @ w
    return dataset.samples_loaded


@pytest.mark.parametrize("how", ["subset", "directly"])
def test_a_sample_costs_its_load_however_it_is_read(how):
    """A batch costs what the samples its fetch reads cost: through a Subset as directly; a sample the rank reads
    itself costs its host the same (the blind attack on p21 read its data for free these ways)."""
    result = sim.run(read_some, 1, args=(*ARGS, how), host=HOST)
    loads = [e for e in result.events_of(0, "host") if e.kind == "load"]
    assert result.results == [20] and sum(e.end - e.start for e in loads) == 20 * 100
    assert result.makespan >= 20 * 100


def test_reading_the_tensors_reads_no_sample_and_the_load_time_is_the_datas():
    result = sim.run(read_some, 1, args=(*ARGS, "tensors"), host=HOST)
    assert result.results == [0] and not [e for e in result.events_of(0, "host") if e.kind == "load"]
    dataset = sim.TensorDataset(*ARGS[:2], ticks_per_sample=100)
    with pytest.raises(AttributeError, match="ticks_per_sample is the data's"):
        dataset.ticks_per_sample = 0
    assert dataset.ticks_per_sample == 100
