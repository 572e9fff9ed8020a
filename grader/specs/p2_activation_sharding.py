"""p2 activation sharding: p1's checkpoints split by rows across N ranks, all-gathered just before each recompute.

The learner's code sees `dist` through `GatherWatch`, which forwards every call and notes, at each all-gather,
the bytes of gathered buffers still alive: that is the "gathered checkpoints" check (the buffers are transient).
It works the same on torch.distributed, since it only wraps the handle and holds weak references.
"""

from __future__ import annotations

import weakref

from ..core.probe import memory_now
from ..core.result import Budget, Check, fmt
from ..core.spec import Observation
from .p1_checkpointing import (A, C, L, W, WORKSPACE, Checkpointing, gradients_check, loss_and_backward,
                               output_check, peak_check)

N = 4


class GatherWatch:
    """`dist` as the learner's code sees it: every call goes to the real handle; each all-gather first notes how
    many bytes of earlier all-gather outputs are still alive, plus its own output."""

    def __init__(self, dist):
        self._dist = dist
        self._outputs = []  # (weak reference to the storage, its bytes)
        self.calls = 0
        self.max_alive = 0
        self.max_alive_count = 0

    def __getattr__(self, name):
        return getattr(self._dist, name)

    def _note(self, tensors) -> None:
        self.calls += 1
        self._outputs = [(ref, n) for ref, n in self._outputs if ref() is not None]
        for t in tensors:
            storage = t.untyped_storage()
            if not any(ref() is not None and ref().data_ptr() == storage.data_ptr() for ref, _ in self._outputs):
                self._outputs.append((weakref.ref(storage), storage.nbytes()))
        alive = sum(n for _, n in self._outputs)
        if alive > self.max_alive:
            self.max_alive, self.max_alive_count = alive, len(self._outputs)

    def all_gather_into_tensor(self, output_tensor, input_tensor, *args, **kwargs):
        self._note([output_tensor])
        return self._dist.all_gather_into_tensor(output_tensor, input_tensor, *args, **kwargs)

    def all_gather(self, tensor_list, tensor, *args, **kwargs):
        self._note(tensor_list)
        return self._dist.all_gather(tensor_list, tensor, *args, **kwargs)

    def summary(self) -> dict:
        return {"calls": self.calls, "max_alive": self.max_alive, "max_alive_count": self.max_alive_count}


