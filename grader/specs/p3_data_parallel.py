"""p3 data parallel: one SGD step, gradients averaged across ranks by all-reduce."""

from __future__ import annotations

import torch

from puzzles.model import forward, init_layers, loss_fn, make_batch
from puzzles.sim import CostModel

from ..core.compare import ratio
from ..core.result import Budget, Check, fmt
from ..core.spec import Observation, PuzzleSpec, check_layers

N, B, D, H, L, LR = 4, 32, 64, 256, 4, 0.1


def sgd_step(layers, x, target, lr):
    """The serial reference: one SGD step on (x, target); returns the new weights and the gradients."""
    layers = [(w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()) for w1, w2 in layers]
    loss_fn(forward(x, layers), target).backward()
    new = [(w1.detach() - lr * w1.grad, w2.detach() - lr * w2.grad) for w1, w2 in layers]
    return new, [(w1.grad, w2.grad) for w1, w2 in layers]


class DataParallel(PuzzleSpec):
    id, name, title = "p3", "data_parallel", "Data parallel"
    entries = ("data_parallel_step",)
    world_size = N
    cost = CostModel()
    hints = ("Average, don't add: the loss is a mean over the rows, so the full-batch gradient is the mean of "
             "the ranks' gradients.",)

    def make_inputs(self, seed):
        x, target = make_batch(B, D, seed)
        return {"layers": init_layers(L, D, H, seed + 1), "x": x, "target": target, "lr": LR}

    def reference(self, inputs):
        new, _ = sgd_step(inputs["layers"], inputs["x"], inputs["target"], inputs["lr"])
        shards = zip(inputs["x"].chunk(N), inputs["target"].chunk(N))
        local = [sgd_step(inputs["layers"], xs, ts, inputs["lr"])[0] for xs, ts in shards]
        return {"layers": new, "local_layers": local}

    def launch(self, inputs):
        shards = list(zip(inputs["x"].chunk(N), inputs["target"].chunk(N)))
        return (inputs["layers"], inputs["lr"]), shards

    def program(self, module):
        step = getattr(module, self.entries[0])  # p7 grades its overlapped step the same way

        def run(dist, layers, lr, x_shard, target_shard):
            step(dist, x_shard, target_shard, layers, lr)
            return {"layers": [(w1.detach(), w2.detach()) for w1, w2 in layers]}

        return run

    def budgets(self, inputs):
        return {"all-reduce volume": Budget("all-reduce volume", "2·L·d·h·8 bytes (every gradient once)",
                                            2 * L * D * H * 8, "bytes")}

    def check(self, obs: Observation, ref, inputs):
        got = [r["layers"] for r in obs.results]
        diagnose = lambda bad: self.diagnose(bad, got, ref, inputs)  # noqa: E731
        return [check_layers("updated weights", got, ref["layers"], "updated weights", diagnose),
                self.check_volume(obs, self.budgets(inputs)["all-reduce volume"])]

    def check_volume(self, obs: Observation, budget: Budget) -> Check:
        """Every rank all-reduced exactly the gradients' bytes (scalars such as a logged loss not counted)."""
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
                    f"(divide by dist.get_world_size(), after wait() for an async all-reduce)")
        if f is not None and abs(f - 1 / N) < 1e-6:
            return f"the update is exactly {N}x too small: the gradients were divided by {N} twice?"
        local = ref["local_layers"][rank][index][k] - w0
        if torch.allclose(delta, local, rtol=1e-8, atol=1e-12):
            return (f"rank {rank} stepped with its own local gradient: the gradients were never all-reduced, or "
                    f"the result was never used (all-reduced a copy? updated before wait()?)")
        return ""


SPEC = DataParallel()
