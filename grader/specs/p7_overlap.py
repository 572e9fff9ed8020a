"""p7 overlap: data parallel whose gradient all-reduces run asynchronously, hidden behind backward.

The check that matters is the makespan on the simulated clock: compute C, plus at most about one block's
all-reduce A sticking out after backward, plus a tolerance T. The cost model makes a block's all-reduce (816
ticks) a bit shorter than a block's backward (1,024 ticks), so a good overlap hides all but the last one, while
synchronous all-reduces after backward add all 8 x 432 ticks of communication.
"""

from __future__ import annotations

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import CostModel

from ..compare import ratio
from ..result import Budget, Check, fmt
from ..spec import Observation, PuzzleSpec, check_layers

N, B, D, H, L, LR = 4, 32, 64, 256, 4, 0.1
ROWS = B // N  # b: rows per rank
COST = CostModel(flops_per_tick=1024, latency_ticks=8, bytes_per_tick=512)
TOLERANCE_PERCENT = 5

# Compute of one step on one rank. Forward: 2 matmuls of 2·b·d·h FLOPs per block. Backward: 4 per block (input
# gradient and weight gradient of each matmul), except block 0, whose input (the batch) needs no gradient: 3.
FORWARD_FLOPS = 4 * ROWS * D * H * L
BACKWARD_FLOPS = (8 * L - 2) * ROWS * D * H
GRADIENT_BYTES = 2 * L * D * H * 8


def compute_ticks() -> int:
    return COST.compute_ticks(FORWARD_FLOPS + BACKWARD_FLOPS)


def block_all_reduce_ticks() -> int:
    return COST.comm_ticks("all_reduce", 2 * D * H * 8, N)


def weight_all_reduce_ticks() -> int:
    return COST.comm_ticks("all_reduce", D * H * 8, N)


def sgd_step(layers, x, target, lr):
    """The serial reference: one SGD step on (x, target); returns the new weights."""
    layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()) for w1, w2 in layers]
    loss_fn(forward(x, layers), target).backward()
    return [(w1.detach() - lr * w1.grad, w2.detach() - lr * w2.grad) for w1, w2 in layers]