class ActivationSharding(Checkpointing):
    """p1's inputs, reference and launch (and torch.utils.checkpoint is still taken away), on N ranks."""

    id, name, title = "p2", "activation_sharding", "Activation sharding"
    entries = ("sharded_forward", "sharded_backward")
    world_size = N
    hints = ("Keep `c.chunk(N)[rank].clone()` of each checkpoint; in backward, all_gather_into_tensor it into a "
             "fresh [B, d] buffer right before recomputing its segment, and drop the buffer after.",)

    def program(self, module):
        fwd, bwd = module.sharded_forward, module.sharded_backward

        def run(dist, x, target, layers, k):
            watched = GatherWatch(dist)
            before = memory_now()
            saved, y = fwd(watched, x, layers, k)
            kept = memory_now() - before
            result = loss_and_backward(y, target, layers, lambda grad_y: bwd(watched, saved, layers, k, grad_y))
            return {**result, "kept": kept, "gathers": watched.summary()}

        return run

    def budgets(self, inputs):
        k = inputs["k"]
        return {
            "checkpoint bytes": Budget("checkpoint bytes", "(L/k)·C/N + C bytes per rank (the checkpoint shards "
                                       "and y; C = B·d·8)", (L // k) * C // N + C, "bytes"),
            "gathered checkpoints": Budget("gathered checkpoints", "2·C bytes (the checkpoint being gathered and "
                                           "at most the previous one)", 2 * C, "bytes"),
            "peak memory": Budget("peak memory", "W + G + 2·C + (L/k)·C/N + 2·C + 2·C + k·A + 2·B·h·8 bytes "
                                  "(A = B·(d+2h)·8)",
                                  2 * W + 2 * C + (L // k) * C // N + 2 * C + 2 * C + k * A + WORKSPACE, "bytes"),
        }

    def check(self, obs: Observation, ref, inputs):
        k = inputs["k"]
        budgets = self.budgets(inputs)
        results = obs.results
        checks = [output_check(results, ref), gradients_check(results, ref, k, gathered=True)]

        b = budgets["checkpoint bytes"]
        kept = [res["kept"] for res in results]
        over = [r for r in range(N) if kept[r] > b.value]
        r = over[0] if over else max(range(N), key=lambda q: kept[q])
        ok = not over
        checks.append(Check("checkpoint bytes", ok,
                            f"after sharded_forward rank {r} still held {fmt(kept[r], 'bytes')} more than before "
                            f"it ({kept[r] / C:.2f}·C), {'within' if ok else 'over'} the budget {b.describe()}",
                            measured=kept[r], budget=b,
                            diagnosis="" if ok else self.diagnose_kept(kept[r], results[r]["gathers"], k)))

        b = budgets["gathered checkpoints"]
        alive = [res["gathers"]["max_alive"] for res in results]
        over = [r for r in range(N) if alive[r] > b.value]
        r = over[0] if over else max(range(N), key=lambda q: alive[q])
        gathers = results[r]["gathers"]
        ok = not over
        if gathers["calls"] == 0:
            message = f"rank {r} never all-gathered (so it held no gathered buffer; budget {b.describe()})"
        else:
            message = (f"rank {r} all-gathered {gathers['calls']} times; at most {fmt(alive[r], 'bytes')} of gathered "
                       f"buffers ({gathers['max_alive_count']} of them) were alive at one all-gather, "
                       f"{'within' if ok else 'over'} the budget {b.describe()}")
        checks.append(Check("gathered checkpoints", ok, message, measured=alive[r], budget=b,
                            diagnosis="" if ok else self.diagnose_gathered(alive[r], gathers, k)))

        checks.append(peak_check(obs, budgets["peak memory"], lambda r: self.diagnose_peak(obs, r, k)))
        return checks

    @staticmethod
    def diagnose_kept(kept, gathers, k) -> str:
        if kept > (L // k) * C + C:
            return (f"the forward left about {kept / A:.1f} blocks' worth of autograd activations alive: it built "
                    f"the autograd graph. Run it under torch.no_grad()")
        if kept >= (L // k - 1) * C + C:
            if gathers["calls"] == 0:
                return (f"every rank kept the full checkpoints ({kept / C:.0f}·C, puzzle 1's answer) and never "
                        f"all-gathered: keep only this rank's rows of each, 1/N = 1/{N} of it")
            return (f"the full checkpoints are still alive ({kept / C:.0f}·C) although you all-gather in backward: "
                    f"your shards are probably views (`c.chunk(N)[rank]`, `c[rows]`), and a view keeps the whole "
                    f"tensor's memory alive. `.clone()` the shard")
        return f"keep only this rank's 1/{N} of each checkpoint, and y"

    @staticmethod
    def diagnose_gathered(alive, gathers, k) -> str:
        if alive >= (L // k) * C:
            return (f"{alive / C:.0f} whole checkpoints were alive at once: you gathered them all up front. "
                    f"Gather each one right before recomputing its segment, and let it go after its backward")
        return ("gathered checkpoints pile up: let each go (del, or rebind every name that holds it, including "
                "the recomputed input and its graph) before gathering the next")

    @staticmethod
    def diagnose_peak(obs, r, k) -> str:
        res = obs.results[r]
        if res["kept"] > (L // k) * C // N + C:
            return "the peak follows from what the forward kept (see checkpoint bytes)"
        if res["gathers"]["max_alive"] > 2 * C:
            return "the peak follows from the gathered checkpoints kept alive together (see gathered checkpoints)"
        return ("more than one segment's activations were alive at once: recompute one segment at a time, right "
                "before backpropagating through it, and let its graph and output go before the next")


SPEC = ActivationSharding()
