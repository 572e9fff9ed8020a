"""p2 activation sharding: p1's checkpoints split by rows across N ranks, all-gathered just before each recompute.

The rules, each measured whatever collectives or buffers an answer uses:
  - checkpoint bytes: what the forward leaves alive (1/N of the checkpoints, and y);
  - gathered checkpoints: at each collective of the backward, what the rank holds beyond what it held when the
    backward began and the weights' gradients (the learner's code sees `dist` through `CollectiveWatch`, which
    notes it), so a checkpoint kept after its segment, in whatever tensor, is seen;
  - gathered in time: checkpoints' worth of the other ranks' rows gathered against segments backpropagated, read
    off the events whatever call carried them (receives, all-gathers, broadcasts, padded all-reduces), so
    gathering everything up front is seen however it is done; and at least L/k - 1 checkpoints gathered, so a
    backward that gathers nothing fails rather than passes (as the held check does with nothing to measure);
  - compute: p1's budget, so that rebuilding checkpoints from the input instead of gathering them is seen.
`CollectiveWatch` works the same on torch.distributed, since it only wraps the handle.
"""

from __future__ import annotations

from math import ceil

from ...core.compare import safe_diagnosis
from ...core.probe import memory_now
from ...core.result import Budget, Check, fmt
from ...core.rules import BOOKKEEPING_BYTES, compute_check, received
from ...core.spec import Observation
from ..p1_checkpointing.spec import (A, ALLOWANCE, BK, C, F, L, PRODUCTS, W, WORKSPACE, Checkpointing, built_graph,
                                     forward_result, gradients_check, loss_and_backward, output_check, peak_check)

N = 4
GATHERS = ("all_gather_into_tensor", "all_gather")
COMMUNICATION = {"all_gather_into_tensor", "all_gather", "all_reduce", "broadcast", "reduce_scatter_tensor",
                 "reduce_scatter", "scatter", "gather", "reduce", "all_to_all", "all_to_all_single", "send", "recv",
                 "isend", "irecv", "batch_isend_irecv"}
AHEAD = 2  # gathered checkpoints waiting for their segment: the one being recomputed, and a prefetched next one
SUMS = ("all_reduce", "reduce_scatter_tensor", "reduce_scatter")  # gather a checkpoint only from a padded buffer
CHECKPOINT_ROWS = (N - 1) * C // N  # the other ranks' rows of one checkpoint: what gathering it brings a rank


class CollectiveWatch:
    """`dist` as the learner's code sees it: every call goes to the real handle; during the backward, each
    communication call first notes the bytes the rank holds beyond the backward's start and the weights' gradients."""

    def __init__(self, dist, layers):
        self._dist, self._layers = dist, layers
        self.base = None  # the bytes alive when the backward began
        self.held = []

    def __getattr__(self, name):
        attr = getattr(self._dist, name)
        if name not in COMMUNICATION or not callable(attr):
            return attr

        def noted(*args, **kwargs):
            self._note()
            return attr(*args, **kwargs)

        return noted

    def _note(self) -> None:
        if self.base is None:
            return
        grads = {}
        for pair in self._layers:
            for w in pair:
                if w.grad is not None:
                    storage = w.grad.untyped_storage()
                    grads[storage.data_ptr()] = storage.nbytes()
        self.held.append(memory_now() - self.base - sum(grads.values()))


