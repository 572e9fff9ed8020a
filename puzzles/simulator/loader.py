"""The data loader: torch.utils.data.DataLoader's batches, and what loading them costs on the simulated clock.

    loader = sim.DataLoader(dataset, batch_size=8, num_workers=2, prefetch_factor=2)
    for x, y in loader: ...

The batches are torch's: the same samplers (in order, or shuffled with the rank's random numbers), the same
default collate (samples stacked), in the same order whatever the number of workers. What changes with the workers
is *who* loads them, and when, as in torch:

    num_workers=0   the rank's own host loads each batch when the loop asks for it: while it loads, it launches
                    nothing, so the device idles unless the host was far enough ahead (host.py)
    num_workers=W   W worker processes load batches in the background. When the loop starts (iter), the loader
                    hands out prefetch_factor·W batches, batch j to worker j mod W; each time the loop takes a
                    batch, it hands out one more. A worker loads its batches one after the other. The loop waits
                    only for a batch that is not loaded yet.

    host      |iter|.. F0 B0 ..|next|.. F1 B1 ..|next|..      (num_workers=2, prefetch_factor=2)
    worker 0  |== batch 0 ==|== batch 2 ==|      |== batch 4 ==|
    worker 1  |== batch 1 ==|== batch 3 ==|             |== batch 5 ==|

A batch costs what the samples its fetch reads cost to load (read, decode, augment on one CPU core): each sample of
a sim.TensorDataset costs its `ticks_per_sample`, whether the loader reads it directly or through a Subset, a
sampler or a wrapper of the learner's; a sample the rank reads itself costs its host the same (a dataset without
ticks loads for free). The loading shows on the
rank's "host" track (num_workers=0) or its "loader" track, one row per worker (events of stream "loader"); worker
processes take no time to start here (torch's take seconds: persistent_workers=True keeps them across epochs).

A batch is charged to the rank's memory ledger when the loop takes it (it is copied to the device then; torch's
prefetched batches wait in the host's memory). Building it costs the device nothing: loading is the host's work.
On real processes (--backend torch) the same class gives the same batches, and no time.
"""

from __future__ import annotations

import threading

import torch
import torch.utils.data as tud

from . import guards

_TORCH_PREFETCH = ("prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 to "
                   "enable multiprocessing, otherwise set prefetch_factor to None.")


class TensorDataset(tud.TensorDataset):
    """torch's TensorDataset, whose samples each take `ticks_per_sample` of a CPU core to load.

    The cost is the sample's, wherever it is read: a DataLoader's batch costs the samples its fetch read (through
    a Subset or a sampler of any kind alike), and a sample read by the rank itself (`dataset[i]`, `dataset[a:b]`)
    costs its host that time at once, as num_workers=0 does. `samples_loaded` counts the samples read; reading
    `dataset.tensors` directly reads none (and a puzzle that gives a dataset says whether it must all be loaded).
    `ticks_per_sample` is the data's, read-only."""

    def __init__(self, *tensors: torch.Tensor, ticks_per_sample: int = 0):
        super().__init__(*tensors)
        if ticks_per_sample < 0:
            raise ValueError(f"ticks_per_sample must be at least 0, got {ticks_per_sample}")
        self._ticks_per_sample = ticks_per_sample
        self.samples_loaded = 0

    @property
    def ticks_per_sample(self) -> int:
        return self._ticks_per_sample

    @ticks_per_sample.setter
    def ticks_per_sample(self, value) -> None:
        raise AttributeError("ticks_per_sample is the data's (how long one sample takes a CPU core to load): it is "
                             "set when the dataset is made and cannot be changed")

    def __getitem__(self, index):
        sample = super().__getitem__(index)
        first, source = sample[0], self.tensors[0]
        n = first.shape[0] if first.dim() == source.dim() else 1  # rows read (a slice, a list, a mask) or one
        self.samples_loaded += n
        ticks = n * self._ticks_per_sample
        meter = getattr(_measuring, "stack", None)
        if meter:
            meter[-1] += ticks  # a DataLoader's fetch: its batch costs what it read
        elif ticks:
            who = _rank_with_host()
            if who is not None:  # the rank read it itself: its host loads it now (as num_workers=0)
                who.host.work(who.clock, ticks, "load", who.site(), f"{n} sample{'s' * (n != 1)}",
                              "dataset[...] read directly")
        return sample


_measuring = threading.local()  # per rank thread: the ticks of the fetches under way, innermost last


class DataLoader:
    """torch.utils.data.DataLoader's arguments that shape the batches and their timing (see the top of the file)."""

    def __init__(self, dataset, batch_size: int | None = 1, shuffle: bool = False, sampler=None, batch_sampler=None,
                 num_workers: int = 0, collate_fn=None, pin_memory: bool = False, drop_last: bool = False,
                 timeout: float = 0, worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False, pin_memory_device: str = ""):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable "
                             "multiprocessing.")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(_TORCH_PREFETCH)
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset, self.num_workers = dataset, num_workers
        self.prefetch_factor = (2 if prefetch_factor is None else prefetch_factor) if num_workers else None
        if batch_sampler is None:
            if sampler is None:
                sampler = (tud.RandomSampler(dataset, generator=generator) if shuffle else
                           tud.SequentialSampler(dataset))
            batch_sampler = tud.BatchSampler(sampler, batch_size, drop_last)
        self.batch_sampler = batch_sampler
        self.batch_size, self.drop_last = batch_size, drop_last
        self.collate_fn = collate_fn or tud.default_collate
        self.generator = generator

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self):
        return _Batches(self)