class Overlap(PuzzleSpec):
    id, name, title = "p7", "overlap", "Comm/compute overlap"
    entries = ("overlapped_step",)
    world_size = N
    cost = COST
    hints = ("Launch each gradient's all-reduce with async_op=True from inside backward "
             "(w.register_post_accumulate_grad_hook), keep the handles, and wait for them all after backward.",)

    def make_inputs(self, seed):
        x, target = make_batch(B, D, seed)
        return {"layers": init_layers(L, D, H, seed + 1), "x": x, "target": target, "lr": LR}

    def reference(self, inputs):
        new = sgd_step(inputs["layers"], inputs["x"], inputs["target"], inputs["lr"])
        shards = zip(inputs["x"].chunk(N), inputs["target"].chunk(N))
        local = [sgd_step(inputs["layers"], xs, ts, inputs["lr"]) for xs, ts in shards]
        return {"layers": new, "local_layers": local}

    def launch(self, inputs):
        shards = list(zip(inputs["x"].chunk(N), inputs["target"].chunk(N)))
        return (inputs["layers"], inputs["lr"]), shards

    def program(self, module):
        step = module.overlapped_step

        def run(dist, layers, lr, x_shard, target_shard):
            step(dist, x_shard, target_shard, layers, lr)
            return {"layers": [(w1.detach(), w2.detach()) for w1, w2 in layers]}

        return run

    def budgets(self, inputs):
        c, a = compute_ticks(), block_all_reduce_ticks()
        t = c * TOLERANCE_PERCENT // 100
        return {
            "all-reduce volume": Budget("all-reduce volume", "2·L·d·h·8 bytes (every gradient once)",
                                        GRADIENT_BYTES, "bytes"),
            "makespan": Budget("makespan",
                               f"C + A + T = compute {c:,} + one block's all-reduce {a:,} + "
                               f"tolerance {TOLERANCE_PERCENT}%·C {t:,} ticks", c + a + t, "ticks"),
        }

    def check(self, obs: Observation, ref, inputs):
        got = [r["layers"] for r in obs.results]
        diagnose = lambda bad: self.diagnose(bad, got, ref, inputs)  # noqa: E731
        budgets = self.budgets(inputs)
        return [check_layers("updated weights", got, ref["layers"], "updated weights", diagnose),
                self.check_volume(obs, budgets["all-reduce volume"]),
                self.check_makespan(obs, budgets["makespan"])]

    def check_volume(self, obs: Observation, budget: Budget) -> Check:
        volumes = [sum(e["nbytes"] for e in obs.events_of(r, "comm", "all_reduce") if e["nbytes"] > 8)
                   for r in range(obs.world_size)]
        wrong = [(r, v) for r, v in enumerate(volumes) if v != budget.value]
        if not wrong:
            return Check("all-reduce volume", True,
                         f"every rank all-reduced {fmt(volumes[0], 'bytes')}, the gradients' {budget.describe()}",
                         measured=volumes[0], budget=budget)
        r, v = wrong[0]
        hint = ("less than the gradients: some gradient was never all-reduced" if v < budget.value else
                "more than the gradients: a gradient was all-reduced twice (a hook registered twice?), or more "
                "than the gradients was sent")
        return Check("all-reduce volume", False,
                     f"rank {r} all-reduced {fmt(v, 'bytes')}; the gradients are {budget.describe()}: {hint}",
                     measured=v, budget=budget)

    def check_makespan(self, obs: Observation, budget: Budget) -> Check:
        compute = max(obs.busy_ticks(r) for r in range(obs.world_size))
        comm = max(obs.busy_ticks(r, "comm") for r in range(obs.world_size))
        exposed = obs.makespan - compute
        ok = obs.makespan <= budget.value
        message = (f"makespan {fmt(obs.makespan, 'ticks')}, {'within' if ok else 'over'} the budget "
                   f"{budget.describe()}. The compute stream was busy {fmt(compute, 'ticks')} and the "
                   f"communication stream {fmt(comm, 'ticks')}; {fmt(exposed, 'ticks')} of the step were not "
                   f"compute (communication left exposed)")
        diagnosis = "" if ok else self.diagnose_schedule(obs)
        return Check("makespan", ok, message, measured=obs.makespan, budget=budget, diagnosis=diagnosis)

    def diagnose_schedule(self, obs: Observation) -> str:
        """Why communication did not hide behind backward, read off rank 0's two streams."""
        compute = sorted(obs.events_of(0, "compute"), key=lambda e: e["start"])
        backward = [e for e in compute if e["kind"] == "backward"]
        reduces = [e for e in obs.events_of(0, "comm", "all_reduce") if e["nbytes"] > 8]
        if not reduces or not backward:
            return ("no gradient all-reduce ran on rank 0" if not reduces else
                    "rank 0 ran no backward on the compute stream")
        bwd_start, bwd_end = backward[0]["start"], max(e["end"] for e in backward)
        first = min(e["start"] for e in reduces)
        if first >= bwd_end:
            return (f"every gradient all-reduce started after backward had finished (the first at tick {first:,}; "
                    f"backward ended at tick {bwd_end:,}), so nothing overlapped: compute + all communication. "
                    f"Launch each all-reduce from inside backward, as soon as its gradient is ready (a "
                    f"post-accumulate-grad hook), with async_op=True")
        idle = sum(max(0, b["start"] - a["end"]) for a, b in zip(compute, compute[1:])
                   if bwd_start <= b["start"] <= bwd_end)
        if idle >= weight_all_reduce_ticks():
            return (f"rank 0's compute stream sat idle {idle:,} ticks in the middle of backward while all-reduces "
                    f"ran: each all-reduce was waited for right after it was launched (or launched without "
                    f"async_op=True), so backward stopped for every message. Keep the handles and wait for them "
                    f"all after backward")
        tail = max(e["end"] for e in reduces) - bwd_end
        return (f"the all-reduces did start during backward, but {tail:,} ticks of communication were still "
                f"running after backward ended (more than one block's worth): were most gradients sent in one "
                f"bucket at the end, or late?")

    def diagnose(self, bad, got, ref, inputs) -> str:
        """Name the likely mistake from the first mismatching weight's update."""
        rank, index, which = bad[0].meta
        k = 0 if which == "w1" else 1
        w0 = inputs["layers"][index][k].detach()
        delta = got[rank][index][k] - w0
        if delta.abs().max() == 0:
            return ("the weights did not change: update them in place (`w -= lr * w.grad` under torch.no_grad()), "
                    "not by rebinding a name")
        f = ratio(delta, ref["layers"][index][k] - w0)
        if f is not None and abs(f - N) < 1e-6:
            return (f"the update is exactly {N}x too large: the gradients were summed across ranks, not averaged "
                    f"(divide by dist.get_world_size() after wait())")
        if f is not None and abs(f - 1 / N) < 1e-6:
            return f"the update is exactly {N}x too small: the gradients were divided by {N} twice?"
        local = ref["local_layers"][rank][index][k] - w0
        if torch.allclose(delta, local, rtol=1e-8, atol=1e-12):
            return (f"rank {rank} stepped with its own local gradient: the all-reduce result was never used "
                    f"(all-reduced a copy? updated before wait()?)")
        return ""


SPEC = Overlap()