def gathered_ahead(obs: Observation, rank: int, k: int) -> list[tuple[int, int]]:
    """At each communication event of `rank` that brought it other ranks' data, by whatever call (all-gathers, an
    all-reduce of a padded buffer, broadcasts, all-to-alls, receives: rules.received): (checkpoints' worth gathered
    so far, segments backpropagated before it), read off the events. A sum (an all-reduce, a reduce-scatter)
    counts only over whole [B, d] buffers, a checkpoint padded with zeros: the weights' gradients are not
    checkpoints (a sum over any other buffer that carried one would leave the checkpoints ungathered, which fails
    too). A checkpoint's worth is the other ranks' rows
    of it, (N-1)/N·C; scalars (up to 1 KiB in all) are not counted; a segment's backward is k blocks of BK FLOPs."""
    compute = [e for e in obs.events_of(rank, "compute", "backward")]
    out, total = [], 0
    for e in sorted(obs.events_of(rank, "comm"), key=lambda e: e["start"]):
        got = received(e) if e["kind"] not in SUMS or e["nbytes"] % C == 0 else 0
        if not got:
            continue
        total += got
        done = sum(c["flops"] for c in compute if c["end"] <= e["start"]) // (k * BK)
        out.append((ceil(max(0, total - BOOKKEEPING_BYTES) / CHECKPOINT_ROWS), done))
    return out


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
            watched = CollectiveWatch(dist, layers)
            before = memory_now()
            saved, y = forward_result(fwd(watched, x, layers, k), "sharded_forward", target)
            kept = memory_now() - before

            def backward(grad_y):
                watched.base = memory_now()
                return bwd(watched, saved, layers, k, grad_y)

            result = loss_and_backward(y, target, layers, backward)
            return {**result, "kept": kept, "graph": built_graph(saved, y), "held_at_gathers": watched.held}

        return run

    def budgets(self, inputs):
        k = inputs["k"]
        return {
            "checkpoint bytes": Budget("checkpoint bytes", f"(L/k)·C/N + C + {BOOKKEEPING_BYTES:,} bytes per rank "
                                       "(the checkpoint shards and y; C = B·d·8; plus scalars)",
                                       (L // k) * C // N + C + BOOKKEEPING_BYTES, "bytes"),
            "gathered checkpoints": Budget("gathered checkpoints", f"4·C + {BOOKKEEPING_BYTES:,} bytes (the "
                                           "checkpoint being gathered, the gradient handed down, and the previous "
                                           "segment's checkpoint and output on their way out)",
                                           4 * C + BOOKKEEPING_BYTES, "bytes"),
            "gathered in time": Budget("gathered in time", "2 checkpoints gathered and waiting for their segment "
                                       "(the one being recomputed, and at most the next)", AHEAD, "count"),
            "peak memory": Budget("peak memory", "W + G + 2·C + (L/k)·C/N + 2·C + 2·C + k·A + 2·B·h·8 bytes "
                                  "(A = B·(d+2h)·8)",
                                  2 * W + 2 * C + (L // k) * C // N + 2 * C + 2 * C + k * A + WORKSPACE, "bytes"),
            "compute": Budget("compute", "L·(2F + BK) + L·B·d per rank (the serial forward and backward, "
                              f"L·(F + BK), plus one more forward; F = 4·B·d·h + B·h + B·d = {F:,} a block's "
                              f"forward, BK = 8·B·d·h + B·h + B·d = {BK:,} its backward; L·B·d for bookkeeping)",
                              L * (2 * F + BK) + ALLOWANCE, "count"),
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
                            diagnosis="" if ok else safe_diagnosis(self.diagnose_kept, kept[r], obs, r, k)))
        compute = compute_check(obs, budgets["compute"], lambda r, fwd, bwd: self.diagnose_compute(fwd, bwd, k),
                                least=PRODUCTS)
        # why a backward that gathered too little could still be right: the gradients, the checkpoints kept, the compute
        why = (checks[1].passed, checks[2].passed, compute.passed)
        checks += [self.held_check(obs, budgets["gathered checkpoints"], k, why),
                   self.in_time_check(obs, budgets["gathered in time"], k, why),
                   peak_check(obs, budgets["peak memory"], lambda r: self.diagnose_peak(obs, r, k)),
                   compute]
        return checks

    def held_check(self, obs: Observation, budget: Budget, k: int, why: tuple) -> Check:
        held = [res["held_at_gathers"] for res in obs.results]
        most = [max(h, default=0) for h in held]
        silent = [r for r in range(N) if not held[r]]
        over = [r for r in range(N) if most[r] > budget.value]
        if silent:  # no collective to measure at: the rule was never put to the test, so it is not met
            r = silent[0]
            return Check("gathered checkpoints", False, f"rank {r} communicated nothing in its backward, so what it "
                         f"held at its gathers could not be measured (budget {budget.describe()}): its backward "
                         f"gathered none of the L/k = {L // k} checkpoints it recomputes from", measured=0,
                         budget=budget, diagnosis=self.ungathered(*why))
        r = over[0] if over else max(range(N), key=lambda q: most[q])
        ok = not over
        shown = ", ".join(f"{h / C:.2f}·C" for h in held[r])
        message = (f"at its {len(held[r])} collectives in the backward, rank {r} held, beyond what it held when the "
                   f"backward began and the weights' gradients: {shown}; at most {fmt(most[r], 'bytes')}, "
                   f"{'within' if ok else 'over'} the budget {budget.describe()}")
        diagnosis = ""
        if not ok:
            steps = [b - a for a, b in zip(held[r], held[r][1:])]
            if len(steps) >= 2 and all(abs(s - C) <= BOOKKEEPING_BYTES for s in steps[1:]):
                diagnosis = ("what the rank held grew by one checkpoint (C) at every gather: each gathered checkpoint "
                             "was kept after its segment's backward. Let it go (del, or rebind every name that holds "
                             "it, the recomputed input and its graph included) before gathering the next")
        return Check("gathered checkpoints", ok, message, measured=most[r], budget=budget, diagnosis=diagnosis)

    def in_time_check(self, obs: Observation, budget: Budget, k: int, why: tuple) -> Check:
        ahead = [gathered_ahead(obs, r, k) for r in range(N)]
        most = [max((g - d for g, d in a), default=0) for a in ahead]
        total = [a[-1][0] if a else 0 for a in ahead]
        least = L // k - 1  # every checkpoint but the first, which is x: a rank may keep the batch it was handed
        short = [r for r in range(N) if total[r] < least]
        over = [r for r in range(N) if most[r] > budget.value]
        if short and not over:  # "nothing was gathered, so nothing was gathered late" is not a pass
            r = short[0]
            return Check("gathered in time", False,
                         f"rank {r} gathered {total[r]} checkpoints' worth of the other ranks' rows (each "
                         f"(N-1)/N·C = {fmt(CHECKPOINT_ROWS, 'bytes')}, by whatever call) where its backward "
                         f"recomputes L/k = {L // k} segments, each from a checkpoint put together from the N "
                         f"shards (at least {least} of them: the first may be x itself): a checkpoint that was not "
                         f"gathered was not gathered in time either", measured=total[r], budget=budget,
                         diagnosis=self.ungathered(*why))
        r = over[0] if over else max(range(N), key=lambda q: most[q])
        ok = not over
        if ok:
            return Check("gathered in time", True, f"at most {most[r]} gathered checkpoint(s) waited for their "
                         f"segment at once on any rank, within the budget {budget.describe()}; each rank gathered "
                         f"{min(total)} or more checkpoints' worth of the other ranks' rows",
                         measured=most[r], budget=budget)
        gathered, done = next((g, d) for g, d in ahead[r] if g - d == most[r])
        message = (f"rank {r} had gathered {gathered} checkpoints' worth of the other ranks' rows ((N-1)/N·C = "
                   f"{fmt(CHECKPOINT_ROWS, 'bytes')} each, by whatever call) when it had backpropagated through "
                   f"{done} segments: {most[r]} gathered checkpoints waited for their segment at once, over the "
                   f"budget {budget.describe()}")
        diagnosis = ""
        if done == 0 and gathered >= L // k:
            diagnosis = ("every checkpoint was gathered before any segment's backward: you gathered them all up "
                         "front. Gather each one right before recomputing its segment")
        return Check("gathered in time", False, message, measured=most[r], budget=budget, diagnosis=diagnosis)

    @staticmethod
    def ungathered(right: bool, kept_ok: bool, computed: bool) -> str:
        """Where the whole checkpoints came from, for a backward that gathered too little: said only when the
        gradients are right (it did recompute from whole checkpoints), and named only when a check says where."""
        if not right:
            return ""
        if not kept_ok:
            return ("the backward recomputed from the whole checkpoints the forward kept (see checkpoint bytes) "
                    "instead of gathering them: keep only this rank's rows of each checkpoint, and all-gather it "
                    "right before recomputing its segment")
        if not computed:
            return ("the gradients are right, so every segment was recomputed from a whole checkpoint; with too few "
                    "gathered and too much computed (see compute), the checkpoints were rebuilt from x by running "
                    "the blocks before them again. Keep this rank's rows of each checkpoint and all-gather it right "
                    "before recomputing its segment")
        return ("the gradients are right, so every segment was recomputed from a whole checkpoint, yet the other "
                "ranks' rows of it never reached this rank by any message: the whole checkpoints were kept from the "
                "forward where the memory ledger could not see them. Keep only this rank's rows of each, as torch "
                "tensors, and all-gather each right before recomputing its segment")

    @staticmethod
    def diagnose_kept(kept, obs, r, k) -> str:
        if kept > (L // k) * C + C and obs.results[r].get("graph", True):
            return (f"the forward left about {kept / A:.1f} blocks' worth of autograd activations alive: it built "
                    f"the autograd graph. Run it under torch.no_grad()")
        if kept >= (L // k - 1) * C + C:
            if not any(e["kind"] in GATHERS for e in obs.events_of(r, "comm")):
                return (f"every rank kept the full checkpoints ({kept / C:.0f}·C, puzzle 1's answer) and never "
                        f"gathered them: keep only this rank's rows of each, 1/N = 1/{N} of it")
            return (f"the full checkpoints are still alive ({kept / C:.0f}·C) although you gather in backward: "
                    f"your shards are probably views (`c.chunk(N)[rank]`, `c[rows]`), and a view keeps the whole "
                    f"tensor's memory alive. `.clone()` the shard")
        return f"keep only this rank's 1/{N} of each checkpoint, and y"

    @staticmethod
    def diagnose_peak(obs, r, k) -> str:
        res = obs.results[r]
        if res["kept"] > (L // k) * C // N + C + BOOKKEEPING_BYTES:
            return "the peak follows from what the forward kept (see checkpoint bytes)"
        if max(res["held_at_gathers"], default=0) > 4 * C + BOOKKEEPING_BYTES:
            return "the peak follows from the gathered checkpoints kept alive together (see gathered checkpoints)"
        return ("more than one segment's activations were alive at once: recompute one segment at a time, right "
                "before backpropagating through it, and let its graph and output go before the next")


SPEC = ActivationSharding()