class _Batches:
    """One pass over the loader: which batch each worker loads, and when each is ready (see the top of the file).
    `log` is what torch's iterator does, in order: ("dispatch", j) hands batch j to a worker, ("yield", i) gives
    the loop batch i."""

    def __init__(self, loader: DataLoader):
        self.loader, self.indices = loader, iter(loader.batch_sampler)
        _base_seed(loader)
        self.who = _rank_with_host()
        self.log: list[tuple[str, int]] = []
        self.handed = self.taken = 0
        self.ready: dict[int, tuple[object, int]] = {}  # batch number -> (the batch, the tick it is loaded)
        workers = loader.num_workers
        start = self.who.host.now if self.who is not None else 0
        self.free = [start] * workers
        for _ in range(workers * (loader.prefetch_factor or 0)):
            self._hand_out()

    def __iter__(self):
        return self

    def _hand_out(self) -> None:
        try:
            indices = next(self.indices)
        except StopIteration:
            return
        j, w = self.handed, self.handed % self.loader.num_workers
        self.handed += 1
        self.log.append(("dispatch", j))
        batch, ticks = _fetch(self.loader, list(indices))  # the worker builds it in the background
        end = 0
        if self.who is not None:
            begin = max(self.who.host.now, self.free[w])
            end = self.free[w] = begin + ticks
            if end > begin:
                self.who.clock.events.append(_event(self.who.rank, "loader", begin, end, w, j, self.who))
        self.ready[j] = (batch, end)

    def __next__(self):
        who = self.who
        if self.loader.num_workers == 0:
            indices = next(self.indices)  # StopIteration ends the loop
            i = self.handed
            self.handed += 1
            self.log.append(("dispatch", i))
            batch, ticks = _fetch(self.loader, list(indices))
            if who is not None:
                who.host.work(who.clock, ticks, "load", who.site(), f"batch {i}", "DataLoader (num_workers=0)")
        else:
            i = self.taken
            if i not in self.ready:
                raise StopIteration
            batch, end = self.ready.pop(i)
            if who is not None:
                who.host.wait_for(who.clock, end, "wait for data", who.site(), f"batch {i}",
                                  f"DataLoader: batch {i} from worker {i % self.loader.num_workers}")
        self.taken = i + 1
        _adopt(batch)
        if self.loader.num_workers:
            self._hand_out()  # as torch's iterator: one more batch handed out before the loop gets this one
        self.log.append(("yield", i))
        return batch


def _base_seed(loader: DataLoader) -> None:
    """torch's iterator draws a seed for its workers before the sampler draws its order: one random number of the
    loader's generator (or the rank's), so that a shuffled order is torch's."""
    who = guards.caller()
    if who is None:
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        return
    quiet, _ = _off_the_books(who)
    with quiet:
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)


def _event(rank: int, stream: str, start: int, end: int, worker: int, batch: int, who):
    from .clock import Event

    return Event(rank, stream, "load", start, end, label=f"batch {batch}", peers=(worker,),
                 op=f"worker {worker} loads batch {batch}", site=who.site())


def _rank_with_host():
    """The calling rank when it is a simulated rank with a host (timing applies), else None."""
    who = guards.caller()
    return who if who is not None and getattr(who, "host", None) is not None else None


def _fetch(loader: DataLoader, indices: list):
    """(the batch, the ticks its samples took to load): built off the device's books (loading is the host's work,
    or a worker's), what it read measured by the samples themselves (TensorDataset.__getitem__)."""
    stack = _measuring.__dict__.setdefault("stack", [])
    stack.append(0)
    try:
        who = guards.caller()
        if who is None:
            batch = loader.collate_fn([loader.dataset[i] for i in indices])
        else:
            quiet, _ = _off_the_books(who)
            with quiet:
                batch = loader.collate_fn([loader.dataset[i] for i in indices])
    finally:
        ticks = stack.pop()
    return batch, ticks


def _adopt(batch) -> None:
    """The batch is the rank's from the moment the loop takes it (copied to the device then)."""
    who = guards.caller()
    if who is None:
        return
    _, storage = _off_the_books(who)
    site = f"{who.site()}  (a batch from the DataLoader)"
    for t in _tensors(batch):
        storage.adopt(t.untyped_storage(), who.rank, site)


def _off_the_books(who):
    """(a context in which the rank's ops are not its own, the storage tracker that charges its memory): a real
    process's tracker (grader/backends/real/tracker.py) has both; a simulated rank's world holds them."""
    if hasattr(who, "untracked_ops"):
        return who.untracked_ops(), who.storage
    from .world import _active

    world = _active.world
    return world.untracked(who), world.storage


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


